"""MAPoRLTrainer (MAPoRL) on a tiny model: a training step, GAE targets, value-head gradients, the clipped value
loss (a term of the base's update loop), per-turn heads, PPO epochs reusing one rollout, validation and the debate
recipes."""

import json
import random
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from tests.numerics import assert_same_computation
from tests.recipe_runs import build_trainer
from tests.tiny import model_terms
from trl_multiagent.environments import CollaborationGameEnv
from trl_multiagent.rollout import Experience
from trl_multiagent.rollout.debate import DebateSample
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAPoRLConfig, MAPoRLTrainer
from trl_multiagent.trainers.base import MultiAgentTrainer
from trl_multiagent.trainers.maporl import minibatch_schedule, token_credit

AGENTS = ("agent1", "agent2")
NO_PENALTIES = dict(penalize_no_boxed=False, penalize_no_eos=False, min_response_tokens=0, penalize_repetition=False,
                    penalize_post_boxed=False)


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), num_turns=2, episodes_per_step=4, max_completion_length=2,
                per_device_train_batch_size=4, learning_rate=1e-3, critic_learning_rate=2e-3, critic_lora_r=4,
                num_iterations=1, max_steps=1, reward_mode="cumulative", gamma=1.0, report_to=[], save_strategy="no",
                disable_tqdm=True, logging_steps=1, lr_scheduler_type="constant",
                seed=0, **NO_PENALTIES)
    base.update(kw)
    return MAPoRLConfig(**base)


def _trainer(model, tmp_path, shared_policy=False, **kw):
    policy = {"policy": "team"} if shared_policy else {}
    agents = [AgentSpec(a, model=model, lora_r=4, lora_alpha=8, **policy) for a in AGENTS]
    return MAPoRLTrainer(agents, CollaborationGameEnv, _args(tmp_path, **kw),
                            Dataset.from_dict({"task_id": list(range(16))}))


def _tasks(n=4):
    return [{"task_id": k} for k in range(n)]


def _zero_grads(trainer):
    for p in trainer.pool.parameters():
        p.grad = None


def test_rollout_gives_gae_targets_of_the_final_reward(tiny_text_model, tmp_path):
    # kl_coef = 0, gamma = lambda = 1, zero-initialised value heads: every token's return is the answer's reward and
    # its advantage is that reward minus the (zero) value of the state before it
    trainer = _trainer(tiny_text_model, tmp_path, kl_coef=0.0, gae_gamma=1.0, gae_lambda=1.0,
                       whiten_advantages=False)
    assert sorted(trainer.pool.critics) == ["agent1_value", "agent2_value"]
    experience = trainer.rollout(_tasks())
    assert len(experience.samples) == 4 * 2 * 2  # 4 games x 2 turns x 2 agents
    for s in experience.samples:
        n = len(s.generation.completion_ids)
        assert len(s.old_values) == len(s.old_logps) == len(s.token_advantages) == n
        assert s.old_values == [0.0] * n
        assert s.token_returns == pytest.approx([s.reward] * n)
        assert s.token_advantages == pytest.approx([s.reward] * n)
    # the cumulative reward of the game (gamma = 1, App. F Eq. 1 over D_1 = 1 + 1 = 2): turn 1 earns the mean of its
    # score and the turn-2 score
    by_key = {(s.episode, s.agent, s.turn): s for s in experience.samples}
    for (episode, agent, turn), s in by_key.items():
        if turn == 0:
            assert s.reward == pytest.approx((s.score + by_key[(episode, agent, 1)].score) / 2)


