"""AT-GRPO's agent-and-turn sampler (trl_multiagent/rollout/agent_turn.py) and its credit (trainers/at_grpo.py:
agent_turn_credit) with a scripted pool."""

import pytest
from transformers import GenerationConfig

from tests.fake_pool import ScriptedPool
from trl_multiagent.credit import best_candidate, mix_rewards
from trl_multiagent.environments import Environment, MatrixGameEnv, StepResult
from trl_multiagent.rollout import AgentTurnSampler
from trl_multiagent.trainers.at_grpo import agent_turn_credit

GEN = GenerationConfig(max_new_tokens=2)


def play(sampler, pool, env, tasks, drop_zero_std_groups=False):
    """The sampler's rollout, then AT-GRPO's credit with the sampler's alpha (what the trainer's assign_credit does)."""
    exp = sampler.rollout(pool, env, tasks, GEN)
    assert all(s.advantage == 0.0 for s in exp.samples)
    agent_turn_credit(exp, sampler.alpha, drop_zero_std_groups=drop_zero_std_groups)
    return exp


class RelayEnv(Environment):
    """Agents answer a digit, one after another. Team reward: the digit / 10. Local reward of `second`: 1 when it
    repeats the digit `first` EXECUTED this turn. Prompts show the executed actions so far."""

    agents = ("first", "second")
    max_turns = 3
    supports_partial_actions = True

    def reset(self, task):
        self.task, self.log, self.turn = task, [], 0
        return self._prompts()

    def _prompts(self):
        return {a: f"{self.task['id']}|{self.turn}|{','.join(self.log)}" for a in self.agents}

    def step(self, joint_action):
        (agent, text), = joint_action.items()
        local = {}
        if agent == "second":
            local = {"second": 1.0 if self.log and text == self.log[-1] else 0.0}
        self.log.append(text)
        if agent == "second":
            self.turn += 1
        done = self.turn >= self.max_turns
        return StepResult(team_reward=int(text) / 10, local_rewards=local, done=done,
                          next_prompts=None if done else self._prompts())


def digits(agent, prompt, k):
    return str((k * 3 + len(prompt)) % 10)


def test_groups_never_merge_problems_turns_or_agents():
    pool = ScriptedPool(["first", "second"], digits)
    exp = play(AgentTurnSampler(num_samples=4, num_turns=3), pool, RelayEnv, [{"id": 0}, {"id": 1}])
    groups = {}
    for s in exp.samples:
        groups.setdefault(s.group, []).append(s)
    assert len(groups) == 2 * 3 * 2  # problems x turns x agents
    for (episode, turn, agent), members in groups.items():
        assert len(members) == 4
        assert {(m.episode, m.turn, m.agent) for m in members} == {(episode, turn, agent)}


def test_sequential_later_agent_is_scored_after_earlier_agents_executed_action():
    pool = ScriptedPool(["first", "second"], digits)
    exp = play(AgentTurnSampler(num_samples=4, num_turns=1, alpha=0.0), pool, RelayEnv, [{"id": 0}])
    firsts = [s for s in exp.samples if s.agent == "first"]
    executed_first = max(firsts, key=lambda s: (s.reward, -firsts.index(s))).generation.text
    seconds = [s for s in exp.samples if s.agent == "second"]
    # second's prompt already shows first's executed digit, and only candidates repeating it earn the local reward
    assert all(s.generation.prompt_ids == seconds[0].generation.prompt_ids for s in seconds)
    for s in seconds:
        assert s.reward == (1.0 if s.generation.text == executed_first else 0.0)


def test_greedy_executes_the_argmax_candidate():
    pool = ScriptedPool(["first", "second"], digits)
    exp = play(AgentTurnSampler(num_samples=4, num_turns=1, alpha=1.0), pool, RelayEnv, [{"id": 7}])
    firsts = [s.reward for s in exp.samples if s.agent == "first"]
    executed = exp.joint_actions[0]
    assert executed.sample_index == (firsts.index(max(firsts)),)
    assert executed.reward == pytest.approx(max(firsts))  # alpha=1 and no local reward for `first`


def test_reward_mixing_eq3():
    assert mix_rewards(team=2.0, local=0.5, alpha=0.3) == pytest.approx(1.1)
    pool = ScriptedPool(["first", "second"], digits)
    exp = play(AgentTurnSampler(num_samples=3, num_turns=1, alpha=0.5), pool, RelayEnv, [{"id": 0}])
    first_exec = exp.joint_actions[0]
    for s in exp.samples:
        if s.agent == "second":
            team = int(s.generation.text) / 10
            expected_local = 1.0 if s.generation.text == [x for x in exp.samples if x.agent == "first"][
                first_exec.sample_index[0]].generation.text else 0.0
            assert s.reward == pytest.approx(0.5 * team + expected_local)


