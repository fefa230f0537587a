"""MultiAgentGRPOTrainer: MAGRPO, multi-agent group-relative policy optimization over a tree of joint actions.

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (Liu et al., MAGRPO), Algorithm 1, Eq. 1-2.

- rollout: :class:`~trl_multiagent.rollout.JointTreeSampler` expands a tree per task: at every node each agent samples
  K responses, which form joint actions (``aligned`` or ``cross``); each joint action gets the joint reward and, until
  the horizon H or an early stop, a child node. Returns along the tree and group-relative advantages of the joint
  actions at one node (Eq. 1) come from :mod:`trl_multiagent.credit`.
- update (Eq. 2): per agent, the clipped ratio of WHOLE-response probabilities times its joint action's advantage,
  averaged over the group and the batch, gradient of the summed token log-probs
  (:func:`~trl_multiagent.losses.response_policy_loss`, ``loss_type="response"``), plus ``beta`` * KL to the
  reference (the adapter switched off).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..losses import RESPONSE_LOSS
from ..rollout import JointTreeSampler
from .base import MultiAgentConfig, MultiAgentTrainer


@dataclass
class MultiAgentGRPOConfig(MultiAgentConfig):
    r"""Configuration of [`MultiAgentGRPOTrainer`] (MAGRPO). Every [`MultiAgentConfig`] / [`~trl.GRPOConfig`] field
    keeps its meaning.

    Paper quantities -> fields: K (samples per agent per node) = `num_generations`; H (turns) = `num_turns`;
    gamma = `gamma`; epsilon (clip) = `epsilon` / `epsilon_high`; beta (KL) = `beta`; sampling temperature and top-p
    = `temperature` / `top_p`; learning rate = `learning_rate` (or the agent's own `AgentSpec.learning_rate`).

    Parameters:
        num_turns (`int`, defaults to `1`):
            Horizon H: the number of turns the rollout tree is expanded to (fewer where the environment ends the
            episode early).
        joint_mode (`str`, defaults to `"aligned"`):
            How the agents' K samples at a node form joint actions: `"aligned"` (the k-th samples together, K joint
            actions) or `"cross"` (the Cartesian product, K**n joint actions; each sample is credited with the mean
            advantage of the joint actions it is part of).
        gamma (`float`, defaults to `1.0`):
            Discount of later turns' rewards in the returns (the MAGRPO paper uses 1.0).
        loss_type (`str`, defaults to `"response"`):
            Eq. 2: the response-level clipped ratio with the gradient of the summed token log-probs. The step of a
            summed log-prob grows with the response length: the paper trains with learning rates of 5e-6 (writing)
            and 1e-6 / 5e-6 (coding, one / two turns). Any TRL loss type can be named instead.
    """

    num_turns: int = field(default=1, metadata={"help": "Horizon H: turns of the rollout tree."})
    joint_mode: str = field(default="aligned", metadata={"help": "'aligned' (K joint actions) or 'cross' (K**n)."})
    gamma: float = field(default=1.0, metadata={"help": "Discount of later turns' rewards."})
    loss_type: str = field(default=RESPONSE_LOSS, metadata={
        "help": "'response' (MAGRPO Eq. 2: whole-response ratio, summed token log-probs) or a TRL loss type."})

    def __post_init__(self):
        if self.num_turns < 1:
            raise ValueError(f"num_turns must be at least 1, got {self.num_turns}")
        if self.joint_mode not in ("aligned", "cross"):
            raise ValueError(f"joint_mode must be 'aligned' or 'cross', got {self.joint_mode!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        super().__post_init__()


class MultiAgentGRPOTrainer(MultiAgentTrainer):
    """Trainer for MAGRPO (Multi-Agent Group Relative Policy Optimization).

    Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning", Liu et al. (MAGRPO), Algorithm 1, Eq. 1-2.

    Args:
        agents: the team, as a list of [`AgentSpec`] (loaded here) or an already built [`AgentPool`].
        environment: a zero-argument factory returning a fresh [`Environment`] (a class works), called once per task.
        args: a [`MultiAgentGRPOConfig`].
        train_dataset: one row per task, passed to `Environment.reset`.
        callbacks: extra `transformers.TrainerCallback` objects.
    """

    config_class = MultiAgentGRPOConfig
    algorithm = "MAGRPO"
    summary_fields = ("num_turns", "joint_mode", "gamma")
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

    def build_sampler(self, args: MultiAgentGRPOConfig) -> JointTreeSampler:
        """MAGRPO's joint tree with groups of joint actions per node."""
        return JointTreeSampler(num_samples=args.num_generations, num_turns=args.num_turns,
                                joint_mode=args.joint_mode, gamma=args.gamma, scale_rewards=args.scale_rewards)