@pytest.mark.parametrize("shared_policy", [False, True])  # shared: a micro-batch holds both agents' answers
def test_value_loss_trains_only_the_critics_and_is_the_clipped_loss(tiny_text_model, tmp_path, shared_policy):
    trainer = _trainer(tiny_text_model, tmp_path, shared_policy, cliprange_value=0.05, vf_coef=0.5)
    experience = trainer.rollout(_tasks())
    with torch.no_grad():  # move the values away from the rollout's (zero) values, past the clip
        for head in trainer.pool.value_heads.values():
            head.linear.weight.normal_(0, 0.5)
            head.linear.bias.fill_(0.3)
    _zero_grads(trainer)
    total = torch.zeros(())
    for policy in trainer.pool.policies:  # the term the base's update loop adds to each of a policy's micro-batches
        rows = experience.samples_of(policy)
        for start in range(0, len(rows), trainer.args.per_device_train_batch_size):
            chunk = rows[start:start + trainer.args.per_device_train_batch_size]
            term = trainer.auxiliary_loss(trainer.pool, policy, chunk, trainer.collate(policy, chunk), experience)
            term.backward()
            total = total + term.detach()

    critic_params = {id(p) for c in trainer.pool.critics for p in trainer.pool.critic_parameters(c)}
    for critic in trainer.pool.critics:
        lora_b = [p for n, p in trainer.pool.named_parameters() if f".lora_B.{critic}." in n]
        assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.pool.value_heads[critic].parameters())
    others = [p for p in trainer.pool.parameters() if id(p) not in critic_params]
    assert others and all(p.grad is None for p in others)  # no policy adapter, no base weight

    # the same loss computed here from the critics' values, token by token: 0.5 * max((V - R)^2, (V_clip - R)^2)
    expected = 0.0
    for agent in AGENTS:
        rows = [s for s in experience.samples if s.agent == agent]
        terms = []
        for s in rows:
            batch = trainer.collate(trainer.pool.policy_of(agent), [s])
            with torch.no_grad():
                values = trainer._completion_values(agent, batch, [s])[0].tolist()
            for v, old, ret in zip(values, s.old_values, s.token_returns):
                clipped = old + max(-0.05, min(0.05, v - old))
                terms.append(0.5 * max((v - ret) ** 2, (clipped - ret) ** 2))
        expected += 0.5 * sum(terms) / len(terms)
    # the update's batches and one pass per sample sum in another order (tests/numerics.py)
    tokens = sum(len(s.generation.prompt_ids) + len(s.generation.completion_ids) for s in experience.samples)
    assert_same_computation(total.detach(), torch.tensor(expected), terms=model_terms(tokens), what="value loss")
    clipfracs = trainer._metrics["train"]["value_clipfrac"]  # one per micro-batch; the log reports their mean
    assert sum(clipfracs) / len(clipfracs) > 0  # the clip was active


def test_per_turn_value_heads_read_the_head_of_each_turn(tiny_text_model, tmp_path):
    trainer = _trainer(tiny_text_model, tmp_path, value_head_per_turn=True, whiten_advantages=False)
    assert all(trainer.pool.critics[c].spec.num_heads == 2 for c in trainer.pool.critics)
    with torch.no_grad():
        for head in trainer.pool.value_heads.values():
            head.linear.weight.zero_()
            head.linear.bias.copy_(torch.tensor([1.0, 2.0]))
    experience = trainer.rollout(_tasks(2))
    for s in experience.samples:
        assert s.old_values == pytest.approx([float(s.turn + 1)] * len(s.old_values))


def test_ppo_epochs_reuse_one_rollout_and_step_policies_and_critics(tiny_text_model, tmp_path):
    # influence-aware rewards: every agent's turn-1 reward holds the team's turn-2 scores (Def. 1), so both critics
    # get a signal whichever agent happens to score in this one rollout
    trainer = _trainer(tiny_text_model, tmp_path, num_iterations=3, num_minibatches=1, max_steps=3,
                       reward_mode="influence")
    rollouts = []
    original = trainer.rollout
    trainer.rollout = lambda tasks: rollouts.append(len(tasks)) or original(tasks)
    before = {c: [p.detach().clone() for p in trainer.pool.critic_parameters(c)] for c in trainer.pool.critics}
    trainer.train()
    assert trainer.state.global_step == 3 and rollouts == [4]  # three PPO epochs on one rollout of 4 games
    optimizer = trainer.optimizer
    groups = {g.get("critic") or g.get("policy"): g for g in optimizer.param_groups}
    assert groups["agent1_value"]["lr"] == 2e-3 and groups["agent1"]["lr"] == 1e-3
    for name in (*AGENTS, "agent1_value", "agent2_value"):
        first = groups[name]["params"][0]
        assert int(optimizer.state[first]["step"]) == 3
    for critic, old in before.items():
        assert any(not torch.equal(a, b) for a, b in zip(old, trainer.pool.critic_parameters(critic)))
    assert all(s.old_logps is not None for s in trainer._buffered_inputs.samples)
    logged = [h for h in trainer.state.log_history if "value_loss" in h]
    assert len(logged) == 3 and all(h["value_loss"] >= 0 for h in logged)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["algorithm"] == "MAPoRL"
    assert (tmp_path / "adapters" / "agent1_value" / "value_head.safetensors").is_file()


