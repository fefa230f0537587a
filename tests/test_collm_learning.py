"""Learning test of CoLLM-CC on a tiny random model: a 2-turn cooperative game with a sparse final reward.

Two agents answer ``A`` or ``B`` (one token; the other tokens are suppressed) at each of two turns. The reward is 0
after the first turn and ``(number of A among the four answers) / 4`` after the second, so the first turn's answers
are credited only through the critic's value of the second turn's history (TD(0), gamma = 1). At turn 2 both agents
observe the first turn's joint answer.

Every value the test checks against is computed exactly from the policies' probabilities:
``V(h_1 | a_0) = (#A in a_0 + p_1(a_0) + p_2(a_0)) / 4`` and ``V(h_0) = E[V(h_1)]``, with ``p_i(a_0)`` agent i's
P(A | A or B) after its turn-2 prompt.
"""

import itertools

from datasets import Dataset

from tests.tiny import prob_first_choice, save_tiny
from trl_multiagent.environments.base import Environment, StepResult
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import CoLLMConfig, CoLLMTrainer

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 .,:?!AB")
AGENTS = ("agent1", "agent2")


class SparseFinalGame(Environment):
    """Two turns of A/B answers; the team reward, the share of A answers, comes only at the end."""

    agents = AGENTS
    max_turns = 2
    reward_max = 1.0

    @staticmethod
    def prompt(seen: str) -> str:
        return f"pick a or b. so far: {seen}"

    def reset(self, task):
        self.answers = []
        return {a: self.prompt("-") for a in self.agents}

    def step(self, joint_action):
        self.answers.append("".join(joint_action[a].strip()[:1] or "?" for a in self.agents))
        if len(self.answers) < 2:
            return StepResult(0.0, {a: self.prompt(self.answers[0]) for a in self.agents}, False)
        return StepResult("".join(self.answers).count("A") / 4, None, True)


def _model(path) -> str:
    """A tiny random Llama whose outputs depend on the context (``initializer_range`` 0.1)."""
    return save_tiny(path, CHARS, seed=0, max_positions=512, initializer_range=0.1)


def _prob_a(trainer, agent, prompt) -> float:
    return prob_first_choice(trainer.pool, agent, prompt)


def _exact(trainer):
    """P(A) of both agents before each possible turn-2 observation, the exact values of h_0 and of each h_1, and the
    expected return of the current policies."""
    p0 = {a: _prob_a(trainer, a, SparseFinalGame.prompt("-")) for a in AGENTS}
    v1 = {}
    for joint in ("".join(x) for x in itertools.product("AB", repeat=2)):
        p1 = [_prob_a(trainer, a, SparseFinalGame.prompt(joint)) for a in AGENTS]
        v1[joint] = (joint.count("A") + sum(p1)) / 4
    prob = {j: (p0["agent1"] if j[0] == "A" else 1 - p0["agent1"]) * (p0["agent2"] if j[1] == "A" else 1 - p0["agent2"])
            for j in v1}
    v0 = sum(prob[j] * v1[j] for j in v1)
    return v0, v1


def _critic_error(trainer, buffer, v0, v1) -> float:
    """Mean |V_critic(h) - V_exact(h)| over the transitions of an on-policy buffer."""
    values = trainer._values("critic", [trainer.critic_parts(buffer, tr.index, "critic") for tr in buffer.transitions],
                             grad=False).tolist()
    errors = []
    for tr, v in zip(buffer.transitions, values):
        if tr.turn == 0:
            errors.append(abs(v - v0))
        else:
            joint = buffer.transitions[tr.previous].actions
            errors.append(abs(v - v1["".join(joint[a].strip()[:1] for a in AGENTS)]))
    return sum(errors) / len(errors)


def test_cc_critic_converges_to_true_values_and_policies_improve(tmp_path):
    model = _model(tmp_path / "model")
    keep = {3 + CHARS.index("A"), 3 + CHARS.index("B")}
    args = CoLLMConfig(
        output_dir=str(tmp_path / "out"), critic="centralized", num_turns=2, episodes_per_step=8, num_iterations=2,
        num_minibatches=2, max_steps=80, learning_rate=0.05, critic_learning_rate=0.02, critic_lora_r=8,
        max_completion_length=1, generation_kwargs={"suppress_tokens": [i for i in range(3 + len(CHARS)) if i not in keep]},
        lr_scheduler_type="constant", per_device_train_batch_size=16, report_to=[], save_strategy="no",
        disable_tqdm=True, logging_steps=8, seed=0)
    agents = [AgentSpec(a, model=model, lora_r=4, lora_alpha=8) for a in AGENTS]
    trainer = CoLLMTrainer(agents, SparseFinalGame, args, Dataset.from_dict({"task_id": list(range(1024))}))
    probe = [{"task_id": k} for k in range(64)]

    v0_before, v1_before = _exact(trainer)
    error_before = _critic_error(trainer, trainer.sampler.rollout(trainer.pool, SparseFinalGame, probe,
                                                                  trainer.generation_config), v0_before, v1_before)
    trainer.train()
    v0_after, v1_after = _exact(trainer)
    error_after = _critic_error(trainer, trainer.sampler.rollout(trainer.pool, SparseFinalGame, probe,
                                                                 trainer.generation_config), v0_after, v1_after)

    # the policies improve: the expected return of the team (exactly, from its probabilities) rises clearly
    assert 0.35 < v0_before < 0.65, v0_before
    assert v0_after > v0_before + 0.25, (v0_before, v0_after)
    # including the first turn, whose answers only the critic's V(h_1) credits (the reward comes at the end)
    p_first = [_prob_a(trainer, a, SparseFinalGame.prompt("-")) for a in AGENTS]
    assert min(p_first) > 0.75, p_first
    # the critic's values converge towards the true values of the histories the team visits
    assert error_before > 0.3, error_before  # a zero-initialised head starts at V = 0
    assert error_after < 0.15 and error_after < error_before / 3, (error_before, error_after)
