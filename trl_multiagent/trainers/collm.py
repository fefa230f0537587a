"""CoLLMTrainer: CoLLM-CC (one centralized critic) and CoLLM-DC (one critic per agent).

Paper: "Learning Decentralized LLM Collaboration with Multi-Agent Actor Critic" (Liu, Chen, Amiri, Amato;
arXiv 2601.21972), Sec. 4.2 (Eq. 2-5), Sec. 5, Algorithm 1 (CC), Appendix B Algorithm 2 (DC).

One cycle, on the shared loop of :class:`~trl_multiagent.trainers.base.MultiAgentTrainer`:

1. rollout (Alg. 1 lines 3-15): :class:`~trl_multiagent.rollout.SinglePathSampler` plays ``episodes_per_step``
   episodes, ONE path each (no tree); the behaviour log-probabilities ``pi_old(a_{i,t} | h_{i,t})`` come from one
   teacher-forced pass per policy right after (the shared base's ``rollout``). The joint transitions form the
   buffer; the credit of the rollout (:func:`episode_returns`) is only the Monte-Carlo returns, logged.
2. ``num_iterations`` (E) passes over the buffer, each cut into ``num_minibatches`` minibatches; every minibatch is one
   optimizer step (Alg. 1 lines 16-25): the critic's value ``V`` of every transition's history and of its successor
   history gives the TD error ``delta = r + gamma * V(h') - V(h)`` (:mod:`trl_multiagent.credit.collm`; no
   bootstrap after the last turn or an early stop); the critic's loss is the mean of ``delta^2`` over the
   minibatch's JOINT transitions (Eq. 5; Eq. 3 per agent for DC), and every agent's response at that transition
   gets ``delta`` as its advantage in the whole-response objective (Eq. 4 / Eq. 2: ``rho * grad log pi * delta``,
   no ratio clip unless ``actor_ratio_clip`` is set; :func:`~trl_multiagent.credit.losses.response_policy_loss`, shared
   with MAGRPO). Actors and critics are separate optimizer groups with their own learning rates, stepped together
   once.

The centralized critic reads every agent's history and the global information ``m_t`` (turn, horizon, last reward
and its maximum); a decentralized critic reads only its own agent's history, and ``m_t`` too (App. E: "we provide
DC and CC with the following global information m_t during training"; ``critic_global_info: false`` drops it). The
critics are value heads on LoRA adapters of the team's own bases (:mod:`trl_multiagent.team.critics`); they are used in
training only (CTDE).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from trl_multiagent.credit import discounted_returns, normalize_per_turn, td_errors, td_targets
from trl_multiagent.credit.losses import RESPONSE_LOSS, value_loss
from trl_multiagent.generation.padding import left_pad, pad_token_id
from trl_multiagent.generation.requests import Prompt
from trl_multiagent.rollout import EpisodeBuffer, Experience, SinglePathSampler, credit_stats
from trl_multiagent.runtime.memory import release_freed_memory
from trl_multiagent.team.critics import CriticSpec
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers.base import MultiAgentConfig, MultiAgentTrainer
from trl_multiagent.trainers.critic_config import CriticSettings, warn_once

CRITIC_MODES = ("centralized", "decentralized")


@dataclass
class CoLLMConfig(CriticSettings, MultiAgentConfig):
    r"""Configuration of [`CoLLMTrainer`] (CoLLM-CC / CoLLM-DC). Every [`MultiAgentConfig`] / [`~trl.GRPOConfig`]
    field keeps its meaning; each episode is one path (`num_generations` = 1).

    Paper quantities -> fields: H = `num_turns`; gamma = `gamma`; E = `num_iterations`; minibatch = the buffer
    (`episodes_per_step` episodes) cut into `num_minibatches` parts; actor learning rate alpha_pi = `learning_rate`
    (or `AgentSpec.learning_rate`); critic learning rate alpha_V = `critic_learning_rate`; rho of Eq. 2 / Eq. 4 =
    the whole-response ratio of `loss_type="response"`, unclipped by default (`actor_ratio_clip`).

    Parameters:
        num_turns (`int`, defaults to `1`):
            H, the horizon (an episode ends earlier when the environment says `done`).
        gamma (`float`, defaults to `1.0`):
            Discount of the TD targets and returns.
        critic (`str`, defaults to `"centralized"`):
            `"centralized"` (CoLLM-CC: one critic V(h_t, m_t) on the joint history) or `"decentralized"` (CoLLM-DC:
            one critic V_i(h_{i,t}) per agent on its local history).
        critic_agent (`str` or `None`, defaults to `None`):
            CC: the agent whose base carries the critic's adapter (default: the environment's first agent).
        critic_model (`str` or `None`, defaults to `None`):
            A model of its own for the critic(s) (hub id, local path or embedded short name); `None`: the critic is
            one more adapter on the base of its agent (no second base copy).
        critic_quantization (`str` or `None`, defaults to `None`):
            Quantization of `critic_model` (`None` or `"4bit"`).
        critic_lora_r (`int`, defaults to `16`), critic_lora_alpha (`int`, defaults to `32`),
        critic_lora_dropout (`float`, defaults to `0.0`):
            LoRA settings of the critic's adapter.
        critic_share_adapter (`bool`, defaults to `False`):
            DC only: each critic reads its agent's policy adapter (only the value head is the critic's own), the
            parameter-sharing variant of Appendix B; the value loss then also trains the policy adapter.
        critic_learning_rate (`float`, defaults to `3e-6`):
            Learning rate alpha_V of the critics (adapter and head), separate from the actors' `learning_rate`.
        vf_coef (`float`, defaults to `1.0`):
            Weight of the value loss (matters only when a critic shares the policy's adapter).
        cliprange_value (`float` or `None`, defaults to `None`):
            PPO-style value clipping around the critic's estimate at rollout time (not in the paper); `None`: off.
            (`value_clip` is its deprecated old name.)
        num_iterations (`int`, defaults to `1`):
            E: passes over each rollout buffer. Each pass shuffles the buffer's joint transitions. (`num_epochs` is
            its deprecated old name.)
        num_minibatches (`int`, defaults to `1`):
            Minibatches per pass; each is one optimizer step, so a buffer gives `num_iterations * num_minibatches`
            steps (`max_steps` counts these updates). At most `episodes_per_step` (no minibatch is ever empty).
        td_error_normalization (`bool`, defaults to `False`):
            `False`: every agent's advantage is its TD error (Eq. 2 / Eq. 4, the paper). `True`: the authors' released
            code (CoMLRL's `advantage_normalization`, on there by default): each critic's TD errors of one turn in the
            minibatch (the whole buffer with `num_minibatches=1`) become `(delta - mean) / max(std, 1e-6)`, std the
            population one (`credit.collm.normalize_per_turn`: [0.7, 0.8, 1.0] -> [-1.069, -0.267, 1.336]).
        critic_global_info (`bool`, defaults to `True`):
            Give the critic(s), centralized AND decentralized, the global information m_t ("turn t of H; last reward
            r_{t-1} of at most reward_max"). `True` is the paper's setting: App. E gives m_t to "DC and CC" and
            Sec. 6 uses it "in both CC and DC for consistency". `False` drops it (DC then reads its agent's local
            history only, as in standard MARL; a CC critic without m_t also works).
        actor_ratio_clip (`float` or `None`, defaults to `None`):
            Clip c of the actor's whole-response importance ratio rho = pi(a|h) / pi_old(a|h): the PPO-style
            objective `min(rho * delta, clip(rho, 1 - c, 1 + c) * delta)`. `None` is the paper's form: Eq. 2 / Eq. 4
            are `rho * grad log pi * delta` with no clip (the authors' public actor minimises `-log p * delta`, the
            same gradient at rho = 1). Appendix C's "advantage clip" (0.2; 0.05 Minecraft) was the default clip
            value before; set it here to clip. With one update per rollout (E = 1, one minibatch) rho = 1 and the
            clip never binds.
        epsilon (`float` or `None`, defaults to `None`):
            Deprecated here: the old name of `actor_ratio_clip` (setting it warns once and sets `actor_ratio_clip`).
            `epsilon_high` is not used by this trainer.
        reward_max (`float` or `None`, defaults to `None`):
            The largest reward of one turn, shown in m_t; `None`: the environment's `reward_max` attribute (an
            error when it has none).
        critic_history_turns (`int`, defaults to `-1`):
            How many earlier (observation, response) turns a critic reads before the current observations; -1: all
            of them. The current observations and m_t are always there.
        critic_max_length (`int` or `None`, defaults to `4096`):
            Longest critic input in tokens; longer ones lose their oldest tokens (m_t, at the start, stays).
        critic_micro_batch_size (`int` or `None`, defaults to `None`):
            Critic inputs per forward/backward pass of the value loss; `None`: `per_device_train_batch_size`.
            Critic inputs (several agents' histories) are much longer than responses and the activation memory of
            a pass grows with its batch times the square of its length on CPU, so long histories need a small
            value here. The loss is the same mean over the minibatch whatever the micro-batch.

    Defaults changed from [`MultiAgentConfig`]: `num_generations=1` (one path per episode), `learning_rate=5e-6`
    (the paper's actor rate). The actor's objective is `loss_type="response"` (Eq. 2 / Eq. 4): the ratio
    rho = pi(a|h) / pi_old(a|h) of whole-response probabilities (exp of the SUM of the token log-ratios), times the TD
    error, with the gradient of the summed token log-probs (:func:`~trl_multiagent.credit.losses.response_policy_loss`,
    shared with MAGRPO), unclipped unless `actor_ratio_clip` is set.
    """

    min_generations: ClassVar[int] = 1

    critic: str = field(default="centralized", metadata={
        "help": "'centralized' (CoLLM-CC: V(joint history, m_t)) or 'decentralized' (CoLLM-DC: V_i(local history))."})
    critic_agent: str | None = field(default=None, metadata={
        "help": "CC: the agent whose base carries the critic (default: the environment's first agent)."})
    critic_model: str | None = field(default=None, metadata={
        "help": "A model of the critic's own; None: an adapter on its agent's base (no second copy)."})
    critic_quantization: str | None = field(default=None, metadata={
        "help": "Quantization of critic_model: None or '4bit'."})
    critic_lora_r: int | None = field(default=16, metadata={"help": "LoRA rank of the critic adapter."})
    critic_lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha of the critic adapter."})
    critic_lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout of the critic adapter."})
    critic_share_adapter: bool = field(default=False, metadata={
        "help": "DC only: critics read their agent's policy adapter (parameter sharing, Appendix B)."})
    critic_learning_rate: float | None = field(default=3e-6, metadata={"help": "alpha_V: the critics' learning rate."})
    cliprange_value: float | None = field(default=None, metadata={
        "help": "PPO-style value clipping around the rollout-time value (not in the paper); None: off."})
    num_minibatches: int = field(default=1, metadata={
        "help": "Minibatches (optimizer steps) per pass over the buffer; at most episodes_per_step."})
    td_error_normalization: bool = field(default=False, metadata={
        "help": "False: the TD error is the advantage (Eq. 2 / 4, the paper); True: normalise each turn's TD errors "
                "in the minibatch to mean 0, std 1 (the authors' released code, CoMLRL)."})
    critic_global_info: bool = field(default=True, metadata={
        "help": "Give the critics, CC and DC, m_t (turn, horizon, last reward / max); true is the paper's (App. E)."})
    actor_ratio_clip: float | None = field(default=None, metadata={
        "help": "Clip c of the actor's whole-response ratio rho to [1 - c, 1 + c]; None (the paper's Eq. 2 / Eq. 4): "
                "no clip."})
    epsilon: float | None = field(default=None, metadata={
        "help": "Deprecated for the actor-critic trainer: the old name of actor_ratio_clip."})
    reward_max: float | None = field(default=None, metadata={
        "help": "Largest reward of one turn, shown in m_t; None: the environment's reward_max."})
    critic_history_turns: int = field(default=-1, metadata={
        "help": "Earlier turns a critic reads before the current observations; -1: all."})
    critic_max_length: int | None = field(default=4096, metadata={
        "help": "Longest critic input in tokens (oldest tokens dropped first); None: no limit."})
    critic_micro_batch_size: int | None = field(default=None, metadata={
        "help": "Critic inputs per forward/backward pass of the value loss; None: per_device_train_batch_size."})
    num_generations: int | None = field(default=1, metadata={"help": "Must be 1: one path per episode."})
    loss_type: str = field(default=RESPONSE_LOSS, metadata={
        "help": "The actor's objective: 'response' (Eq. 2 / Eq. 4: whole-response ratio, summed token log-probs)."})
    learning_rate: float = field(default=5e-6, metadata={"help": "alpha_pi: the actors' learning rate."})

    def __post_init__(self):
        if self.frozen_policies:
            raise ValueError(f"frozen_policies={list(self.frozen_policies)}: CoLLMTrainer trains its critics with every "
                             "agent's transitions and has no frozen partner; the option is MAGRPO's, AT-GRPO's and MHGPO's")
        if self.critic not in CRITIC_MODES:
            raise ValueError(f"critic must be one of {CRITIC_MODES}, got {self.critic!r}")
        if self.num_generations != 1:
            raise ValueError(f"CoLLMTrainer rolls out one path per episode: num_generations must be 1, got "
                             f"{self.num_generations} (K > 1 is MAGRPO's tree; use MAGRPOTrainer)")
        if self.critic_share_adapter and self.critic == "centralized":
            raise ValueError("critic_share_adapter is the parameter-sharing variant of CoLLM-DC; the centralized "
                             "critic reads all agents' histories and cannot share one agent's adapter")
        if self.critic_share_adapter and self.critic_model is not None:
            raise ValueError("critic_share_adapter reads the policy's own base; it cannot be combined with critic_model")
        if self.critic_quantization not in (None, "4bit"):
            raise ValueError(f"critic_quantization must be None or '4bit', got {self.critic_quantization!r}")
        self.check_critic_settings()
        if self.num_minibatches < 1:
            raise ValueError(f"num_minibatches must be at least 1, got {self.num_minibatches}")
        if self.num_minibatches > self.episodes_per_step:
            raise ValueError(f"num_minibatches ({self.num_minibatches}) must not exceed episodes_per_step "
                             f"({self.episodes_per_step}): a buffer may hold one transition per episode")
        if self.reward_max is not None and self.reward_max <= 0:
            raise ValueError(f"reward_max must be positive or None, got {self.reward_max}")
        if self.critic_history_turns < -1:
            raise ValueError(f"critic_history_turns must be -1 (all) or >= 0, got {self.critic_history_turns}")
        if self.critic_max_length is not None and self.critic_max_length < 16:
            raise ValueError(f"critic_max_length must be at least 16 tokens or None, got {self.critic_max_length}")
        if self.critic_micro_batch_size is not None and self.critic_micro_batch_size < 1:
            raise ValueError(f"critic_micro_batch_size must be at least 1 or None, got {self.critic_micro_batch_size}")
        if self.critic_global_info is None:
            raise ValueError("critic_global_info must be true or false (true, the paper's: CC and DC critics read m_t)")
        if self.epsilon is not None:  # the deprecated name of actor_ratio_clip
            warn_once("CoLLMConfig.epsilon is deprecated: the actor's ratio clip is actor_ratio_clip (default "
                      "None, no clip: CoLLM Eq. 2 / Eq. 4); epsilon is read as actor_ratio_clip")
            if self.actor_ratio_clip is not None and self.actor_ratio_clip != self.epsilon:
                raise ValueError(f"epsilon={self.epsilon} (the deprecated name of actor_ratio_clip) and "
                                 f"actor_ratio_clip={self.actor_ratio_clip} disagree; set actor_ratio_clip only")
            self.actor_ratio_clip = self.epsilon
        if self.epsilon_high is not None:
            raise ValueError("epsilon_high is not used by the actor-critic trainer: the actor's ratio clip is the "
                             "symmetric actor_ratio_clip")
        if self.actor_ratio_clip is not None and self.actor_ratio_clip <= 0:
            raise ValueError(f"actor_ratio_clip must be positive or None (no clip), got {self.actor_ratio_clip}")
        self.epsilon = 0.0  # the shared range checks need a number here; the trainer reads actor_ratio_clip only
        super().__post_init__()
        self.epsilon = None  # unused (and a config rebuilt from its fields does not see the alias set)


def actor_ratio_clip_range(clip: float | None) -> float:
    """The ``epsilon`` of :func:`~trl_multiagent.credit.losses.response_policy_loss` for the actor of CoLLM Eq. 2 / Eq. 4.

    ``None`` (the paper's form) gives ``inf``: ``clip(rho, 1 - inf, 1 + inf) = rho``, so the objective is
    ``rho * delta`` and its gradient ``rho * delta * grad log pi(a|h)``, exactly Eq. 2 / Eq. 4 (no clip appears
    there; the authors' public actor minimises ``-log p * delta``, the same gradient at ``rho = 1``). A number ``c``
    clips rho to ``[1 - c, 1 + c]`` (PPO's surrogate; App. C's "advantage clip" value was used that way before)."""
    return math.inf if clip is None else float(clip)


def episode_returns(buffer: EpisodeBuffer, gamma: float) -> None:
    """The Monte-Carlo return ``sum_{tau >= t} gamma^(tau - t) r_tau`` of every transition of ``buffer``
    (:func:`~trl_multiagent.credit.returns.discounted_returns` along each episode), on the transition, its joint
    action and its samples (logged; the critic's regression target in expectation), and the credit's metrics."""
    by_episode: dict[int, list] = {}
    for tr in buffer.transitions:
        by_episode.setdefault(tr.episode, []).append(tr)
    for chain in by_episode.values():
        for tr, ret in zip(chain, discounted_returns([t.reward for t in chain], gamma)):
            tr.ret = ret
            buffer.joint_actions[tr.samples[next(iter(tr.samples))].joint_ids[0]].ret = ret
            for s in tr.samples.values():
                s.ret = ret
    buffer.stats.update(credit_stats(buffer.agents, buffer.samples, buffer.joint_actions))


# ---------------------------------------------------------------------------------------------- critic inputs
def global_info_text(turn: int, num_turns: int, last_reward: float | None, reward_max: float) -> str:
    """m_t, the global information the paper gives its critics (App. E.3): turn, horizon, last reward, its maximum."""
    last = "none yet" if last_reward is None else f"{last_reward:.3g}"
    return (f"[global] This is turn {turn + 1} of a {num_turns}-turn episode. Reward of the previous turn: {last} "
            f"(a turn earns at most {reward_max:g}).")


def prompt_text(prompt: Prompt) -> str:
    """A prompt as plain text (chat messages joined as ``role: content`` lines)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt)


def history_text(agent: str, history: Sequence[tuple[Prompt, str | None]], current_turn: int) -> str:
    """One agent's history ``h_{i,t}`` (its observations and its own responses, oldest first) as critic text."""
    first = current_turn - len(history) + 1
    lines = [f"[{agent}]"]
    for k, (obs, action) in enumerate(history):
        lines.append(f"({agent}, turn {first + k + 1}) observation:\n{prompt_text(obs)}")
        if action is not None:
            lines.append(f"({agent}, turn {first + k + 1}) response:\n{action}")
    return "\n".join(lines)


def critic_input_parts(buffer: EpisodeBuffer, index: int, agents: Sequence[str], history_turns: int | None,
                       reward_max: float | None) -> tuple[str, str]:
    """What a critic reads for transition ``index``, as ``(header, histories)``: the global information m_t (when
    ``reward_max`` is given; else an empty header) and the histories of ``agents`` (all of them for CC, one for DC),
    oldest first, so that the text ends with the current observations, where the value is read."""
    tr = buffer.transitions[index]
    header = "" if reward_max is None else \
        global_info_text(tr.turn, buffer.num_turns, buffer.last_reward(index), reward_max) + "\n\n"
    return header, "\n\n".join(history_text(a, buffer.history(index, a, history_turns), tr.turn) for a in agents)


class CoLLMTrainer(MultiAgentTrainer):
    """Trainer for CoLLM-CC and CoLLM-DC (multi-agent actor-critic with LLM critics).

    Paper: "Learning Decentralized LLM Collaboration with Multi-Agent Actor Critic", Liu et al. (arXiv 2601.21972),
    Algorithm 1 (CC) and Algorithm 2 (DC), Eq. 2-5.

    Args: those of [`MultiAgentTrainer`], with an [`CoLLMConfig`]. Given an already built
    [`AgentPool`], it must hold the critics this configuration asks for (build it with
    ``AgentPool(specs, critics=CoLLMTrainer.critic_specs(specs, args))``).

    Critic names: CC ``critic``; DC ``critic_<agent>``. They are saved and loaded with the adapters
    (``adapters/<critic>/``) and are not needed to run the trained agents.
    """

    _trainer_name = "collm"  # its `trainer:` name (TRAINERS), for the model card
    _tag_names = ["trl", "trl-multiagent", "actor-critic", "collm-cc", "collm-dc"]
    checks_learning_signal = False  # the TD-error advantages are computed in the update (learning_signal.py)
    _name = "CoLLM"
    _paper = {
        "title": "Learning Decentralized LLM Collaboration with Multi-Agent Actor Critic",
        "id": "2601.21972",
        # docstyle-ignore
        "citation": "@article{liu2026collm, title={{Learning Decentralized LLM Collaboration with Multi-Agent Actor "
        "Critic}}, author={Shuo Liu and Tianle Chen and Ryan Amiri and Christopher Amato}, year=2026, "
        "journal={arXiv preprint arXiv:2601.21972}}",
    }

    config_class = CoLLMConfig
    default_evaluator = "episodes"  # CoLLM evaluates its agents' greedy episodes, whatever the task
    summary_fields = ("num_turns", "gamma", "critic", "critic_share_adapter", "critic_global_info", "actor_ratio_clip",
                      "num_iterations", "num_minibatches", "critic_learning_rate", "cliprange_value", "vf_coef",
                      "critic_history_turns", "critic_max_length", "td_error_normalization")

    @property
    def algorithm(self) -> str:
        return "CoLLM-CC" if self.args.critic == "centralized" else "CoLLM-DC"

    def validate_environment(self, probe, agent_names, train_dataset, args: CoLLMConfig) -> None:
        """The Environment protocol, and the reward maximum the critic's global information m_t shows."""
        super().validate_environment(probe, agent_names, train_dataset, args)
        reward_max = args.reward_max if args.reward_max is not None else getattr(probe, "reward_max", None)
        if args.critic_global_info and reward_max is None:
            raise ValueError(f"The critic's global information m_t shows the largest reward of a turn: set reward_max "
                             f"in the config ({type(probe).__name__} has no reward_max attribute)")
        self.reward_max = float(reward_max) if reward_max is not None else None
        self._schedule: list[list[list[int]]] = []

    # ------------------------------------------------------------------------------------------------ set-up
    @staticmethod
    def critic_specs(specs: Sequence[AgentSpec], args: CoLLMConfig,
                     agent_order: Sequence[str] | None = None) -> list[CriticSpec]:
        """The critics of ``args.critic``: one ``critic`` on ``critic_agent``'s base (CC), or ``critic_<agent>`` per
        agent (DC). ``agent_order`` is the environment's order of roles (default: the order of ``specs``)."""
        order = list(agent_order) if agent_order is not None else [s.name for s in specs]
        common = dict(model=args.critic_model, quantization=args.critic_quantization, lora_r=args.critic_lora_r,
                      lora_alpha=args.critic_lora_alpha, lora_dropout=args.critic_lora_dropout)
        if args.critic == "centralized":
            return [CriticSpec("critic", agent=args.critic_agent or order[0], **common)]
        return [CriticSpec(f"critic_{a}", agent=a, share_adapter=args.critic_share_adapter, **common) for a in order]

    def build_critics(self, specs: Sequence[AgentSpec], args: CoLLMConfig) -> list[CriticSpec]:
        return self.critic_specs(specs, args, self.agent_order)

    def build_sampler(self, args: CoLLMConfig) -> SinglePathSampler:
        return SinglePathSampler(num_turns=args.num_turns)

    def assign_credit(self, experience: EpisodeBuffer) -> None:
        """The Monte-Carlo returns of the buffer, logged (:func:`episode_returns`). The actors' advantages are the TD
        errors of Eq. 2 / Eq. 4, ``delta = r + gamma * V(h') - V(h)``: they need the critics' values as the critics
        are when each minibatch is updated, so they are computed in :meth:`update` (:meth:`_critic_update`,
        :func:`~trl_multiagent.credit.collm.td_errors`), not here."""
        episode_returns(experience, self.args.gamma)

    def set_grpo_state(self, args: CoLLMConfig) -> None:
        super().set_grpo_state(args)
        # the actor's ratio clip (Eq. 2 / Eq. 4: none by default), read by the shared whole-response loss
        self.epsilon_low = self.epsilon_high = actor_ratio_clip_range(args.actor_ratio_clip)
        # One rollout serves E passes of M minibatches, one optimizer step each: the shared base re-rolls every
        # `num_iterations` steps and its task sampler repeats each chunk of tasks that often.
        self.num_iterations = args.num_iterations * args.num_minibatches

    @property
    def critic_of(self) -> dict[str, str]:
        """Which critic credits each agent: the one centralized critic, or the agent's own."""
        if self.args.critic == "centralized":
            return {a: "critic" for a in self.agent_order}
        return {a: f"critic_{a}" for a in self.agent_order}

    def critic_parts(self, buffer: EpisodeBuffer, index: int, critic: str) -> tuple[str, str]:
        """What ``critic`` reads for transition ``index``, as ``(m_t header, histories)``: m_t and all agents'
        histories (CC), or one agent's history (with m_t when ``critic_global_info`` is set) (DC)."""
        agents = list(self.agent_order) if self.args.critic == "centralized" else \
            [a for a, c in self.critic_of.items() if c == critic]
        turns = None if self.args.critic_history_turns < 0 else self.args.critic_history_turns
        return critic_input_parts(buffer, index, agents, turns,
                                  self.reward_max if self.args.critic_global_info else None)

    def critic_text(self, buffer: EpisodeBuffer, index: int, critic: str) -> str:
        """:meth:`critic_parts` as one string."""
        return "".join(self.critic_parts(buffer, index, critic))

    # ------------------------------------------------------------------------------------------------ rollout
    @torch.no_grad()
    def rollout(self, tasks) -> EpisodeBuffer:
        """Alg. 1 lines 3-15: single-path episodes with behaviour log-probs; then this buffer's minibatch schedule
        (and, with ``cliprange_value``, every critic's value at rollout time)."""
        buffer = super().rollout(tasks)
        if self.args.cliprange_value is not None:
            for critic in dict.fromkeys(self.critic_of.values()):
                values = self._values(critic, [self.critic_parts(buffer, tr.index, critic) for tr in buffer.transitions],
                                      grad=False)
                for tr, v in zip(buffer.transitions, values.tolist()):
                    tr.old_values[critic] = v
        rng = random.Random(f"{self.args.seed}/{self.state.global_step}/{self.accelerator.process_index}")
        m = self.args.num_minibatches
        self._schedule = []
        for _ in range(self.args.num_iterations):
            order = list(range(len(buffer.transitions)))
            rng.shuffle(order)
            self._schedule.append([order[k::m] for k in range(m)])
        return buffer

    # ------------------------------------------------------------------------------------------------ update
    def update(self, model, experience: Experience) -> torch.Tensor:
        """One minibatch (Alg. 1 lines 17-24): the critics' TD loss, backward once per critic over the minibatch's
        joint transitions; the TD errors become every agent's advantage; then the actors' losses (Eq. 2 / Eq. 4)."""
        if not isinstance(experience, EpisodeBuffer):
            raise TypeError("CoLLMTrainer.update needs the EpisodeBuffer of its own rollout")
        phase = self.state.global_step % self.num_iterations
        epoch, part = divmod(phase, self.args.num_minibatches)
        if epoch >= len(self._schedule):  # resumed mid-cycle on a fresh buffer: start its schedule over
            epoch, part = 0, 0
        transitions = [experience.transitions[k] for k in self._schedule[epoch][part]]
        critic_loss, deltas = self._critic_update(experience, transitions)
        if self.args.td_error_normalization:  # the authors' released code: every turn's TD errors normalised
            for critic, by_index in deltas.items():
                keys = list(by_index)
                normed = normalize_per_turn([by_index[k] for k in keys], [experience.transitions[k].turn for k in keys])
                deltas[critic] = dict(zip(keys, normed.tolist()))
        rows = []
        for tr in transitions:
            for agent, sample in tr.samples.items():
                sample.advantage = deltas[self.critic_of[agent]][tr.index]
                rows.append(sample)
        actor_loss = super().update(model, Experience(rows, [], {}))
        self.log_metric("advantage_abs", sum(abs(s.advantage) for s in rows) / max(len(rows), 1))
        return actor_loss + critic_loss

    def _critic_update(self, buffer: EpisodeBuffer, transitions) -> tuple[torch.Tensor, dict[str, dict[int, float]]]:
        """Eq. 3 / Eq. 5 on one minibatch: ``mean (y - V(h))^2`` per critic, with ``y = r + gamma * V(h')``
        (``V(h')`` under no_grad, no bootstrap where ``done``); backward once per critic. Returns the summed loss
        and each critic's TD errors by transition index."""
        micro = self.args.critic_micro_batch_size or self.args.per_device_train_batch_size
        total = torch.zeros((), device=self.accelerator.device)
        deltas: dict[str, dict[int, float]] = {}
        n = len(transitions)
        for critic in dict.fromkeys(self.critic_of.values()):
            nexts = [tr.next for tr in transitions if not tr.done]
            next_values = dict(zip(nexts, self._values(
                critic, [self.critic_parts(buffer, k, critic) for k in nexts], grad=False).tolist())) if nexts else {}
            values_all, losses = [], []
            for start in range(0, n, micro):
                chunk = transitions[start:start + micro]
                with self.timed("forward"):
                    values = self._values(critic, [self.critic_parts(buffer, tr.index, critic) for tr in chunk],
                                          grad=True)
                targets = td_targets([tr.reward for tr in chunk], [next_values.get(tr.next, 0.0) for tr in chunk],
                                     [tr.done for tr in chunk], self.args.gamma).to(values)
                old = None
                if self.args.cliprange_value is not None:
                    old = torch.tensor([tr.old_values[critic] for tr in chunk], dtype=values.dtype,
                                       device=values.device)
                loss, _ = value_loss(values, targets, old, self.args.cliprange_value)
                loss = loss * (len(chunk) / n)
                with self.timed("backward"):
                    self.accelerator.backward(loss * self.args.vf_coef)
                losses.append(loss.detach())
                values_all.append(values.detach())
            values = torch.cat(values_all)
            delta = td_errors([tr.reward for tr in transitions], values,
                              [next_values.get(tr.next, 0.0) for tr in transitions], [tr.done for tr in transitions],
                              self.args.gamma)
            deltas[critic] = {tr.index: d for tr, d in zip(transitions, delta.tolist())}
            loss = torch.stack(losses).sum()
            total = total + loss * self.args.vf_coef
            returns = torch.tensor([tr.ret for tr in transitions], dtype=values.dtype, device=values.device)
            stats = {"value_loss": loss.item(), "value": values.mean().item(), "target": (delta + values).mean().item(),
                     "td_error": delta.mean().item(), "td_error_abs": delta.abs().mean().item(),
                     "value_error_vs_return": (values - returns).abs().mean().item()}
            for key, value in stats.items():
                self.log_metric(f"critic/{critic}/{key}", value)
            release_freed_memory()
        return total, deltas

    def _critic_ids(self, critic: str, header: str, body: str) -> list[int]:
        """Token ids of a critic input; beyond ``critic_max_length``, the oldest history tokens go (m_t stays)."""
        tok = self.pool.tokenizer_of(critic)
        ids = tok(header + body)["input_ids"]
        limit = self.args.critic_max_length
        if limit is None or len(ids) <= limit:
            return ids
        head = tok(header)["input_ids"] if header else []
        if len(head) >= limit:
            raise ValueError(f"critic_max_length={limit} is shorter than the critic's global information m_t")
        return head + ids[len(ids) - (limit - len(head)):]

    def _values(self, critic: str, texts: list[tuple[str, str]], grad: bool) -> torch.Tensor:
        """``V(h)`` of each ``(header, histories)`` input: the critic's value at its last token, in micro-batches
        (``grad``: keep the graph; only for one micro-batch at a time)."""
        if not texts:
            return torch.zeros(0, device=self.accelerator.device)
        pad = pad_token_id(self.pool.tokenizer_of(critic))
        out = []
        micro = len(texts) if grad else self.args.per_device_train_batch_size
        for start in range(0, len(texts), micro):
            rows = [self._critic_ids(critic, *t) for t in texts[start:start + micro]]
            # left padding: the last column is every row's last token
            ids, mask = left_pad(rows, pad, device=self.accelerator.device)
            with torch.set_grad_enabled(grad):
                out.append(self.pool.values(critic, ids, mask)[:, -1])
        return torch.cat(out)

    # ------------------------------------------------------------------------------------------------ outputs
    def summary(self):
        out = super().summary()
        out["config"]["reward_max"] = self.reward_max
        out["critics"] = sorted(self.pool.critics)
        return out