def test_minibatch_schedule_is_the_authors_eight_by_four(tmp_path):
    # issue 61: the authors cut every PPO epoch of a 32-question rollout into 8 minibatches of 4 (a fresh shuffle per
    # epoch), 4 epochs: 8 x 4 = 32 optimizer steps per rollout
    schedule = minibatch_schedule(list(range(32)), 8, 4, random.Random(0))
    assert len(schedule) == 4 and [len(epoch) for epoch in schedule] == [8] * 4
    for epoch in schedule:
        assert [len(part) for part in epoch] == [4] * 8 and sorted(sum(epoch, [])) == list(range(32))
    assert schedule[0] != schedule[1]  # reshuffled every epoch
    # sizes differ by at most one: 10 debates in 4 minibatches -> 3, 3, 2, 2
    assert [len(part) for part in minibatch_schedule(list(range(10)), 4, 1, random.Random(0))[0]] == [3, 3, 2, 2]
    # the config: 8 minibatches by default, one per debate when a rollout has fewer than 8, never more than debates
    assert _args(tmp_path, episodes_per_step=32).num_minibatches == 8
    assert _args(tmp_path, episodes_per_step=4, num_generations=4).num_minibatches == 8
    assert _args(tmp_path).num_minibatches == 4  # 4 debates
    assert MAPoRLConfig(output_dir=str(tmp_path)).num_iterations == 4  # the paper's four epochs
    with pytest.raises(ValueError, match="num_minibatches must be between 1 and"):
        _args(tmp_path, num_minibatches=5)


def test_each_step_updates_one_minibatch_of_the_rollouts_debates(tiny_text_model, tmp_path, monkeypatch):
    # 4 debates, 2 minibatches x 2 epochs: one rollout serves 4 optimizer steps, each on 2 of its debates, every
    # epoch covering the 4 debates once
    seen = []
    original = MultiAgentTrainer.update

    def record(self, model, experience):
        seen.append(sorted({s.episode for s in experience.samples}))
        assert {j.episode for j in experience.joint_actions} == set(seen[-1])
        return original(self, model, experience)

    monkeypatch.setattr(MultiAgentTrainer, "update", record)
    trainer = _trainer(tiny_text_model, tmp_path, num_iterations=2, num_minibatches=2, max_steps=4)
    assert trainer.num_iterations == 4
    rollouts = []
    original_rollout = trainer.rollout
    trainer.rollout = lambda tasks: rollouts.append(len(tasks)) or original_rollout(tasks)
    trainer.train()
    assert rollouts == [4] and trainer.state.global_step == 4
    assert [len(part) for part in seen] == [2, 2, 2, 2]
    assert sorted(seen[0] + seen[1]) == sorted(seen[2] + seen[3]) == [0, 1, 2, 3]
    first = trainer.optimizer.param_groups[0]["params"][0]
    assert int(trainer.optimizer.state[first]["step"]) == 4


def test_token_advantages_are_whitened_per_turn_and_agent():
    # issue 61: GAE with kl_coef 0, gamma = lambda = 1 and zero values gives every token its answer's reward: agent
    # a's turn-0 tokens +0.5, its turn-1 tokens -0.5. Whitened per (turn, agent) (the authors): each batch is
    # constant -> 0. Per policy: mean 0, unbiased variance 4 * 0.25 / 3 = 1/3 -> +-0.5 / sqrt(1/3 + 1e-8) = +-0.866.
    def experience():
        rows = [DebateSample(agent="a", policy="a", episode=0, turn=t, node=0, generation=None, joint_ids=[],
                             reward=r, old_logps=[-1.0, -1.0], ref_logps=[-1.0, -1.0], old_values=[0.0, 0.0])
                for t, r in ((0, 0.5), (1, -0.5))]
        return Experience(rows, [], {}, ["a"])

    per_turn = experience()
    token_credit(per_turn, 0.0, 1.0, 1.0, True)
    assert [s.token_advantages for s in per_turn.samples] == [[0.0, 0.0], [0.0, 0.0]]
    together = experience()
    token_credit(together, 0.0, 1.0, 1.0, True, whiten_by="policy")
    a = 0.5 / (1 / 3 + 1e-8) ** 0.5
    assert [s.token_advantages for s in together.samples] == [pytest.approx([a, a]), pytest.approx([-a, -a])]
    assert a == pytest.approx(0.866, abs=1e-3)
    raw = experience()
    token_credit(raw, 0.0, 1.0, 1.0, False)
    assert [s.token_advantages for s in raw.samples] == [[0.5, 0.5], [-0.5, -0.5]]