def test_parallel_scores_aligned_candidates_with_local_rewards():
    pool = ScriptedPool(["agent1", "agent2"], lambda a, p, k: "AB"[k % 2] if a == "agent1" else "BA"[k % 2])
    env = lambda: MatrixGameEnv(local_payoff="posg2")  # noqa: E731
    exp = play(AgentTurnSampler(num_samples=2, num_turns=1, agent_order="parallel", alpha=0.0), pool, env, [{}])
    # candidate 0: (A, B) -> locals (1, 6), team 7; candidate 1: (B, A) -> locals (6, 1), team 7
    r = {(s.agent, s.generation.text): s.reward for s in exp.samples}
    assert r == {("agent1", "A"): 1.0, ("agent1", "B"): 6.0, ("agent2", "B"): 6.0, ("agent2", "A"): 1.0}
    # greedy over the SCORED joint actions: sums 1 + 6 = 7 and 6 + 1 = 7 tie -> the first, (A, B), whose observed
    # team reward is 7 (each agent's own best, B and B, would execute (B, B), never scored, team reward 0)
    executed = exp.joint_actions[0]
    assert executed.sample_index == (0, 0) and executed.reward == 7.0
    assert executed.local_rewards == {"agent1": 1.0, "agent2": 6.0}


def test_parallel_executes_the_best_scored_joint_action_by_hand():
    # three joint candidates of the Table 5(b) game (POSG 2), alpha = 0 (Eq. 3: r_i = local_i):
    #   k = 0: (B, A) -> r = (6, 1), sum 7;  k = 1: (A, B) -> r = (1, 6), sum 7;  k = 2: (A, A) -> r = (5, 5), sum 10
    pool = ScriptedPool(["agent1", "agent2"], lambda a, p, k: ("BAA" if a == "agent1" else "ABA")[k])
    env = lambda: MatrixGameEnv(local_payoff="posg2")  # noqa: E731
    exp = play(AgentTurnSampler(num_samples=3, num_turns=1, agent_order="parallel", alpha=0.0), pool, env, [{}])
    assert [s.reward for s in exp.samples if s.agent == "agent1"] == [6.0, 1.0, 5.0]
    assert [s.reward for s in exp.samples if s.agent == "agent2"] == [1.0, 6.0, 5.0]
    # executed: argmax of the sums (7, 7, 10) = k = 2, (A, A), team reward 10 as observed when it was scored.
    # The old reading took each agent's own argmax, agent1 k = 0 (B) and agent2 k = 1 (B): (B, B), team reward 0.
    executed = exp.joint_actions[0]
    assert executed.sample_index == (2, 2) and executed.reward == 10.0
    assert executed.local_rewards == {"agent1": 5.0, "agent2": 5.0}
    assert exp.stats["team_reward"] == 10.0


def test_best_candidate_sums_the_acting_agents_eq3_rewards():
    # alpha = 0.5, r_i = 0.5 * team + local_i (Eq. 3), three joint candidates of two agents:
    #   k = 0: team 0.2, locals (1.0, 0.0) -> r = (0.5 * 0.2 + 1.0, 0.5 * 0.2 + 0.0) = (1.1, 0.1), sum 1.2
    #   k = 1: team 1.0, locals (0.2, 0.3) -> r = (0.5 + 0.2, 0.5 + 0.3)             = (0.7, 0.8), sum 1.5
    #   k = 2: team 0.0, locals (0.0, 0.9) -> r = (0.0, 0.9),                                  sum 0.9
    teams, locals_ = [0.2, 1.0, 0.0], [(1.0, 0.0), (0.2, 0.3), (0.0, 0.9)]
    rewards = [{"x": mix_rewards(t, lx, 0.5), "y": mix_rewards(t, ly, 0.5)} for t, (lx, ly) in zip(teams, locals_)]
    assert [r["x"] for r in rewards] == pytest.approx([1.1, 0.7, 0.0])
    assert [r["y"] for r in rewards] == pytest.approx([0.1, 0.8, 0.9])
    assert best_candidate(rewards) == 1  # the joint action with the largest sum, 1.5 (old: x's k = 0 with y's k = 2)
    # one acting agent (sequential order): the paper's argmax of its reward, the first on ties
    assert best_candidate([{"x": 0.3}, {"x": 0.9}, {"x": 0.9}]) == 1


def test_sequential_needs_partial_actions():
    pool = ScriptedPool(["agent1", "agent2"], lambda a, p, k: "A")
    with pytest.raises(ValueError, match="partial"):
        play(AgentTurnSampler(num_samples=2, num_turns=1), pool, MatrixGameEnv, [{}])


def test_zero_std_groups_are_dropped_and_counted():
    pool = ScriptedPool(["first", "second"], lambda a, p, k: "5")  # every candidate ties
    exp = play(AgentTurnSampler(num_samples=3, num_turns=1), pool, RelayEnv, [{"id": 0}], drop_zero_std_groups=True)
    assert exp.samples == [] and exp.stats["dropped_samples"] == 6.0
    assert exp.stats["frac_reward_zero_std"] == 1.0


