"""MAPoRLTrainer: MAPoRL, multi-agent PPO on collaborative debates.

Paper: "MAPoRL: Multi-Agent Post-Co-Training for Collaborative Large Language Models with Reinforcement Learning"
(Park et al., arXiv 2502.18439), Sec. 3 (Def. 1, the multi-agent PPO loss, Tables 1-2), App. E-G.

One training step, top to bottom:

1. rollout (every ``num_iterations x num_minibatches`` steps): the :class:`~trl_multiagent.rollout.DebateSampler`
   plays the debates, every one to its last turn (no early stop in training, ``train_early_stop``), scores every
   answer and runs the App. G checks; then, per agent, one teacher-forced pass each gives the behaviour log-probs
   (adapter on), the reference log-probs (adapter off) and the critic's per-token values (:meth:`sample`);
2. credit (:meth:`assign_credit`): every answer's reward (:func:`debate_rewards`: verifier score -> App. G penalty on
   that score, the first turn's missing box exempt -> reward mode -> incentives), then its token rewards
   ``-kl_coef * (log pi - log pi_ref)`` plus the answer's reward on its last token through GAE(``gae_gamma``,
   ``gae_lambda``) into per-token advantages and value targets, whitened per (turn, agent) (:func:`token_credit`);
3. update, the base's loop on ONE minibatch of the rollout's debates (:meth:`update`; the authors' schedule: each
   PPO epoch shuffles the debates and cuts them into ``num_minibatches`` minibatches, 8 x 4 epochs = 32 optimizer
   steps per rollout by default): TRL's clipped policy loss (``_compute_loss`` with ``(B, T)`` advantages, and
   vLLM's importance-sampling correction with ``use_vllm``) for every policy with its adapter active, and on each
   of its micro-batches the clipped value loss of the answering agents' critics (:meth:`auxiliary_loss`);
4. one optimizer step (one param group per policy and per critic).

Where this follows the authors' released trainer (github.com/chanwoo-park-official/MAPoRL,
``ppov2_trainer_multi_different_model.py``) rather than the paper's text, and how to get the other reading: no early
stop in training (their configs' consensus criterion 1.1; ``train_early_stop``), whitening per (turn, agent)
(``whiten_by="policy"``: all turns together), 8 minibatches x 4 epochs (``num_minibatches=1``: one step per epoch),
no box penalty at the first turn (``first_turn_box_exempt=False``), the incentive tables' R -> W rows
(:func:`~trl_multiagent.credit.maporl.collaboration_incentives`; ``incentive_right_to_wrong=False``).
"""

from __future__ import annotations

import functools
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from trl_multiagent.credit.losses import value_loss
from trl_multiagent.credit.maporl import (
    REWARD_MODES,
    Incentives,
    PenaltySettings,
    collaboration_incentives,
    first_turn_exempt,
    penalized_score,
    token_level_rewards,
    verification_rewards,
)
from trl_multiagent.credit.returns import discounted_returns, gae, whiten_groups
from trl_multiagent.environments.debate import DebateEnv
from trl_multiagent.generation.padding import right_pad_values
from trl_multiagent.rollout import Experience, credit_stats
from trl_multiagent.rollout.debate import DebateSample, DebateSampler
from trl_multiagent.runtime.memory import release_freed_memory
from trl_multiagent.team.critics import CriticSpec
from trl_multiagent.team.pool import AgentPool, AgentSpec
from trl_multiagent.trainers.base import MultiAgentConfig, MultiAgentTrainer
from trl_multiagent.trainers.critic_config import CriticSettings
from trl_multiagent.trainers.micro_batches import prompt_grouped_chunks

logger = logging.getLogger(__name__)

_CLIPPED_LOSSES = ("bnpo", "grpo", "dr_grpo", "dapo")
#: How the token advantages are whitened: per (turn, agent) batch (the authors' trainer) or per policy.
WHITEN_BY = ("turn_agent", "policy")
#: The authors' minibatches per PPO epoch (their configs' ``num_mini_batches``).
AUTHORS_MINIBATCHES = 8


