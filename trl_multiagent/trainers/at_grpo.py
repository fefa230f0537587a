"""ATGRPOTrainer: AT-GRPO, agent-and-turn group-relative policy optimization with greedy tree sampling.

Paper: "Stronger-MAS: Multi-Agent Reinforcement Learning for Collaborative LLMs" (AT-GRPO), Sec. 4.1, Algorithm 1,
Eq. 3.

- rollout: :class:`~trl_multiagent.rollout.AgentTurnSampler`. In environment instance e, at turn t, agent i samples K
  candidates from the current state; each is scored (its team and local reward), the K candidates form the group
  keyed (e, t, i) (never two problems, turns or agents in one group), and the candidate with the best mixed reward of
  Eq. 3 is executed (greedy) before the rollout moves on.
- credit (:func:`agent_turn_credit`): every candidate's Eq. 3 reward ``alpha * team + local``
  (:func:`~trl_multiagent.credit.mix_rewards`), normalised within its (e, t, i) group.
- update: the paper gives no objective beyond GRPO's, so the default is GRPO's per-response form, TRL's
  ``loss_type="grpo"`` (per-token clipped ratio, averaged over each response's tokens, then over the responses).
- policies: role-sharing (every agent acts with one policy trained on all roles' data: give the agents one
  `AgentSpec.policy`, or ``policy_mapping: shared`` in a recipe) or role-specialized (one policy per agent, trained
  only on its own data; the default).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from trl_multiagent.credit.at_grpo import LOSS_AGGREGATIONS, mix_rewards
from trl_multiagent.credit.group import grouped_advantages
from trl_multiagent.rollout import AgentTurnSampler, Experience, credit_stats
from trl_multiagent.trainers.base import MultiAgentConfig, MultiAgentTrainer


@dataclass
class ATGRPOConfig(MultiAgentConfig):
    r"""Configuration of [`ATGRPOTrainer`] (AT-GRPO). Every [`MultiAgentConfig`] / [`~trl.GRPOConfig`] field keeps its
    meaning.

    Paper quantities -> fields: K (candidates per agent and turn) = `num_generations`; the turn budget = `num_turns`;
    alpha of Eq. 3 = `alpha`; sequential or parallel agents = `agent_order`; learning rate = `learning_rate` (the
    paper: 1e-6).

    Parameters:
        num_turns (`int`, defaults to `1`):
            The turn budget (episodes end earlier when the environment says `done`, e.g. on alignment).
        agent_order (`str`, defaults to `"sequential"`):
            `"sequential"`: within a turn each agent samples and is scored on the state after the earlier agents'
            executed actions (the environment must accept one agent's action alone); `"parallel"`: all agents sample
            from the same state.
        alpha (`float`, defaults to `1.0`):
            Eq. 3: `r = alpha * team reward + local reward`.
        drop_zero_std_groups (`bool`, defaults to `False`):
            Leave groups whose candidates all tie out of the update (they are still counted in the metrics).
        loss_type (`str`, defaults to `"grpo"`):
            GRPO's per-response objective (the paper states no other); any TRL loss type or `"response"` works.
        loss_aggregation (`str` or `None`, defaults to `None`):
            How the per-token losses are averaged, named as verl's `loss_agg_mode`: `"seq-mean-token-mean"` (GRPO's
            per-response mean, `loss_type="grpo"`, the default) or `"token-mean"` (the authors' released code,
            PettingLLMs: one mean over all the policy's tokens of the step, `loss_type="bnpo"`, so a 100-token
            response weighs 10x a 10-token one; `credit.at_grpo.response_loss_shares`). `None`: as `loss_type`.
    """

    agent_order: str = field(default="sequential", metadata={
        "help": "'sequential' (each agent sees the earlier agents' executed actions) or 'parallel'."})
    alpha: float = field(default=1.0, metadata={"help": "Eq. 3: r = alpha * team reward + local reward."})
    drop_zero_std_groups: bool = field(default=False, metadata={
        "help": "Leave groups whose candidates all tie out of the update (counted in the metrics)."})
    loss_type: str = field(default="grpo", metadata={
        "help": "GRPO's per-response token mean ('grpo', the default: the paper gives no other) or any loss type."})
    loss_aggregation: str | None = field(default=None, metadata={
        "help": "'seq-mean-token-mean' (GRPO's per-response mean, loss_type grpo) or 'token-mean' (the authors' "
                "released code, PettingLLMs: one mean over all tokens, loss_type bnpo); None: as loss_type."})

    @property
    def evaluation_agent_order(self) -> str:
        """Held-out episodes act in the order the agents train in."""
        return self.agent_order

    def __post_init__(self):
        if self.agent_order not in ("sequential", "parallel"):
            raise ValueError(f"agent_order must be 'sequential' or 'parallel', got {self.agent_order!r}")
        if self.loss_aggregation is not None:
            if self.loss_aggregation not in LOSS_AGGREGATIONS:
                raise ValueError(f"loss_aggregation must be one of {list(LOSS_AGGREGATIONS)} or None, got "
                                 f"{self.loss_aggregation!r}")
            wanted = LOSS_AGGREGATIONS[self.loss_aggregation]
            if self.loss_type not in ("grpo", wanted):  # grpo is loss_type's default: only another choice conflicts
                raise ValueError(f"loss_aggregation={self.loss_aggregation!r} is loss_type={wanted!r}; it cannot be "
                                 f"combined with loss_type={self.loss_type!r}")
            self.loss_type = wanted
        super().__post_init__()


class ATGRPOTrainer(MultiAgentTrainer):
    """Trainer for AT-GRPO (agent- and turn-wise grouped GRPO with tree sampling).

    Paper: "Stronger-MAS: Multi-Agent Reinforcement Learning for Collaborative LLMs", Sec. 4.1, Algorithm 1, Eq. 3.

    Args:
        agents: the team ([`AgentSpec`] list or [`AgentPool`]); agents naming one policy share it (role-sharing).
        environment: a zero-argument factory returning a fresh [`Environment`] whose steps give every agent a local
            reward next to the team reward.
        args: an [`ATGRPOConfig`].
        train_dataset: one row per environment instance.
        callbacks: extra `transformers.TrainerCallback` objects.
    """

    config_class = ATGRPOConfig
    algorithm = "AT-GRPO"
    summary_fields = ("num_turns", "agent_order", "alpha", "drop_zero_std_groups", "loss_aggregation", "loss_type")
    _trainer_name = "at_grpo"  # its `trainer:` name (TRAINERS), for the model card
    _tag_names = ["trl", "trl-multiagent", "at-grpo"]
    _name = "AT-GRPO"
    _paper = {"title": "Stronger-MAS: Multi-Agent Reinforcement Learning for Collaborative LLMs"}

    def validate_environment(self, probe, agent_names, train_dataset, args: ATGRPOConfig) -> None:
        """The Environment protocol, plus partial joint actions for sequential agents."""
        super().validate_environment(probe, agent_names, train_dataset, args)
        if args.agent_order == "sequential" and not getattr(probe, "supports_partial_actions", False):
            raise ValueError(f"{type(probe).__name__} does not accept one agent's action alone "
                             "(supports_partial_actions), which sequential AT-GRPO needs; set agent_order='parallel'.")

    def build_sampler(self, args: ATGRPOConfig) -> AgentTurnSampler:
        """Agent-and-turn groups with greedy execution of the best candidate (Alg. 1) and Eq. 3 rewards."""
        return AgentTurnSampler(num_samples=args.num_generations, num_turns=args.num_turns,
                                agent_order=args.agent_order, alpha=args.alpha)

    def assign_credit(self, experience: Experience) -> None:
        """Eq. 3 rewards normalised in their (e, t, i) groups (:func:`agent_turn_credit`)."""
        agent_turn_credit(experience, self.args.alpha, self.args.scale_rewards, self.args.drop_zero_std_groups)

    def summary(self):
        policies = {s.policy for s in self.pool.specs.values()}
        out = super().summary()
        out["policy_mapping"] = "shared" if len(policies) < len(self.pool.specs) else "specialized"
        return out


def agent_turn_credit(experience: Experience, alpha: float, scale_rewards: str = "group",
                      drop_zero_std_groups: bool = False) -> None:
    """AT-GRPO's credit (Sec. 4.1, Eq. 3), written onto ``experience`` of an
    :class:`~trl_multiagent.rollout.AgentTurnSampler`.

    Every candidate's reward and return is ``alpha * team + local`` (Eq. 3, :func:`~trl_multiagent.credit.mix_rewards`)
    of its scoring; its advantage is that reward normalised within its (e, t, i) group
    (:func:`~trl_multiagent.credit.group.grouped_advantages`). ``drop_zero_std_groups`` leaves the groups whose
    candidates all tie out of the samples (they are still counted in the metrics: ``frac_reward_zero_std``,
    ``dropped_samples``).
    """
    samples = experience.samples
    for s in samples:
        s.reward = s.ret = mix_rewards(s.team_reward, s.local_reward, alpha)
    advantages, group_stats = grouped_advantages([s.reward for s in samples], [s.group for s in samples],
                                                 scale=scale_rewards)
    for s, a in zip(samples, advantages):
        s.advantage = a
    kept = samples
    if drop_zero_std_groups:
        spread: dict[tuple, list[float]] = defaultdict(list)
        for s in samples:
            spread[s.group].append(s.reward)
        kept = [s for s in samples if max(spread[s.group]) - min(spread[s.group]) > 1e-12]
    experience.stats.update(credit_stats(experience.agents, samples, experience.joint_actions, group_stats))
    experience.stats["reward"] = sum(s.reward for s in samples) / len(samples) if samples else math.nan
    experience.stats["dropped_samples"] = float(len(samples) - len(kept))
    experience.samples = kept