def test_success_rate_counts_solved_episodes_with_greedy_team():
    from tests.test_games import BFS_TOOL, plan_copying_tool_output
    from trl_multiagent.environments import PlanPathEnv
    from trl_multiagent.evaluation import success_rate

    tasks = PlanPathEnv.make_rows(3, seed=5, split="eval")

    def script(agent, prompt, k):
        # a capable tool agent for the first two instances only; the plan agent copies the tool's output
        if agent == "tool":
            third = "\n".join(" ".join(row) for row in tasks[2]["grid"])  # how the prompt draws the map
            return BFS_TOOL if third not in prompt else "```python\nprint('no idea')\n```"
        return plan_copying_tool_output(prompt)

    def env():
        return PlanPathEnv(max_turns=1, cache_tool_runs=False)

    pool = ScriptedPool(["tool", "plan"], script)
    result = success_rate(pool, env, tasks, num_turns=1, max_new_tokens=8)
    assert result["episodes"] == 3.0
    assert result["success_rate"] == pytest.approx(2 / 3)


class MeetingEnv(RelayEnv):
    """RelayEnv whose step waits (as a sandboxed tool does) until a second step is under way in another thread:
    stepping one candidate at a time, the wait times out."""

    concurrent_steps = True

    def __init__(self, barrier):
        self.barrier = barrier

    def clone(self):
        twin = MeetingEnv(self.barrier)
        twin.task, twin.log, twin.turn = self.task, list(self.log), self.turn
        return twin

    def step(self, joint_action):
        self.barrier.wait()
        return super().step(joint_action)


def test_the_candidates_of_every_episode_are_scored_concurrently(monkeypatch):
    """One candidate per episode (K = 1), two episodes: their two scoring steps must run at the same time (each waits
    for the other), and the rollout equals the one of the plain environment."""
    import threading

    from trl_multiagent.environments import stepping

    monkeypatch.setattr(stepping.os, "cpu_count", lambda: 2)
    barrier = threading.Barrier(2, timeout=10)
    pool = ScriptedPool(["first", "second"], digits)
    tasks = [{"id": 0}, {"id": 1}]
    exp = play(AgentTurnSampler(num_samples=1, num_turns=2), pool, lambda: MeetingEnv(barrier), tasks)
    plain = play(AgentTurnSampler(num_samples=1, num_turns=2), pool, RelayEnv, tasks)
    assert not barrier.broken
    assert [(s.agent, s.episode, s.turn, s.generation.text, s.team_reward, s.local_reward) for s in exp.samples] == \
        [(s.agent, s.episode, s.turn, s.generation.text, s.team_reward, s.local_reward) for s in plain.samples]
    assert [(j.episode, j.turn, j.reward) for j in exp.joint_actions] == \
        [(j.episode, j.turn, j.reward) for j in plain.joint_actions]


def test_token_mean_loss_aggregation_of_the_released_code_by_hand(tmp_path):
    # issue 61: PettingLLMs (the authors' released AT-GRPO) averages the loss over all tokens of the batch (verl's
    # loss_agg_mode "token-mean"); this library's default averages each response first (GRPO's per-response mean).
    # Responses of 100 and 10 tokens: token-mean shares 100/110 and 10/110 (10x), per-response 1/2 and 1/2.
    from trl_multiagent.credit.at_grpo import response_loss_shares
    from trl_multiagent.trainers import ATGRPOConfig

    assert response_loss_shares([100, 10], "token-mean") == pytest.approx([100 / 110, 10 / 110])
    assert response_loss_shares([100, 10], "seq-mean-token-mean") == [0.5, 0.5]
    # per-token losses 1.0 on the long response, 0.0 on the short one: token mean 100 / 110 = 0.909, not 0.5
    means = [1.0, 0.0]
    assert sum(w * m for w, m in zip(response_loss_shares([100, 10], "token-mean"), means)) == \
        pytest.approx((100 * 1.0 + 10 * 0.0) / 110)
    with pytest.raises(ValueError, match="Unknown loss aggregation"):
        response_loss_shares([1], "seq-sum")
    # the config: token-mean is TRL's bnpo (a token mean over the policy's step in the shared update), the default
    # stays GRPO's per-response mean
    assert ATGRPOConfig(output_dir=str(tmp_path)).loss_type == "grpo"
    assert ATGRPOConfig(output_dir=str(tmp_path), loss_aggregation="token-mean").loss_type == "bnpo"
    assert ATGRPOConfig(output_dir=str(tmp_path), loss_aggregation="seq-mean-token-mean").loss_type == "grpo"
    with pytest.raises(ValueError, match="cannot be combined"):
        ATGRPOConfig(output_dir=str(tmp_path), loss_aggregation="token-mean", loss_type="dapo")