@dataclass
class MAPoRLConfig(CriticSettings, MultiAgentConfig):
    r"""Configuration of [`MAPoRLTrainer`] (MAPoRL). Every [`MultiAgentConfig`] / [`~trl.GRPOConfig`] field keeps
    its meaning; the fields below are added or get new defaults.

    Paper quantities -> fields: n agents = the `AgentSpec` list (the environment's `num_agents`); T turns =
    `num_turns`; gamma of Def. 1 / App. F = `gamma`; alpha0, alpha1, beta0, beta1 of Tables 1-2 = `alpha0`, `alpha1`,
    `beta0`, `beta1`; the KL coefficient of the token reward = `kl_coef`; the value-loss coefficient = `vf_coef`;
    GAE's discount and lambda = `gae_gamma`, `gae_lambda`; the PPO clip = `epsilon`; the value clip =
    `cliprange_value`; PPO epochs per rollout = `num_iterations` (each cut into `num_minibatches` optimizer steps);
    sampling temperature = `temperature`.

    Parameters:
        num_turns (`int`, defaults to `3`):
            T, debate turns.
        train_early_stop (`bool`, defaults to `False`):
            Let a training debate end when the environment says so (a `DebateEnv` with `early_stop` ends once all
            agents agree). Off: every training debate plays all `num_turns` turns, as the authors train (their
            configs set the consensus criterion to 1.1, never met; the paper describes no early stop in training);
            the held-out evaluation keeps the environment's early stop. An early-stopped debate is rewarded over the
            turns it played (the authors' truncation).
        num_minibatches (`int` or `None`, defaults to `None`):
            Minibatches per PPO epoch, each one optimizer step: every epoch shuffles the rollout's debates and cuts
            them into this many parts (the authors' `num_mini_batches`). A rollout then serves `num_iterations *
            num_minibatches` optimizer steps (`max_steps` counts them). `None`: the authors' 8, or one per debate
            when a rollout has fewer than 8 debates (`episodes_per_step * num_generations`).
        num_generations (`int`, defaults to `1`):
            Independent debates rolled out per task.
        gamma (`float`, defaults to `0.3`):
            Discount of later turns' verifier scores in the cumulative and influence-aware rewards (App. F; 0.3 is the
            official code's `rule_discount`).
        reward_mode (`str`, defaults to `"influence"`):
            `"immediate"` (App. F), `"cumulative"` (App. F Eq. 1) or `"influence"` (Def. 1). The cumulative and
            influence-aware rewards are divided by `sum_{t'=t..T} gamma^(t'-t)` (`credit.maporl.cumulative_rewards`,
            `influence_aware_rewards`, as the authors' released trainer).
        alpha0, alpha1, beta0, beta1 (`float`, default `0.0`):
            The collaboration incentives of Tables 1-2 (critical reasoning, persuadability, useful wrong answer,
            persuasiveness).
        verifier (`str`, defaults to `"rule"`):
            `"rule"`: the environment's gold-answer check scores each answer 1 or 0; otherwise the directory of a
            learned verifier saved by `trl_multiagent.verifier.learned.LearnedVerifier.save` (App. E).
        kl_coef (`float`, defaults to `0.002`):
            Coefficient of the per-token KL penalty `-kl_coef * (log pi - log pi_ref)` in the token rewards (the
            reference is the base with the adapter off). `beta` (TRL's KL loss term) must stay 0.
        vf_coef (`float`, defaults to `0.1`):
            Weight of the clipped value loss.
        cliprange_value (`float`, defaults to `0.2`):
            Clip of the value prediction around the rollout's value in the value loss.
        gae_gamma (`float`, defaults to `1.0`):
            Discount between the tokens of one answer in GAE.
        gae_lambda (`float`, defaults to `0.95`):
            GAE's lambda.
        whiten_advantages (`bool`, defaults to `True`):
            Normalise the token advantages to mean 0 and standard deviation 1 per rollout, in the groups of
            `whiten_by`.
        whiten_by (`str`, defaults to `"turn_agent"`):
            `"turn_agent"`: every (turn, agent) batch apart, as the authors' trainer; `"policy"`: all of a policy's
            tokens together (turn 0 at +0.5 and turn 1 at -0.5 become +-0.866 instead of 0).
        value_head_per_turn (`bool`, defaults to `False`):
            Give every agent's critic one value head per turn (`CriticSpec.num_heads = num_turns`).
        critic_share_adapter (`bool`, defaults to `False`):
            The critic reads the hidden states through the agent's policy adapter (only the head is its own) instead
            of its own adapter.
        critic_lora_r (`int` or `None`, defaults to `None`):
            LoRA rank of the critics' adapters (`None`: the agent's `lora_r`).
        critic_learning_rate (`float` or `None`, defaults to `None`):
            Learning rate of the critics (`None`: `learning_rate`).
        penalty_value (`float`, defaults to `-10.0`):
            The verifier score of an answer that triggers an App. G penalty (the paper's value, App. G.2: "a verifier
            score of -10"); it replaces `s(q, y)` before the reward mode, so it enters every cumulative and
            influence-aware sum the answer's score is part of (`credit.maporl.penalized_score`).
        first_turn_box_exempt (`bool`, defaults to `True`):
            Collaboration training as the authors' trainer runs it: first-turn answers are not penalised for a
            missing `\boxed{}` (`credit.maporl.first_turn_exempt`); `False`: every turn (App. G.2's text).
        incentive_right_to_wrong (`bool`, defaults to `True`):
            Tables 1-2's R -> W rows subtract the mirrored incentive (`credit.maporl.collaboration_incentives`
            says why); `False`: they give nothing.
        penalize_no_boxed, penalize_no_eos, penalize_repetition, penalize_post_boxed (`bool`, default `True`):
            Switch each App. G penalty on or off: no `\boxed{}` answer, no EOS (cut at `max_completion_length`), a
            token n-gram repeated more than `max_repeats` times in a row (numbers exempt), text after the box.
        min_response_tokens (`int`, defaults to `50`):
            Answers shorter than this many tokens are penalised (App. G.3); 0 disables.
        max_repeats (`int`, defaults to `3`), max_repeat_ngram (`int`, defaults to `5`):
            The repetition check: the longest allowed run and the longest n-gram checked.

    Notes:
        `loss_type` defaults to `"bnpo"` (the policy loss is a mean over all tokens, as PPO's); `grpo`, `dr_grpo` and
        `dapo` also work. `num_iterations` defaults to 4 (the paper's four PPO epochs per rollout); every PPO epoch
        is `num_minibatches` optimizer steps, each over its minibatch's debates in micro-batches of
        `per_device_train_batch_size`.
    """

    min_generations: ClassVar[int] = 1

    num_turns: int = field(default=3, metadata={"help": "T: debate turns (every one played in training)."})
    train_early_stop: bool = field(default=False, metadata={
        "help": "End a training debate when the environment says so (all agents agree); off: every debate plays "
                "all turns, as the authors train (the evaluation still stops early)."})
    num_minibatches: int | None = field(default=None, metadata={
        "help": "Minibatches (optimizer steps) per PPO epoch, debates reshuffled every epoch (the authors' "
                "num_mini_batches); None: 8, or one per debate when a rollout has fewer."})
    num_generations: int | None = field(default=1, metadata={"help": "Independent debates per task."})
    gamma: float = field(default=0.3, metadata={"help": "Discount of later turns' scores in the reward modes."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature (the paper: 0.7)."})
    num_iterations: int = field(default=4, metadata={
        "help": "PPO epochs per rollout (the paper's 4), each num_minibatches optimizer steps."})
    loss_type: str = field(default="bnpo", metadata={"help": "Policy-loss aggregation: bnpo (token mean), grpo, "
                                                             "dr_grpo or dapo."})
    reward_mode: str = field(default="influence", metadata={
        "help": "'immediate', 'cumulative' (App. F Eq. 1) or 'influence' (Def. 1)."})
    alpha0: float = field(default=0.0, metadata={"help": "Table 1: own W->R revision, majority wrong at t."})
    alpha1: float = field(default=0.0, metadata={"help": "Table 1: own W->R revision, majority right at t."})
    beta0: float = field(default=0.0, metadata={"help": "Table 2: majority W->R after the agent's wrong answer."})
    beta1: float = field(default=0.0, metadata={"help": "Table 2: majority W->R after the agent's right answer."})
    verifier: str = field(default="rule", metadata={
        "help": "'rule' (gold-answer check) or the directory of a saved learned verifier (App. E)."})
    kl_coef: float = field(default=0.002, metadata={"help": "Per-token KL penalty in the token rewards."})
    vf_coef: float = field(default=0.1, metadata={"help": "Weight of the clipped value loss."})
    cliprange_value: float | None = field(default=0.2, metadata={
        "help": "Value clip around the rollout's values; None: no clip."})
    gae_gamma: float = field(default=1.0, metadata={"help": "GAE discount between the tokens of one answer."})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda."})
    whiten_advantages: bool = field(default=True, metadata={"help": "Normalise the token advantages (whiten_by)."})
    whiten_by: str = field(default="turn_agent", metadata={
        "help": "'turn_agent': whiten every (turn, agent) batch apart (the authors' trainer); 'policy': all of a "
                "policy's tokens together."})
    first_turn_box_exempt: bool = field(default=True, metadata={
        "help": "No missing-box penalty at the first turn (the authors' collaboration training); False: every turn."})
    incentive_right_to_wrong: bool = field(default=True, metadata={
        "help": "Tables 1-2's R->W rows subtract the mirrored incentive (the paper's '-' cells); False: nothing."})
    value_head_per_turn: bool = field(default=False, metadata={"help": "One value head per turn in every critic."})
    penalty_value: float = field(default=-10.0, metadata={
        "help": "Verifier score of an answer hit by an App. G penalty (the paper's -10); it enters the reward sums."})
    penalize_no_boxed: bool = field(default=True, metadata={"help": "Penalise answers without \\boxed{}."})
    penalize_no_eos: bool = field(default=True, metadata={"help": "Penalise answers cut at the length limit."})
    min_response_tokens: int = field(default=50, metadata={"help": "Penalise shorter answers (0 disables)."})
    penalize_repetition: bool = field(default=True, metadata={"help": "Penalise repeated token runs."})
    max_repeats: int = field(default=3, metadata={"help": "Longest allowed run of one n-gram."})
    max_repeat_ngram: int = field(default=5, metadata={"help": "Longest n-gram the repetition check looks at."})
    penalize_post_boxed: bool = field(default=True, metadata={"help": "Penalise text after the final \\boxed{}."})

    def __post_init__(self):
        if self.frozen_policies:
            raise ValueError(f"frozen_policies={list(self.frozen_policies)}: MAPoRLTrainer trains its critics with every "
                             "agent's transitions and has no frozen partner; the option is MAGRPO's, AT-GRPO's and MHGPO's")
        if self.reward_mode not in REWARD_MODES:
            raise ValueError(f"reward_mode must be one of {REWARD_MODES}, got {self.reward_mode!r}")
        if self.loss_type not in _CLIPPED_LOSSES:
            raise ValueError(f"loss_type must be one of {_CLIPPED_LOSSES} for MAPoRLTrainer (a clipped PPO "
                             f"surrogate), got {self.loss_type!r}")
        if self.beta != 0.0:
            raise ValueError("MAPoRL puts the KL penalty into the per-token rewards (kl_coef); beta (TRL's KL loss "
                             "term) must be 0")
        if self.num_generations is None or self.num_generations < 1:
            raise ValueError(f"num_generations (debates per task) must be at least 1, got {self.num_generations}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        self.check_critic_settings()
        for name in ("gae_gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.min_response_tokens < 0 or self.max_repeats < 1 or self.max_repeat_ngram < 1:
            raise ValueError("min_response_tokens must be >= 0, max_repeats and max_repeat_ngram >= 1")
        if not self.verifier:
            raise ValueError("verifier must be 'rule' or the directory of a saved learned verifier")
        if self.whiten_by not in WHITEN_BY:
            raise ValueError(f"whiten_by must be one of {WHITEN_BY}, got {self.whiten_by!r}")
        debates = self.episodes_per_step * self.num_generations
        if self.num_minibatches is None:
            self.num_minibatches = min(AUTHORS_MINIBATCHES, max(debates, 1))
        elif not 1 <= self.num_minibatches <= debates:
            raise ValueError(f"num_minibatches must be between 1 and the debates of a rollout (episodes_per_step x "
                             f"num_generations = {debates}), got {self.num_minibatches}: a minibatch holds whole "
                             "debates")
        super().__post_init__()

    @property
    def incentives(self) -> Incentives:
        return Incentives(self.alpha0, self.alpha1, self.beta0, self.beta1, self.incentive_right_to_wrong)

    @property
    def penalty_settings(self) -> PenaltySettings | None:
        """The App. G checks as configured; ``None`` when every one is off."""
        settings = PenaltySettings(value=self.penalty_value, no_boxed=self.penalize_no_boxed,
                                   no_eos=self.penalize_no_eos, min_tokens=self.min_response_tokens,
                                   repetition=self.penalize_repetition, max_repeats=self.max_repeats,
                                   max_ngram=self.max_repeat_ngram, post_boxed=self.penalize_post_boxed)
        return settings if settings.enabled else None


class MAPoRLTrainer(MultiAgentTrainer):
    """Trainer for MAPoRL: multi-agent PPO with GAE on collaborative debates, verifier rewards and incentives.

    Paper: "MAPoRL: Multi-Agent Post-Co-Training for Collaborative Large Language Models with Reinforcement
    Learning", Park et al. (arXiv 2502.18439), Sec. 3, Tables 1-2, App. E-G.

    Every agent acts with its own policy (a (Q)LoRA adapter; agents on one base share that base, agents naming other
    models bring their own) and has its own critic ``<agent>_value``: a value head on an adapter of the agent's base
    (:mod:`trl_multiagent.team.critics`; one head per turn with ``value_head_per_turn``). The critic reads the same
    sequence as the policy (the agent's prompt with the debate so far, then its answer; App. G Remark 4).

    Args:
        agents: the team ([`AgentSpec`] list, or an [`AgentPool`] that already holds the critics ``<agent>_value``).
        environment: factory of the debate environment (e.g. `MathDebateEnv`, `NLIDebateEnv`), or any environment
            whose steps give every agent a local reward (e.g. `CollaborationGameEnv`).
        args: a [`MAPoRLConfig`].
        train_dataset: one row per task.
        callbacks: extra `transformers.TrainerCallback` objects.
    """

    _trainer_name = "maporl"  # its `trainer:` name (TRAINERS), for the model card
    _tag_names = ["trl", "trl-multiagent", "maporl", "ppo"]
    checks_learning_signal = False  # the advantages are per token (GAE), not Sample.advantage (learning_signal.py)
    _name = "MAPoRL"
    _paper = {
        "title": "MAPoRL: Multi-Agent Post-Co-Training for Collaborative Large Language Models with Reinforcement "
                 "Learning",
        "id": "2502.18439",
        # docstyle-ignore
        "citation": "@article{park2025maporl, title={{MAPoRL: Multi-Agent Post-Co-Training for Collaborative Large "
        "Language Models with Reinforcement Learning}}, author={Chanwoo Park and Seungju Han and Xingzhi Guo and "
        "Asuman Ozdaglar and Kaiqing Zhang and Joo-Kyung Kim}, year=2025, journal={arXiv preprint arXiv:2502.18439}}",
    }

    config_class = MAPoRLConfig
    evaluate_sampled = True  # Sec. 4.1: majority vote over answers sampled at the training temperature
    algorithm = "MAPoRL"
    summary_fields = ("num_turns", "gamma", "reward_mode", "alpha0", "alpha1", "beta0", "beta1", "verifier", "kl_coef",
                      "vf_coef", "gae_gamma", "gae_lambda", "num_iterations", "num_minibatches", "train_early_stop",
                      "whiten_by", "first_turn_box_exempt", "incentive_right_to_wrong")

    def validate_environment(self, probe, agent_names, train_dataset, args: MAPoRLConfig) -> None:
        """The Environment protocol; incentives and a learned verifier need a debate environment; a learned verifier
        must be a saved one."""
        super().validate_environment(probe, agent_names, train_dataset, args)
        if (args.incentives.active or args.verifier != "rule") and not isinstance(probe, DebateEnv):
            raise ValueError(f"{type(probe).__name__} is not a DebateEnv: collaboration incentives and a learned "
                             "verifier need a debate environment (its gold answers and questions)")
        if args.verifier != "rule":
            from trl_multiagent.verifier.learned import LearnedVerifier

            LearnedVerifier.check_saved(args.verifier)
        self.verifier_model = None

    def check_pool(self, pool: AgentPool, args: MAPoRLConfig) -> None:
        """A given pool holds every agent's critic, with a head per turn when ``value_head_per_turn``."""
        super().check_pool(pool, args)
        heads = args.num_turns if args.value_head_per_turn else 1
        wrong = [c for c in (self.critic_name(a) for a in pool.agent_names) if pool.critics[c].spec.num_heads < heads]
        if wrong:
            raise ValueError(f"Critics {wrong} have fewer than {heads} value heads (value_head_per_turn)")

    # ------------------------------------------------------------------------------------------------ set-up
    @staticmethod
    def critic_name(agent: str) -> str:
        """The critic (value model) of ``agent``."""
        return f"{agent}_value"

    def build_critics(self, specs: Sequence[AgentSpec], args: MAPoRLConfig) -> list[CriticSpec]:
        """One critic per agent on that agent's base: its own LoRA adapter (or the policy's with
        ``critic_share_adapter``) and one value head, or one per turn with ``value_head_per_turn``."""
        critics = []
        for spec in specs:
            rank = args.critic_lora_r or spec.lora_r
            critics.append(CriticSpec(self.critic_name(spec.name), agent=spec.name,
                                      share_adapter=args.critic_share_adapter, lora_r=rank, lora_alpha=2 * rank,
                                      lora_dropout=spec.lora_dropout, lora_target_modules=spec.lora_target_modules,
                                      num_heads=args.num_turns if args.value_head_per_turn else 1))
        return critics

    def build_sampler(self, args: MAPoRLConfig) -> DebateSampler:
        """The debate sampler with the configured App. G checks and verifier."""
        scorer = None
        if args.verifier != "rule":
            from trl_multiagent.verifier.learned import LearnedVerifier

            self.verifier_model = LearnedVerifier.load(args.verifier, dtype=args.model_dtype)
            scorer = self.verifier_model.score
        return DebateSampler(num_turns=args.num_turns, num_debates=args.num_generations,
                             penalties=args.penalty_settings, scorer=scorer, early_stop=args.train_early_stop)

    def set_grpo_state(self, args: MAPoRLConfig) -> None:
        super().set_grpo_state(args)
        # One rollout serves E epochs of M minibatches, one optimizer step each: the shared base re-rolls every
        # `num_iterations` steps and its task sampler repeats each chunk of tasks that often.
        self.num_iterations = args.num_iterations * args.num_minibatches

    # ------------------------------------------------------------------------------------------------ rollout
    @torch.no_grad()
    def sample(self, tasks) -> Experience:
        """The debates, then what MAPoRL's credit reads of the models at rollout time: per agent, every answer's
        behaviour log-probs (adapter on), reference log-probs (adapter off) and its critic's per-token values."""
        experience = super().sample(tasks)
        for agent in self.pool.agent_names:
            policy = self.pool.policy_of(agent)
            rows = [s for s in experience.samples if s.agent == agent]
            for chunk in prompt_grouped_chunks(rows, self.args.per_device_train_batch_size):
                batch = self.collate(policy, chunk)
                with self.timed("logprob_forwards"):
                    logps = self.logps(functools.partial(self.pool, policy), batch)
                    with self.pool.reference(policy) as ref_model:
                        ref_logps = self.logps(ref_model, batch)
                    chunk_values = self._completion_values(agent, batch, chunk)
                for s, lp, rp, v, m in zip(chunk, logps, ref_logps, chunk_values, batch["completion_mask"]):
                    keep = m.bool()
                    s.old_logps, s.ref_logps, s.old_values = lp[keep].tolist(), rp[keep].tolist(), v[keep].tolist()
        release_freed_memory()
        return experience

    def assign_credit(self, experience: Experience) -> None:
        """Every answer's reward (:func:`debate_rewards`: App. G penalties, reward mode, Tables 1-2 incentives), then
        its token rewards and GAE with the rollout's values (:func:`token_credit`)."""
        args = self.args
        debate_rewards(experience, args.num_turns, args.reward_mode, args.gamma, args.incentives, args.penalty_value,
                       args.first_turn_box_exempt)
        token_credit(experience, args.kl_coef, args.gae_gamma, args.gae_lambda, args.whiten_advantages,
                     agents=self.pool.agent_names, whiten_by=args.whiten_by)

    def _completion_values(self, agent: str, batch: dict[str, torch.Tensor],
                           samples: Sequence[DebateSample]) -> torch.Tensor:
        """``(B, C)``: the critic's value of the state before each completion token (the last prompt token's hidden
        state for the first one), with the head of each sample's turn when the critic has one per turn."""
        head = torch.tensor([s.turn for s in samples]) if self.args.value_head_per_turn else None
        return self.pool.completion_values(self.critic_name(agent), batch["prompt_ids"], batch["prompt_mask"],
                                           batch["completion_ids"], batch["completion_mask"], head=head,
                                           share_prompts=self.share_prompt_prefixes).float()

    def collate(self, policy: str, samples) -> dict[str, torch.Tensor]:
        """The base batch, with the per-token advantages, value targets and rollout values once GAE has run."""
        batch = super().collate(policy, samples)
        if samples and all(getattr(s, "token_advantages", None) is not None for s in samples):
            width = batch["completion_ids"].size(1)
            for key, attr in (("advantages", "token_advantages"), ("returns", "token_returns"),
                              ("old_values", "old_values")):
                batch[key] = right_pad_values([getattr(s, attr) for s in samples], width,
                                              device=self.accelerator.device)
        return batch

    # ------------------------------------------------------------------------------------------------ update
    @torch.no_grad()
    def rollout(self, tasks) -> Experience:
        """The base's rollout and credit, then this rollout's minibatch schedule (:func:`minibatch_schedule`)."""
        experience = super().rollout(tasks)
        rng = random.Random(f"{self.args.seed}/{self.state.global_step}/{self.accelerator.process_index}")
        episodes = sorted({s.episode for s in experience.samples})
        self._schedule = minibatch_schedule(episodes, self.args.num_minibatches, self.args.num_iterations, rng)
        return experience

    def update(self, model, experience: Experience) -> torch.Tensor:
        """The base's update on one minibatch of the rollout's debates: step ``k`` of a rollout's cycle is epoch
        ``k // num_minibatches``, minibatch ``k % num_minibatches`` of :meth:`rollout`'s schedule."""
        schedule = getattr(self, "_schedule", None)
        if self.args.num_minibatches == 1 or not schedule:
            return super().update(model, experience)
        epoch, part = divmod(self.state.global_step % self.num_iterations, self.args.num_minibatches)
        if epoch >= len(schedule):  # resumed mid-cycle on a fresh rollout: start its schedule over
            epoch, part = 0, 0
        chosen = set(schedule[epoch][part])
        rows = [s for s in experience.samples if s.episode in chosen]
        joints = [j for j in experience.joint_actions if j.episode in chosen]
        return super().update(model, Experience(rows, joints, {}, experience.agents))

    def auxiliary_loss(self, model, policy: str, chunk: Sequence[DebateSample], batch: dict[str, torch.Tensor],
                       experience: Experience) -> torch.Tensor:
        """The critics' value loss on one micro-batch of the base's update loop: for each agent answering in
        ``chunk``, PPO's clipped value loss with its conventional 1/2 (Sec. 3.2) over its rows' tokens, weighted by
        their share of the agent's completion tokens in the rollout, times ``vf_coef``."""
        total = None
        for agent in dict.fromkeys(s.agent for s in chunk):
            rows = [i for i, s in enumerate(chunk) if s.agent == agent]
            part = batch if len(rows) == len(chunk) else {k: batch[k][rows] for k in _VALUE_INPUTS}
            n_tokens = sum(len(s.generation.completion_ids) for s in experience.samples if s.agent == agent)
            with self.timed("forward"):
                predicted = self._completion_values(agent, part, [chunk[i] for i in rows])
                loss, stats = value_loss(predicted, part["returns"], part["old_values"], self.args.cliprange_value,
                                         mask=part["completion_mask"])
            loss = 0.5 * loss
            self.log_metric("value_loss", loss.item())
            self.log_metric("value_clipfrac", stats["clip_fraction"].item())
            term = self.args.vf_coef * loss * (part["completion_mask"].sum().item() / max(n_tokens, 1))
            total = term if total is None else total + term
        return total


#: The batch entries the value loss reads.
_VALUE_INPUTS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "returns", "old_values")


def minibatch_schedule(items: Sequence, num_minibatches: int, num_epochs: int, rng: random.Random) -> list[list[list]]:
    """The authors' PPO schedule over one rollout: for each of ``num_epochs`` epochs a fresh random order of
    ``items`` (their ``b_inds = np.random.permutation(local_batch_size)``), cut into ``num_minibatches`` consecutive
    minibatches whose sizes differ by at most one (theirs are equal: ``num_mini_batches`` divides their batch).
    ``schedule[epoch][k]`` is minibatch ``k`` of ``epoch``; every epoch is a partition of ``items`` (with fewer items
    than minibatches, e.g. a short last batch of tasks, the last minibatches are empty: their steps update nothing)."""
    if num_minibatches < 1 or num_epochs < 1:
        raise ValueError(f"{num_minibatches} minibatches of {len(items)} items over {num_epochs} epochs")
    schedule = []
    for _ in range(num_epochs):
        order = list(items)
        rng.shuffle(order)
        size, extra = divmod(len(order), num_minibatches)
        bounds = [k * size + min(k, extra) for k in range(num_minibatches + 1)]
        schedule.append([order[bounds[k]:bounds[k + 1]] for k in range(num_minibatches)])
    return schedule


# ---------------------------------------------------------------------------------------------------- credit
def debate_rewards(experience: Experience, num_turns: int, reward_mode: str, gamma: float,
                   incentives: Incentives | None = None, penalty_value: float = -10.0,
                   first_turn_box_exempt: bool = True) -> None:
    """MAPoRL's reward of every answer of a :class:`~trl_multiagent.rollout.DebateSampler` rollout, written onto its
    samples (``base_reward``, ``incentive``, ``reward`` = ``ret`` = their sum), debate by debate:

    1. an answer that triggered an App. G check gets the verifier score ``penalty_value`` (App. G.2,
       :func:`~trl_multiagent.credit.maporl.penalized_score`) BEFORE the reward mode aggregates the scores, so the
       penalty also lowers the cumulative and influence-aware rewards the answer's score enters; with
       ``first_turn_box_exempt`` a first-turn answer's missing box does not count
       (:func:`~trl_multiagent.credit.maporl.first_turn_exempt`, the authors' collaboration training);
    2. the reward mode (``"immediate"``, ``"cumulative"`` or ``"influence"``, App. F / Def. 1,
       :func:`~trl_multiagent.credit.maporl.verification_rewards`) over the turns the debate played: all
       ``num_turns`` of them in training (no early stop), fewer only if the debate stopped early, whose rewards are
       then those of the played turns alone, as the authors' ``score_rule`` truncates (scores [1] and [0] stopping
       at turn 1 reward agent 1 with 1.0, not the 0.8597 of its score repeated over 3 turns with gamma 0.3);
    3. plus the collaboration incentives of Tables 1-2 (:func:`~trl_multiagent.credit.maporl.collaboration_incentives`)
       over the played turns, which need every answer's group and correctness (a debate environment).

    The joint actions' returns are the team's per-turn results summed from each turn on; the credit's metrics
    (``incentive`` among them) go to ``experience.stats``.
    """
    incentives = incentives or Incentives()
    for rows in _by_debate(experience.samples):
        agents = list(dict.fromkeys(s.agent for s in rows))
        cell = {(s.agent, s.turn): s for s in rows}
        played = 1 + max(s.turn for s in rows)
        if played > num_turns:
            raise ValueError(f"a debate played {played} turns, more than num_turns={num_turns}")
        grid = [[cell[(a, t)] for t in range(played)] for a in agents]
        scores = [[penalized_score(s.score, first_turn_exempt(s.penalties, s.turn, first_turn_box_exempt),
                                   penalty_value) for s in row] for row in grid]
        base = verification_rewards(scores, reward_mode, gamma)
        incentive = [[0.0] * played for _ in agents]
        if incentives.active:
            if any(s.correct is None for s in rows):
                raise ValueError("collaboration incentives need a debate environment that knows which answers are "
                                 "right; the rollout's environment is not a DebateEnv")
            incentive = collaboration_incentives([[s.answer_group for s in row] for row in grid],
                                                 [[s.correct for s in row] for row in grid], incentives)
        for i, row in enumerate(grid):
            for t, s in enumerate(row):
                s.base_reward, s.incentive = base[i][t], incentive[i][t]
                s.reward = s.ret = base[i][t] + incentive[i][t]
    for joints in _by_debate(experience.joint_actions):  # the team's return: its per-turn results from this turn on
        joints = sorted(joints, key=lambda j: j.turn)
        for j, ret in zip(joints, discounted_returns([j.reward for j in joints], 1.0)):
            j.ret = ret
    experience.stats.update(credit_stats(experience.agents, experience.samples, experience.joint_actions))
    experience.stats["incentive"] = _mean(s.incentive for s in experience.samples)


def token_credit(experience: Experience, kl_coef: float, gae_gamma: float, gae_lambda: float, whiten_advantages: bool,
                 agents: Sequence[str] | None = None, whiten_by: str = "turn_agent") -> None:
    """MAPoRL's token-level credit (Sec. 3.2) of answers that carry their rollout-time log-probs, reference log-probs
    and critic values: the token rewards ``-kl_coef * (log pi - log pi_ref)`` plus the answer's reward on its last
    token (:func:`~trl_multiagent.credit.maporl.token_level_rewards`) through GAE
    (:func:`~trl_multiagent.credit.returns.gae`) into per-token advantages and value targets; with
    ``whiten_advantages`` the token advantages are normalised per (turn, agent) batch (``whiten_by="turn_agent"``,
    the authors' trainer) or per policy (``"policy"``), :func:`~trl_multiagent.credit.returns.whiten_groups`. Logs
    the summed KL per answer, the values and the value targets (``kl``, ``value_mean``, ``returns_mean``;
    ``agents`` is the order they are summed in)."""
    if whiten_by not in WHITEN_BY:
        raise ValueError(f"whiten_by must be one of {WHITEN_BY}, got {whiten_by!r}")
    kls, values, returns = [], [], []
    for agent in agents if agents is not None else experience.agents:
        for s in (s for s in experience.samples if s.agent == agent):
            rewards = token_level_rewards(s.old_logps, s.ref_logps, s.reward, kl_coef)
            s.token_advantages, s.token_returns = gae(rewards, s.old_values, gae_gamma, gae_lambda)
            kls.append(sum(a - b for a, b in zip(s.old_logps, s.ref_logps)))
            values.extend(s.old_values)
            returns.extend(s.token_returns)
    if whiten_advantages:
        rows = experience.samples
        keys = [(s.turn, s.agent) if whiten_by == "turn_agent" else s.policy for s in rows]
        for s, adv in zip(rows, whiten_groups([s.token_advantages for s in rows], keys)):
            s.token_advantages = adv
    experience.stats.update({"kl": _mean(kls), "value_mean": _mean(values), "returns_mean": _mean(returns)})


def _by_debate(items: Sequence) -> list[list]:
    """Samples or joint actions grouped by debate (their ``episode``), in order."""
    debates: dict[int, list] = {}
    for item in items:
        debates.setdefault(item.episode, []).append(item)
    return list(debates.values())


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan
