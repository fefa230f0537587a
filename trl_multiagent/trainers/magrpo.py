"""MAGRPOTrainer: MAGRPO, multi-agent group-relative policy optimization over a tree of joint actions.

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (Liu et al., MAGRPO), Algorithm 1, Eq. 1-2.

- rollout: :class:`~trl_multiagent.rollout.JointTreeSampler` expands a tree per task: at every node each agent samples
  K responses, which form joint actions (``aligned`` or ``cross``); each joint action gets the joint reward and, until
  the horizon H or an early stop, a child node.
- credit (:func:`tree_credit`): returns along the tree, group-relative advantages of the joint actions at one node
  (Eq. 1) and each sample's share of its joint actions, from :mod:`trl_multiagent.credit`.
- update (Eq. 2): per agent, the clipped ratio of WHOLE-response probabilities times its joint action's advantage,
  averaged over the group and the batch, gradient of the summed token log-probs
  (:func:`~trl_multiagent.credit.losses.response_policy_loss`, ``loss_type="response"``), plus ``beta`` * KL to the
  reference (the adapter switched off). With H > 1 turns, Algorithm 1 computes and applies Eq. 2 for each turn on
  its own: each turn's objective is averaged over that turn's samples and the turns' objectives are summed, so every
  turn weighs the same however many tree nodes it has (:func:`~trl_multiagent.credit.magrpo.turn_loss_weights`,
  through the base's ``sample_weights`` hook).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from trl_multiagent.credit.group import grouped_advantages
from trl_multiagent.credit.losses import RESPONSE_LOSS
from trl_multiagent.credit.magrpo import (
    ADVANTAGE_MODES,
    cross_sample_credit,
    grouped_released_code_advantages,
    turn_loss_weights,
)
from trl_multiagent.credit.returns import tree_returns
from trl_multiagent.rollout import Experience, JointAction, JointTreeSampler, Sample, credit_stats
from trl_multiagent.trainers.base import ROW_MEAN_LOSSES, MultiAgentConfig, MultiAgentTrainer


@dataclass
class MAGRPOConfig(MultiAgentConfig):
    r"""Configuration of [`MAGRPOTrainer`] (MAGRPO). Every [`MultiAgentConfig`] / [`~trl.GRPOConfig`] field
    keeps its meaning.

    Paper quantities -> fields: K (samples per agent per node) = `num_generations`; H (turns) = `num_turns`;
    gamma = `gamma`; epsilon (clip) = `epsilon` / `epsilon_high`; beta (KL) = `beta`; sampling temperature and top-p
    = `temperature` / `top_p`; learning rate = `learning_rate` (or the agent's own `AgentSpec.learning_rate`).

    Defaults and the paper (Appendix C): the paper's sampling and learning settings differ between its tasks
    (writing: T 0.8, top-p 0.95, lr 5e-6, beta 0.02; coding: T 0.7, top-p 0.9, lr 1e-6 in one turn and 5e-6 in two,
    no KL stated), so `temperature`, `top_p`, `learning_rate` and `beta` keep TRL's defaults (1.0, 1.0, 1e-6, 0.0)
    and each recipe sets its task's values; K = 4 and gamma = 1.0 hold for every task and are the defaults.

    Parameters:
        num_turns (`int`, defaults to `1`):
            Horizon H: the number of turns the rollout tree is expanded to (fewer where the environment ends the
            episode early). With H > 1 the loss is Algorithm 1's: each turn's Eq. 2 objective averaged over that
            turn's samples, the turns' objectives summed (every turn weighs 1, whatever its number of nodes).
        joint_mode (`str`, defaults to `"aligned"`):
            How the agents' K samples at a node form joint actions: `"aligned"` (the k-th samples together, K joint
            actions) or `"cross"` (the Cartesian product, K**n joint actions; each sample is credited with the mean
            advantage of the joint actions it is part of).
        gamma (`float`, defaults to `1.0`):
            Discount of later turns' rewards in the returns (the paper: 1.0, Appendix C).
        loss_type (`str`, defaults to `"response"`):
            Eq. 2: the response-level clipped ratio with the gradient of the summed token log-probs. The step of a
            summed log-prob grows with the response length: the paper trains with learning rates of 5e-6 (writing)
            and 1e-6 / 5e-6 (coding, one / two turns). Any TRL loss type can be named instead; with H > 1 it must
            be a per-response one (the per-turn weights are per response).
        num_generations (`int`, defaults to `4`):
            K, responses per agent at each node: 4, the authors' released trainer's group size (the paper's text
            names the group size G without a value).
        temperature (`float`, defaults to `1.0`):
            TRL's default, not a paper value: the paper samples at 0.8 (writing) and 0.7 (coding), a per-task
            setting that the recipes carry (`tldr_magrpo.yaml` 0.8; `coding*.yaml`, `coop_humaneval.yaml`, `mbpp.yaml` 0.7).
        top_p (`float`, defaults to `1.0`):
            TRL's default (no nucleus truncation), not a paper value: the paper uses 0.95 (writing) and 0.9
            (coding), set in the recipes as `temperature` is.
        learning_rate (`float`, defaults to `1e-6`):
            The paper's rate for one-turn coding (TRL's default too); writing and two-turn coding use 5e-6. The
            embedded-model recipes use larger rates (LoRA adapters on a 135M model, trained for tens of steps).
        beta (`float`, defaults to `0.0`):
            No KL term (and no reference pass): the paper's 0.02 is stated for writing only, none for coding.
        advantage_mode (`str`, defaults to `"eq1"`):
            `"eq1"`: the paper's Eq. 1, `(R - mean) / std` over the joint actions of a node (`scale_rewards` as in
            TRL). The authors' released trainer (CoMLRL) instead: `"mean"` (its default, `R - mean`, no std:
            returns [0, 0, 0, 1] give 0.75 where Eq. 1 gives 1.4997), `"raw"` (`R`), `"max"` (`R - max`) or
            `"rloo"` (`R` minus the mean of the other K - 1), `credit.magrpo.released_code_advantages`.
    """

    joint_mode: str = field(default="aligned", metadata={"help": "'aligned' (K joint actions) or 'cross' (K**n)."})
    loss_type: str = field(default=RESPONSE_LOSS, metadata={
        "help": "'response' (MAGRPO Eq. 2: whole-response ratio, summed token log-probs) or a TRL loss type."})
    temperature: float = field(default=1.0, metadata={
        "help": "Sampling temperature; TRL's 1.0, not a paper value: the paper uses 0.8 (writing) and 0.7 (coding), "
                "set by the recipes."})
    top_p: float = field(default=1.0, metadata={
        "help": "Nucleus sampling; TRL's 1.0, not a paper value: the paper uses 0.95 (writing) and 0.9 (coding), set "
                "by the recipes."})
    learning_rate: float = field(default=1e-6, metadata={
        "help": "The paper's one-turn coding rate (1e-6; TRL's default); writing and two-turn coding: 5e-6."})
    beta: float = field(default=0.0, metadata={
        "help": "KL coefficient; 0 (no reference pass): the paper states 0.02 for writing only, none for coding."})
    advantage_mode: str = field(default="eq1", metadata={
        "help": "'eq1': the paper's (R - mean) / std per node; the authors' released code (CoMLRL): 'mean' (R - "
                "mean, its default), 'raw', 'max' (R - max) or 'rloo' (leave-one-out mean)."})

    def __post_init__(self):
        if self.joint_mode not in ("aligned", "cross"):
            raise ValueError(f"joint_mode must be 'aligned' or 'cross', got {self.joint_mode!r}")
        if self.advantage_mode not in ADVANTAGE_MODES:
            raise ValueError(f"advantage_mode must be one of {ADVANTAGE_MODES}, got {self.advantage_mode!r}")
        if self.advantage_mode != "eq1" and self.scale_rewards not in ("group", True):
            raise ValueError(f"scale_rewards applies to advantage_mode='eq1' (Eq. 1) only; advantage_mode="
                             f"{self.advantage_mode!r} never divides, got scale_rewards={self.scale_rewards!r}")
        if self.num_turns > 1 and self.loss_type != RESPONSE_LOSS and self.loss_type not in ROW_MEAN_LOSSES:
            raise ValueError(f"num_turns > 1 weighs each turn's samples on their own (Algorithm 1), which needs a "
                             f"per-response loss_type ({RESPONSE_LOSS!r} or {sorted(ROW_MEAN_LOSSES)}), got "
                             f"{self.loss_type!r}")
        super().__post_init__()


class MAGRPOTrainer(MultiAgentTrainer):
    """Trainer for MAGRPO (Multi-Agent Group Relative Policy Optimization).

    Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning", Liu et al. (MAGRPO), Algorithm 1, Eq. 1-2.

    Args:
        agents: the team, as a list of [`AgentSpec`] (loaded here) or an already built [`AgentPool`].
        environment: a zero-argument factory returning a fresh [`Environment`] (a class works), called once per task.
        args: a [`MAGRPOConfig`].
        train_dataset: one row per task, passed to `Environment.reset`.
        callbacks: extra `transformers.TrainerCallback` objects.
    """

    config_class = MAGRPOConfig
    algorithm = "MAGRPO"
    summary_fields = ("num_turns", "joint_mode", "gamma", "advantage_mode")
    _trainer_name = "magrpo"  # its `trainer:` name (TRAINERS), for the model card
    _tag_names = ["trl", "trl-multiagent", "magrpo"]
    _name = "MAGRPO"
    _paper = {
        "title": "LLM Collaboration With Multi-Agent Reinforcement Learning",
        "id": "2508.04652",
        # docstyle-ignore
        "citation": "@article{liu2025llmcollaboration, title={{LLM Collaboration With Multi-Agent Reinforcement "
        "Learning}}, author={Shuo Liu and Zeyu Liang and Xueguang Lyu and Christopher Amato}, year=2025, "
        "journal={arXiv preprint arXiv:2508.04652}}",
    }

    def build_sampler(self, args: MAGRPOConfig) -> JointTreeSampler:
        """MAGRPO's joint tree with groups of joint actions per node."""
        return JointTreeSampler(num_samples=args.num_generations, num_turns=args.num_turns, joint_mode=args.joint_mode)

    def assign_credit(self, experience: Experience) -> None:
        """Returns along the tree, Eq. 1 per node and each sample's share of its joint actions (:func:`tree_credit`)."""
        tree_credit(experience, self.args.num_generations, self.args.gamma, self.args.scale_rewards,
                    self.args.advantage_mode)

    def sample_weights(self, policy: str, rows: Sequence[Sample]) -> list[float] | None:
        """Algorithm 1 with H > 1: each turn's Eq. 2 objective is the mean over that turn's samples, and the turns'
        objectives are summed (:func:`~trl_multiagent.credit.magrpo.turn_loss_weights`). ``None`` (the plain mean)
        when the samples are all of one turn, which is the same thing."""
        if len({s.turn for s in rows}) < 2:
            return None
        return turn_loss_weights([s.turn for s in rows])


