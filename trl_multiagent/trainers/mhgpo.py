"""MHGPOTrainer: MHGPO, critic-free RL for a pipeline of LLM agents that share one policy.

Paper: "Heterogeneous Group-Based Reinforcement Learning for LLM-based Multi-Agent Systems" (Chen et al., MHGPO),
Sec. "Method: MHGPO", Eq. 4-7, Algorithms 1-5.

What this trainer brings to the shared loop (:class:`~trl_multiagent.trainers.base.MultiAgentTrainer`):

- the environment is a :class:`~trl_multiagent.environments.pipeline.PipelineEnvironment` (a DAG of agents and tool
  steps) and the sampler is :class:`~trl_multiagent.rollout.pipeline.PipelineSampler` (IS / FoF / RR);
- credit (:func:`pipeline_credit`): rewards of the final answers propagated backward (Eq. 4), agent-specific format
  rewards added, advantages normalized in heterogeneous groups (Eq. 5) — :mod:`trl_multiagent.credit.mhgpo`;
- loss: TRL's per-sequence clipped objective (``loss_type="grpo"``, the ``1/|o|`` of Eq. 6) with every sample weighted
  so that each agent counts equally per question (the ``1/n sum_k 1/G_k`` of Eq. 6), through the base's
  ``sample_weights`` hook; KL to the adapter-off reference with ``beta`` (Eq. 6-7);
- one policy shared by all agents by default (parameter sharing; roles come from the prompts).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from datasets import Dataset

from trl_multiagent.credit.mhgpo import (
    AGGREGATIONS,
    Aggregation,
    agent_loss_weights,
    final_rewards,
    heterogeneous_group_advantages,
    propagate_rewards,
)
from trl_multiagent.environments.pipeline import PipelineEnvironment
from trl_multiagent.rollout import PipelineExperience, Sample, credit_stats
from trl_multiagent.rollout.pipeline import STRATEGIES, PipelineSampler
from trl_multiagent.team.pool import AgentPool, AgentSpec
from trl_multiagent.trainers.base import (
    ROW_MEAN_LOSSES,
    MultiAgentConfig,
    MultiAgentTrainer,
    check_dataset,
    validate_team_against_environment,
)

logger = logging.getLogger(__name__)

#: The policy (adapter) name all agents act with when ``share_policy`` is on and the specs name no policy.
SHARED_POLICY = "shared"


@dataclass
class MHGPOConfig(MultiAgentConfig):
    r"""Configuration of [`MHGPOTrainer`] (MHGPO). Every [`MultiAgentConfig`] / [`~trl.GRPOConfig`] field
    keeps its meaning (a pipeline runs once per question: there are no turns).

    Paper quantities -> fields: G (group size, `rollout.n`) = `num_generations`; the sampling function H = `sampling`;
    p_i (Round-robin fork probabilities) = `fork_probabilities`; Aggr (Eq. 4) = `reward_aggregation`; epsilon (clip)
    = `epsilon`; beta (KL) = `beta`; learning rate = `learning_rate`; top-p = `top_p`; batch size (questions per
    step) = `episodes_per_step`.

    Parameters:
        sampling (`str`, defaults to `"fork_on_first"`):
            Group rollout strategy: `"independent"` (IS: fork G at every agent in turn, keep only that agent's
            homogeneous group), `"fork_on_first"` (FoF: fork G at the entry agent; heterogeneous groups downstream) or
            `"round_robin"` (RR: fork at an agent drawn per question with `fork_probabilities`; the agents before it
            are grouped across the questions with the same fork agent).
        fork_probabilities (`list[float]` or `None`, defaults to `None`):
            Round-robin only: the probability p_i that agent i is the fork point, one per agent in the environment's
            `agents` order, non-negative, summing to 1. `None`: the paper's `[0.7, 0.1, 0.2]` (Rewriter, Reranker,
            Answerer) for a three-agent pipeline; for another number of agents the same shares by position in
            topological order, 0.7 at the entry agent, 0.2 at the final agent and 0.1 spread over the agents in
            between (two agents: 0.7, 0.3), see
            :func:`~trl_multiagent.rollout.pipeline.default_fork_probabilities`. (The field cannot default to the
            list itself: it depends on the number of agents and is refused by the other strategies.)
        regroup_singletons (`bool`, defaults to `True`):
            Round-robin only: after the batch's rollouts, the samples whose group has one member (an agent before
            the fork point of the only question forking there) are shuffled and cut into groups of G, the leftover
            ones left out of training, as the paper's Algorithm 5 does
            (:func:`~trl_multiagent.credit.mhgpo.regroup_singletons`). `False`: they stay as groups of one, with
            advantage 0 (the paper's main text alone).
        reward_aggregation (`str`, defaults to `"mean"`):
            Aggr of Eq. 4, how an output's shared reward combines the rewards of the outputs that consumed it:
            `"mean"` (the paper), `"max"` or `"min"`.
        agent_loss_weighting (`bool`, defaults to `True`):
            Weight the loss as Eq. 6: every agent's samples of a question together weigh 1/n of that question,
            however many there are. `False`: a plain mean over the policy's samples.
        share_policy (`bool`, defaults to `True`):
            Parameter sharing: agents whose `AgentSpec` names no policy of its own all act with one policy
            (`"shared"`). `False` keeps the specs' policies (one adapter per agent unless they name a common one).
        beta (`float`, defaults to `0.001`):
            KL coefficient of Eq. 6, the paper's 0.001 (Table 2; TRL's default is 0.0).
        top_p (`float`, defaults to `1.0`):
            TRL's default, not the paper's: Table 2 lists "top_n 0.9" ("param for top-n sampling"), a name the paper
            does not define; the recipes here read it as nucleus sampling and set `top_p: 0.9`.
        num_generations (`int`, defaults to `4`):
            G, the paper's group size 4 (Table 2, `rollout.n`).
        learning_rate (`float`, defaults to `1e-6`):
            TRL's default, the upper end of the paper's 5e-7 to 1e-6 (Table 2, full fine-tuning of an 8B model); the
            LoRA recipes here use larger rates.
        temperature (`float`, defaults to `1.0`):
            TRL's default; the paper states no sampling temperature.
    """

    sampling: str = field(default="fork_on_first", metadata={
        "help": "Group rollout strategy: 'independent' (IS), 'fork_on_first' (FoF) or 'round_robin' (RR)."})
    fork_probabilities: list[float] | None = field(default=None, metadata={
        "help": "RR: probability that each agent (environment order) is the fork point; None = the paper's "
                "[0.7, 0.1, 0.2] for three agents (entry, middle, final; other lengths: 0.7 entry, 0.2 final, 0.1 "
                "shared by the agents in between)."})
    regroup_singletons: bool = field(default=True, metadata={
        "help": "RR: regroup singleton groups into groups of G, leftovers out of training (Algorithm 5); False: "
                "keep them as groups of one (advantage 0)."})
    reward_aggregation: str = field(default="mean", metadata={
        "help": "Aggr of Eq. 4 for backward reward propagation: 'mean', 'max' or 'min'."})
    agent_loss_weighting: bool = field(default=True, metadata={
        "help": "Eq. 6: average the loss within each agent, then over agents (per question)."})
    share_policy: bool = field(default=True, metadata={
        "help": "All agents that name no policy act with one shared policy (MHGPO's parameter sharing)."})
    loss_type: str = field(default="grpo", metadata={
        "help": "TRL loss type; 'grpo' is Eq. 6 (per-sequence token mean, then the mean over samples)."})
    beta: float = field(default=0.001, metadata={"help": "KL coefficient (Table 2 of the paper: 0.001)."})

    def __post_init__(self):
        if self.num_turns != 1:
            raise ValueError(f"num_turns must be 1 for MHGPO: its pipeline (the agent DAG) runs once per question, got "
                             f"{self.num_turns}")
        if self.sampling not in STRATEGIES:
            raise ValueError(f"sampling must be one of {list(STRATEGIES)}, got {self.sampling!r}")
        if self.fork_probabilities is not None:
            if self.sampling != "round_robin":
                raise ValueError(f"fork_probabilities are used by sampling='round_robin' only (sampling is "
                                 f"{self.sampling!r})")
            probs = [float(p) for p in self.fork_probabilities]
            if not probs or any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
                raise ValueError(f"fork_probabilities must be non-negative and sum to 1, got {self.fork_probabilities}")
            self.fork_probabilities = probs
        if self.reward_aggregation not in AGGREGATIONS:
            raise ValueError(f"reward_aggregation must be one of {list(AGGREGATIONS)}, got {self.reward_aggregation!r}")
        if self.agent_loss_weighting and self.loss_type not in ROW_MEAN_LOSSES and self.loss_type != "response":
            raise ValueError(f"agent_loss_weighting (Eq. 6) needs a per-sequence loss_type "
                             f"{sorted(ROW_MEAN_LOSSES)}, got {self.loss_type!r}; or set agent_loss_weighting=False")
        super().__post_init__()


class MHGPOTrainer(MultiAgentTrainer):
    """Trainer for MHGPO (Multi-Agent Heterogeneous Group Policy Optimization) over a pipeline of agents.

    Paper: "Heterogeneous Group-Based Reinforcement Learning for LLM-based Multi-Agent Systems", Chen et al.,
    Eq. 4-7, Algorithms 1-5.

    Args:
        agents: the team, as a list of [`AgentSpec`] (one per pipeline agent; with `share_policy`, those naming no
            policy share one) or an already built [`AgentPool`].
        environment: a zero-argument factory returning a [`PipelineEnvironment`] (one instance serves every task).
        args: a [`MHGPOConfig`].
        train_dataset: one row per question.
        callbacks: extra `transformers.TrainerCallback` objects.
    """

    _trainer_name = "mhgpo"  # its `trainer:` name (TRAINERS), for the model card
    _tag_names = ["trl", "trl-multiagent", "mhgpo"]
    _name = "MHGPO"
    _paper = {
        "title": "Heterogeneous Group-Based Reinforcement Learning for LLM-based Multi-Agent Systems",
        "id": "2506.02718",
        # docstyle-ignore
        "citation": "@article{chen2025mhgpo, title={{Heterogeneous Group-Based Reinforcement Learning for LLM-based "
        "Multi-Agent Systems}}, author={Guanzhong Chen and Shaoxiong Yang and Chao Li and Wei Liu and Jian Luan and "
        "Zenglin Xu}, year=2025, journal={arXiv preprint arXiv:2506.02718}}",
    }

    config_class = MHGPOConfig
    algorithm = "MHGPO"
    summary_fields = ("sampling", "fork_probabilities", "regroup_singletons", "reward_aggregation",
                      "agent_loss_weighting", "share_policy")

    def prepare_agents(self, agents, args: MHGPOConfig):
        """Parameter sharing: the agents that name no policy of their own act with one policy (``share_policy``)."""
        return share_one_policy(agents) if args.share_policy else agents

    def validate_environment(self, probe, agent_names: Sequence[str], train_dataset: Dataset,
                             args: MHGPOConfig) -> None:
        """A pipeline environment with a valid graph, the team = its agents, the dataset's columns, and one fork
        probability per agent; all before any model loads."""
        if not isinstance(probe, PipelineEnvironment):
            raise TypeError(f"MHGPO trains pipelines: environment() must return a PipelineEnvironment, got "
                            f"{type(probe).__name__}")
        probe.graph()
        validate_team_against_environment(agent_names, probe)
        check_dataset(probe, train_dataset)
        if args.fork_probabilities is not None and len(args.fork_probabilities) != len(probe.agents):
            raise ValueError(f"fork_probabilities has {len(args.fork_probabilities)} entries for the "
                             f"{len(probe.agents)} agents {list(probe.agents)}")

    def build_sampler(self, args: MHGPOConfig) -> PipelineSampler:
        """IS / FoF / RR over the pipeline, with Eq. 4 propagation and Eq. 5 groups (``self.agent_order`` is the
        environment's ``agents``, the order of ``fork_probabilities``)."""
        probs = None
        if args.fork_probabilities is not None:
            probs = dict(zip(self.agent_order, args.fork_probabilities))
        # RR's fork draws use Python's `random`, which the trainer seeds per process (set_seed(seed, device_specific)).
        return PipelineSampler(num_samples=args.num_generations, strategy=args.sampling, fork_probabilities=probs,
                               regroup_singletons=args.regroup_singletons)

    def assign_credit(self, experience: PipelineExperience) -> None:
        """Eq. 4 propagation and agent-specific rewards, Eq. 5 heterogeneous groups (:func:`pipeline_credit`)."""
        pipeline_credit(experience, self.args.reward_aggregation, self.args.scale_rewards)

    def sample_weights(self, policy: str, rows: Sequence[Sample]) -> list[float] | None:
        """Eq. 6: ``1/(Q * n_q * G_k,q)`` per sample (:func:`~trl_multiagent.credit.mhgpo.agent_loss_weights`)."""
        if not self.args.agent_loss_weighting or not rows:
            return None
        return agent_loss_weights([s.agent for s in rows], [s.episode for s in rows])


def pipeline_credit(experience: PipelineExperience, aggregate: Aggregation = "mean", scale_rewards: str = "group"
                    ) -> None:
    """MHGPO's credit (Eq. 4-5), written onto ``experience`` of a :class:`~trl_multiagent.rollout.PipelineSampler`.

    The final answers' rewards are carried backward through the DAG's links with ``Aggr = aggregate``
    (:func:`~trl_multiagent.credit.mhgpo.propagate_rewards`, Eq. 4 first line): a sample's ``ret``; its own format
    reward is added after (:func:`~trl_multiagent.credit.mhgpo.final_rewards`, Eq. 4 second line): its ``reward``;
    its advantage is Eq. 5 in its group ``m`` (:func:`~trl_multiagent.credit.mhgpo.heterogeneous_group_advantages`).
    """
    agent_ids = sorted(experience.consumers)
    index = {node_id: k for k, node_id in enumerate(agent_ids)}
    shared_all = propagate_rewards([[index[c] for c in experience.consumers[i]] for i in agent_ids],
                                   {index[n]: r for n, r in experience.terminal_rewards.items()}, aggregate)
    samples = experience.samples
    shared = [shared_all[index[s.node]] for s in samples]
    rewards = final_rewards(shared, [s.format_reward for s in samples])
    advantages, group_stats = heterogeneous_group_advantages(rewards, [s.group for s in samples], scale=scale_rewards)
    for s, ret, reward, advantage in zip(samples, shared, rewards, advantages):
        s.ret, s.reward, s.advantage = ret, reward, advantage
    experience.stats.update(credit_stats(experience.agents, samples, experience.joint_actions, group_stats))


def share_one_policy(agents: Sequence[AgentSpec] | AgentPool) -> list[AgentSpec] | AgentPool:
    """Parameter sharing: every spec that names no policy of its own (``policy == name``) acts with ``"shared"``.

    Specs that name other policies keep them. A pool is already built: it must then hold a single policy.
    """
    if isinstance(agents, AgentPool):
        if len(agents.policies) != 1:
            raise ValueError(f"share_policy is on but the given AgentPool has {len(agents.policies)} policies "
                             f"{list(agents.policies)}; build it with one policy or set share_policy=False")
        return agents
    specs = list(agents)
    return [dataclasses.replace(s, policy=SHARED_POLICY) if s.policy == s.name else s for s in specs]
