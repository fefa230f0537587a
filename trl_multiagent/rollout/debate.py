"""MAPoRL's rollout: collaborative debates, each answer rewarded by the verifier with incentives and penalties.

Paper: MAPoRL (Park et al., arXiv 2502.18439), Sec. 3.1 (debate), Def. 1 / App. F (reward modes), Sec. 3.3 (Tables 1-2),
App. G.2-G.3 (penalties).

For every task the sampler runs ``num_debates`` independent debates. Turn 1: each agent answers the question alone;
later turns: each agent reads every agent's previous answer (the environment writes those prompts) and revises. A
debate ends after ``num_turns`` turns or when the environment says ``done`` (a debate environment stops as soon as
all agents agree). Generation is batched: at each turn, all agents answer all live debates in one team-level call.

Each answer ``y_{i,t}`` becomes one :class:`DebateSample` whose ``reward`` is, in this order:

1. the verifier score ``s(q, y_{i,t})``: the environment's ``local_rewards`` (the rule verifier), or a learned
   verifier's score when a ``scorer`` is given;
2. replaced by the penalty value (-10) when an App. G penalty triggers (App. G.2: the answer's VERIFIER SCORE
   becomes -10, :func:`~trl_multiagent.credit.maporl.penalized_score`), so that it enters every sum below;
3. the reward mode over the debate's (penalised) score matrix (``immediate``, ``cumulative`` or ``influence``, with
   ``gamma``; an early-stopped debate's last answers stand for its remaining turns);
4. plus the collaboration incentives of Tables 1-2 (needs a :class:`~trl_multiagent.environments.debate.DebateEnv`,
   which knows which answers are right).

The token-level part (KL penalty per token, GAE with the critic's values) needs the models and is done by the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import GenerationConfig

from ..agents import AgentPool, Generation
from ..credit import discounted_returns
from ..credit.maporl import (
    REWARD_MODES,
    Incentives,
    PenaltySettings,
    answer_penalties,
    collaboration_incentives,
    fill_after_early_stop,
    majority_vote_accuracy,
    penalized_score,
    verification_rewards,
)
from ..environments.base import Environment
from ..environments.debate import DebateEnv, TurnOutcome
from .experience import Experience, JointAction, Sample, rollout_stats

#: A learned verifier: ``scorer(questions, solutions) -> scores in [0, 1]``.
Scorer = Callable[[Sequence[str], Sequence[str]], Sequence[float]]


@dataclass
class DebateSample(Sample):
    """One agent's answer at one turn of one debate, with what MAPoRL's PPO needs on top of a :class:`Sample`.

    Attributes:
        score: the verifier score of the answer as the verifier gave it (before an App. G penalty replaces it by the
            penalty value in the reward's sums).
        base_reward: the reward-mode reward over the penalised scores, before the incentives.
        incentive: the Tables 1-2 incentive added to it.
        correct: whether the answer is right (debate environments), else ``None``.
        penalties: the App. G checks and whether each triggered.
        token_advantages, token_returns, old_values: per completion token, filled in by the trainer (GAE).
    """

    score: float = 0.0
    base_reward: float = 0.0
    incentive: float = 0.0
    correct: bool | None = None
    penalties: dict[str, bool] = field(default_factory=dict)
    token_advantages: list[float] | None = None
    token_returns: list[float] | None = None
    old_values: list[float] | None = None


@dataclass
class Debate:
    """One debate as played: per turn, every agent's generation, verifier score and (debate environments) outcome."""

    episode: int
    task: Mapping[str, Any]
    agents: list[str]
    question: str | None = None
    generations: list[dict[str, Generation]] = field(default_factory=list)
    scores: list[dict[str, float]] = field(default_factory=list)
    team_rewards: list[float] = field(default_factory=list)
    outcomes: list[TurnOutcome] = field(default_factory=list)
    infos: list[dict[str, float]] = field(default_factory=list)

    @property
    def turns_played(self) -> int:
        return len(self.generations)


class DebateSampler:
    """Rolls out MAPoRL debates and scores every answer (see the module docstring).

    Args:
        num_turns: T, the turn budget.
        num_debates: independent debates per task.
        reward_mode: ``"immediate"``, ``"cumulative"`` or ``"influence"`` (App. F, Def. 1).
        gamma: the discount of later turns in the reward modes.
        incentives: alpha0, alpha1, beta0, beta1 of Tables 1-2.
        penalties: the App. G checks (``None``: no penalties).
        scorer: a learned verifier ``scorer(questions, solutions)``; ``None`` uses the environment's local rewards.
    """

    def __init__(self, num_turns: int, num_debates: int = 1, reward_mode: str = "influence", gamma: float = 0.3,
                 incentives: Incentives | None = None, penalties: PenaltySettings | None = None,
                 scorer: Scorer | None = None):
        if num_turns < 1 or num_debates < 1:
            raise ValueError("num_turns and num_debates must be at least 1")
        if reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {reward_mode!r}")
        self.num_turns, self.num_debates = num_turns, num_debates
        self.reward_mode, self.gamma = reward_mode, gamma
        self.incentives = incentives or Incentives()
        self.penalties = penalties
        self.scorer = scorer

    # ------------------------------------------------------------------------------------------------ debates
    def run(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
            generation_config: GenerationConfig) -> list[Debate]:
        """Play ``num_debates`` debates per task; one team-level generation per turn."""
        envs, debates = [], []
        prompts: list[dict] = []
        for task in tasks:
            for _ in range(self.num_debates):
                env = env_factory()
                prompts.append(env.reset(task))
                envs.append(env)
                debates.append(Debate(len(debates), task, list(env.agents),
                                      question=env.question if isinstance(env, DebateEnv) else None))
        if self.incentives.active and envs and not isinstance(envs[0], DebateEnv):
            raise ValueError(f"collaboration incentives need a debate environment that knows which answers are right; "
                             f"{type(envs[0]).__name__} is not a DebateEnv")
        if self.scorer is not None and envs and not isinstance(envs[0], DebateEnv):
            raise ValueError(f"a learned verifier scores debate answers; {type(envs[0]).__name__} is not a DebateEnv")
        live = list(range(len(envs)))
        for _turn in range(self.num_turns):
            if not live:
                break
            agents = debates[live[0]].agents
            gens = pool.generate_by_agent({a: [prompts[d][a] for d in live] for a in agents}, 1, generation_config)
            finished = []
            for pos, d in enumerate(live):
                turn_gens = {a: gens[a][pos][0] for a in agents}
                result = envs[d].step({a: g.text for a, g in turn_gens.items()})
                if result.local_rewards is None or set(result.local_rewards) != set(agents):
                    raise ValueError(f"{type(envs[d]).__name__}.step must return a local reward (the verifier score) "
                                     f"for every agent {agents}")
                debate = debates[d]
                debate.generations.append(turn_gens)
                debate.scores.append({a: float(result.local_rewards[a]) for a in agents})
                debate.team_rewards.append(float(result.team_reward))
                debate.infos.append(dict(result.info))
                if isinstance(envs[d], DebateEnv):
                    debate.outcomes.append(envs[d].outcomes[-1])
                if result.done:
                    finished.append(d)
                else:
                    prompts[d] = result.next_prompts
            live = [d for d in live if d not in finished]
        if self.scorer is not None:
            self._score_with_verifier(debates)
        return debates

    def _score_with_verifier(self, debates: list[Debate]) -> None:
        cells = [(d, t, a) for d in debates for t in range(d.turns_played) for a in d.agents]
        scores = list(self.scorer([d.question for d, _, _ in cells], [d.generations[t][a].text for d, t, a in cells]))
        if len(scores) != len(cells):
            raise ValueError(f"the verifier returned {len(scores)} scores for {len(cells)} answers")
        for (d, t, a), s in zip(cells, scores):
            d.scores[t][a] = float(s)

    # ------------------------------------------------------------------------------------------------ rewards
    def penalty_flags(self, pool: AgentPool, debate: Debate) -> list[dict[str, dict[str, bool]]]:
        """The App. G checks of every answer, ``[turn played][agent] -> {check: triggered}`` (empty without
        penalties)."""
        if self.penalties is None:
            return [{a: {} for a in debate.agents} for _ in range(debate.turns_played)]
        flags = []
        for turn_gens in debate.generations:
            row = {}
            for agent, gen in turn_gens.items():
                tok = pool.tokenizer_of(agent)
                tokens = [tok.decode([tid]) for tid in gen.completion_ids]
                row[agent] = answer_penalties(gen.text, tokens, gen.truncated, self.penalties)
            flags.append(row)
        return flags

    def reward_parts(self, debate: Debate, flags: Sequence[Mapping[str, Mapping[str, bool]]] | None = None
                     ) -> tuple[list[list[float]], list[list[float]]]:
        """The reward-mode reward and the Tables 1-2 incentive of every answer, ``[agent][turn played]`` each.

        ``flags`` (:meth:`penalty_flags`) marks the penalised answers: their verifier score becomes the penalty value
        (App. G.2, :func:`~trl_multiagent.credit.maporl.penalized_score`) BEFORE the reward mode aggregates the
        scores, so a penalty also lowers the cumulative and influence-aware rewards that the answer's score enters.
        """
        played = debate.turns_played
        value = self.penalties.value if self.penalties is not None else 0.0
        rows = [[debate.scores[t][a] if flags is None else penalized_score(debate.scores[t][a], flags[t][a], value)
                 for t in range(played)] for a in debate.agents]
        filled = fill_after_early_stop(rows, self.num_turns)
        base = [row[:played] for row in verification_rewards(filled, self.reward_mode, self.gamma)]
        incentive = [[0.0] * played for _ in debate.agents]
        if self.incentives.active:
            groups = fill_after_early_stop([[o.groups[i] for o in debate.outcomes] for i in range(len(debate.agents))],
                                           self.num_turns)
            correct = fill_after_early_stop([[o.correct[i] for o in debate.outcomes]
                                             for i in range(len(debate.agents))], self.num_turns)
            incentive = [row[:played] for row in collaboration_incentives(groups, correct, self.incentives)]
        return base, incentive

    def rollout(self, pool: AgentPool, env_factory: Callable[[], Environment], tasks: Sequence[Mapping[str, Any]],
                generation_config: GenerationConfig) -> Experience:
        """Debates -> one :class:`DebateSample` per answer, rewarded, and the per-turn team results as joint actions."""
        debates = self.run(pool, env_factory, tasks, generation_config)
        samples: list[DebateSample] = []
        joints: list[JointAction] = []
        for debate in debates:
            flags = self.penalty_flags(pool, debate)
            base, incentive = self.reward_parts(debate, flags)
            for t in range(debate.turns_played):
                ja = JointAction(id=len(joints), node=debate.episode, episode=debate.episode, turn=t,
                                 sample_index=tuple([0] * len(debate.agents)), reward=debate.team_rewards[t],
                                 done=t == debate.turns_played - 1, info=debate.infos[t],
                                 local_rewards=dict(debate.scores[t]))
                if t > 0:
                    joints[-1].children.append(ja.id)
                joints.append(ja)
                for i, agent in enumerate(debate.agents):
                    gen = debate.generations[t][agent]
                    reward = base[i][t] + incentive[i][t]
                    samples.append(DebateSample(
                        agent=agent, policy=pool.policy_of(agent), episode=debate.episode, turn=t, node=debate.episode,
                        generation=gen, joint_ids=[ja.id], group=(debate.episode,), reward=reward, ret=reward,
                        score=debate.scores[t][agent], base_reward=base[i][t], incentive=incentive[i][t],
                        correct=debate.outcomes[t].correct[i] if debate.outcomes else None,
                        penalties=dict(flags[t][agent])))
        for debate_joints in _by_episode(joints):  # the team's return: its per-turn results summed from this turn on
            for j, ret in zip(debate_joints, discounted_returns([j.reward for j in debate_joints], 1.0)):
                j.ret = ret
        agents = debates[0].agents if debates else list(pool.agent_names)
        stats = rollout_stats(agents, samples, joints, {"num_groups": float(len(debates)),
                                                        "frac_zero_std_groups": math.nan},
                              len(samples), len(debates))
        for key in ("frac_reward_zero_std", "num_groups", "num_generations", "num_joint_actions"):
            stats.pop(key, None)
        stats.update(debate_stats(debates, samples, self.num_turns))
        return Experience(samples, joints, stats)


def _by_episode(joints: Sequence[JointAction]) -> list[list[JointAction]]:
    """The joint actions of each debate, in turn order."""
    episodes: dict[int, list[JointAction]] = {}
    for j in joints:
        episodes.setdefault(j.episode, []).append(j)
    return [sorted(js, key=lambda j: j.turn) for js in episodes.values()]


def debate_stats(debates: Sequence[Debate], samples: Sequence[DebateSample], num_turns: int) -> dict[str, float]:
    """Metrics of one batch of debates: per-turn majority accuracy (tie rule; early-stopped debates keep their last
    answers), agreement, scores, incentives and the fraction of answers each penalty hit."""
    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs) if xs else math.nan

    stats: dict[str, float] = {"debate/turns_played": mean(d.turns_played for d in debates),
                               "score": mean(s.score for s in samples),
                               "incentive": mean(s.incentive for s in samples)}
    with_outcomes = [d for d in debates if d.outcomes]
    for t in range(num_turns):
        if with_outcomes:
            stats[f"debate/turn{t + 1}/majority_accuracy"] = mean(
                majority_vote_accuracy(o.groups, o.correct) for o in
                (d.outcomes[min(t, d.turns_played - 1)] for d in with_outcomes))
    if with_outcomes:
        stats["debate/agreed"] = mean(float(len(set(d.outcomes[-1].groups)) == 1
                                            and d.outcomes[-1].groups[0] is not None) for d in with_outcomes)
    names = sorted({k for s in samples for k in s.penalties})
    for name in names:
        stats[f"penalty/{name}"] = mean(float(s.penalties.get(name, False)) for s in samples)
    if names:
        stats["penalty/any"] = mean(float(any(s.penalties.values())) for s in samples)
    for agent in sorted({s.agent for s in samples}):
        stats[f"agent/{agent}/score"] = mean(s.score for s in samples if s.agent == agent)
    return stats