def tree_credit(experience: Experience, num_samples: int, gamma: float, scale_rewards: str = "group",
                advantage_mode: str = "eq1") -> None:
    """MAGRPO's credit of a joint tree (Algorithm 1, Eq. 1), written onto ``experience``.

    Every joint action's return is its reward plus ``gamma`` times the mean return of its children
    (:func:`~trl_multiagent.credit.returns.tree_returns`); its advantage is Eq. 1 over the joint actions of its node
    (:func:`~trl_multiagent.credit.group.grouped_advantages`, ``scale_rewards`` as ``GRPOConfig.scale_rewards``), or
    with another ``advantage_mode`` the authors' released code's
    (:func:`~trl_multiagent.credit.magrpo.grouped_released_code_advantages`).
    Each sample's reward, return and advantage are those of its joint action (``aligned``), or their mean over the
    K**(n-1) joint actions it takes part in (``cross``: :func:`~trl_multiagent.credit.magrpo.cross_sample_credit`).
    ``num_samples`` is K.
    """
    joints = experience.joint_actions
    returns = tree_returns([j.reward for j in joints], [j.children for j in joints], gamma)
    if advantage_mode == "eq1":
        advantages, group_stats = grouped_advantages(returns, [j.node for j in joints], scale=scale_rewards)
    else:
        advantages, group_stats = grouped_released_code_advantages(returns, [j.node for j in joints], advantage_mode)
    for j, r, a in zip(joints, returns, advantages):
        j.ret, j.advantage = r, a
    by_node: dict[int, list[JointAction]] = {}
    for j in joints:
        by_node.setdefault(j.node, []).append(j)
    for s in experience.samples:
        node, i = by_node[s.node], experience.agents.index(s.agent)
        k = joints[s.joint_ids[0]].sample_index[i]  # which of the agent's K samples at the node
        indices = [j.sample_index for j in node]
        s.reward, s.ret, s.advantage = (cross_sample_credit([getattr(j, attr) for j in node], indices, i,
                                                            num_samples)[k] for attr in ("reward", "ret", "advantage"))
    experience.stats.update(credit_stats(experience.agents, experience.samples, joints, group_stats))