# ------------------------------------------------------------------------------------------------ validation
@pytest.mark.parametrize("kwargs, message", [
    ({"reward_mode": "final"}, "reward_mode must be one of"),
    ({"loss_type": "sapo"}, "loss_type must be one of"),
    ({"beta": 0.1}, "beta .* must be 0"),
    ({"num_generations": 0}, "at least 1"),
    ({"gae_lambda": 1.5}, r"gae_lambda must be in \[0, 1\]"),
    ({"vf_coef": -1.0}, "vf_coef must be >= 0"),
    ({"critic_lora_r": 0}, "critic_lora_r must be positive"),
    ({"max_repeats": 0}, "max_repeats"),
    ({"num_turns": 0}, "num_turns must be at least 1"),
    ({"whiten_by": "episode"}, "whiten_by must be one of"),
    ({"num_minibatches": 0}, "num_minibatches must be between 1 and"),
])
def test_config_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _args(tmp_path, **kwargs)


def test_bad_setups_fail_before_any_model_loads(tmp_path):
    agents = [AgentSpec(a, model=str(tmp_path / "no-such-model")) for a in AGENTS]
    data = Dataset.from_dict({"task_id": [0]})
    with pytest.raises(ValueError, match="not a DebateEnv"):
        MAPoRLTrainer(agents, CollaborationGameEnv, _args(tmp_path, alpha0=1.0), data)
    with pytest.raises(FileNotFoundError, match="not a saved learned verifier"):
        from trl_multiagent.environments import MathDebateEnv

        MAPoRLTrainer(agents, MathDebateEnv, _args(tmp_path, verifier=str(tmp_path / "nothing")),
                         Dataset.from_dict({"question": ["1+1?"], "answer": ["2"]}))


# ------------------------------------------------------------------------------------------------ recipes
DEBATE_CONFIGS = ("math_debate", "nli_debate", "gsm8k_debate", "anli_debate", "debate_demo", "collaboration_game")


def test_debate_recipes_parse(tmp_path):
    from trl_multiagent.command.cli import load_recipe

    for name in DEBATE_CONFIGS:
        path = Path("recipes/configs") / f"{name}.yaml"
        recipe, config = load_recipe(["--config", str(path), "--output_dir", str(tmp_path)])
        assert recipe.trainer == "maporl" and isinstance(config, MAPoRLConfig), name


@pytest.mark.parametrize("name, dataset", [("gsm8k_debate", "openai/gsm8k"), ("anli_debate", "facebook/anli")])
def test_hub_debate_recipes_fail_clearly_offline(tmp_path, monkeypatch, name, dataset):
    import datasets

    from trl_multiagent.command import recipe as recipe_module
    from trl_multiagent.command.cli import load_recipe

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "no-cache", raising=False)
    recipe, config = load_recipe(["--config", f"recipes/configs/{name}.yaml",
                                                "--output_dir", str(tmp_path)])
    assert recipe.dataset == dataset

    class NeverBuilt(MAPoRLTrainer):  # the data fails first: no model is ever loaded here
        def __init__(self, *args, **kwargs):
            raise AssertionError("the trainer was reached although the dataset cannot load offline")

    monkeypatch.setattr(recipe_module, "_trainer_registry", lambda: {"maporl": (MAPoRLConfig, NeverBuilt)})
    with pytest.raises(recipe_module.RecipeError, match="reachable Hugging Face Hub"):
        build_trainer(recipe, config)
