"""MultiAgentGRPOTrainer: MAGRPO, and the shared base of every trainer in trl-multiagent.

Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning" (MAGRPO), Algorithm 1, Eq. 1-2.

One training step, top to bottom (``training_step``):

1. rollout: the sampler (:class:`~trl_multiagent.rollout.JointTreeSampler`) expands a tree per task: at every node
   each agent samples K responses, the joint actions get the joint reward from the environment, and the returns and
   group-relative advantages (Eq. 1) come from :mod:`trl_multiagent.credit`;
2. update: for every policy, with its adapter active, TRL's own clipped-ratio loss (Eq. 2, ``GRPOTrainer._compute_loss``)
   on that policy's samples, plus ``beta`` * KL to the reference = the same base with the adapter disabled;
3. one optimizer step: one optimizer, one param group per policy, each with its own learning rate.

Later trainers subclass this class and replace the sampler (``build_sampler``) or the credit assignment.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate.utils import set_seed
from datasets import Dataset
from transformers import GenerationConfig, ProgressCallback, Trainer, enable_full_determinism
from transformers.trainer_utils import TrainOutput
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import RepeatSampler, identity

from ..agents import AgentPool, AgentSpec, check_team
from ..environments.base import Environment
from ..losses import RESPONSE_LOSS, response_policy_loss
from ..models import context_length
from ..rollout import AgentTurnSampler, Experience, JointTreeSampler, Sample
from ..utils import release_freed_memory, set_cpu_mmap_threshold
from .callbacks import MetricsFileCallback
from .outputs import check_checkpoint, check_output_dir, write_run_status

logger = logging.getLogger(__name__)

#: Loss types whose per-policy loss is a mean over sequences / over tokens / a sum over a global token count.
_ROW_MEAN_LOSSES = {"grpo", "dr_grpo", "sapo", "luspo"}
_TOKEN_MEAN_LOSSES = {"bnpo"}
_TOKEN_SUM_LOSSES = {"dapo", "cispo", "vespo"}


#: TRL's loss types (``GRPOConfig.loss_type``), all selectable by name next to ``"response"``.
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def check_loss_settings(config) -> None:
    """``loss_type`` names a known objective, and the whole-response objective gets no per-token option it ignores."""
    if config.loss_type != RESPONSE_LOSS and config.loss_type not in TRL_LOSS_TYPES:
        raise ValueError(f"loss_type must be {RESPONSE_LOSS!r} or one of TRL's {list(TRL_LOSS_TYPES)}, got "
                         f"{config.loss_type!r}")
    if config.loss_type == RESPONSE_LOSS:
        per_token = {"entropy_coef": config.entropy_coef != 0.0, "use_adaptive_entropy": config.use_adaptive_entropy,
                     "top_entropy_quantile": config.top_entropy_quantile < 1.0,
                     "off_policy_mask_threshold": config.off_policy_mask_threshold is not None}
        used = [name for name, on in per_token.items() if on]
        if used:
            raise ValueError(f"{used[0]} is a per-token option of TRL's losses; the whole-response objective "
                             f"(loss_type={RESPONSE_LOSS!r}) does not use it. Unset it or choose a TRL loss_type.")


def check_common_values(config) -> None:
    """Values every multi-agent config needs in range, checked before GRPOConfig's own checks (some of which would
    otherwise fail with a ZeroDivisionError or only when the model samples)."""
    def need(ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise ValueError(f"{name} must be {rule}, got {getattr(config, name)!r}")

    need(isinstance(config.num_generations, int) and config.num_generations >= 2, "num_generations",
         "an integer >= 2 (K: a group of one sample has advantage 0, so it teaches nothing)")
    need(config.per_device_train_batch_size >= 1, "per_device_train_batch_size", "at least 1 (samples per micro-batch)")
    need(config.temperature > 0, "temperature", "> 0 (training samples; use a small value for near-greedy)")
    need(config.top_p is None or 0 < config.top_p <= 1, "top_p", "in (0, 1]")
    need(config.top_k is None or config.top_k >= 0, "top_k", ">= 0 (0 disables it)")
    need(config.max_completion_length is not None and config.max_completion_length >= 1, "max_completion_length",
         "at least 1 token")
    need(config.learning_rate > 0, "learning_rate", "> 0")
    need(config.beta >= 0, "beta", ">= 0")
    need(config.epsilon >= 0 and (config.epsilon_high is None or config.epsilon_high >= 0), "epsilon", ">= 0")
    need(config.num_iterations >= 1, "num_iterations", "at least 1")
    need(config.max_grad_norm is None or config.max_grad_norm >= 0, "max_grad_norm", ">= 0 (0 disables clipping)")
    need(config.logging_steps > 0, "logging_steps", "> 0")


@dataclass
class MultiAgentGRPOConfig(GRPOConfig):
    r"""Configuration of [`MultiAgentGRPOTrainer`] (MAGRPO). Every [`~trl.GRPOConfig`] field keeps its meaning;
    the fields below are added or re-read for a team.

    Paper quantities -> fields: K (samples per agent per node) = `num_generations`; H (turns) = `num_turns`;
    gamma = `gamma`; epsilon (clip) = `epsilon` / `epsilon_high`; beta (KL) = `beta`; sampling temperature and top-p
    = `temperature` / `top_p`; learning rate alpha = `learning_rate` (or the agent's own `AgentSpec.learning_rate`).

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
        episodes_per_step (`int`, defaults to `1`):
            Tasks (dataset rows) each process rolls out per optimizer step. Every sample of those episodes goes into
            that one optimizer step.
        model_dtype (`str`, defaults to `"auto"`):
            Weights dtype of full-precision bases: `"auto"` (bfloat16 on CUDA, float32 on CPU), `"float32"`,
            `"bfloat16"` or `"float16"`.
        cpu_malloc_mmap_threshold (`int`, defaults to `131072`):
            On CPU, pin glibc's mmap threshold to this many bytes for the training process, so that freed activation
            buffers go back to the OS instead of fragmenting the heap (a team of n policies on one shared base then
            stays close to one agent's peak memory; see `utils.set_cpu_mmap_threshold`). Generation runs with a
            32 MiB threshold and restores this one after (`utils.generation_mmap_threshold`). `0` keeps glibc's
            dynamic default; ignored on CUDA and when the environment variable `MALLOC_MMAP_THRESHOLD_` is set.

    Notes:
        `per_device_train_batch_size` is the micro-batch (samples per forward/backward pass) of the update;
        `gradient_accumulation_steps` and `steps_per_generation` must stay 1 (use `episodes_per_step`).
        `num_iterations` (mu) reuses one rollout for that many optimizer steps, as in TRL.
    """

    grouping: str = field(default="joint", metadata={
        "help": "'joint': MAGRPO's groups of joint actions at one tree node; 'agent_turn': AT-GRPO's groups keyed "
                "(environment instance, turn, agent) with greedy execution of the best candidate."})
    agent_order: str = field(default="sequential", metadata={
        "help": "AT-GRPO: 'sequential' (each agent sees the earlier agents' executed actions) or 'parallel'."})
    alpha: float = field(default=1.0, metadata={"help": "AT-GRPO Eq. 3: r = alpha * team reward + local reward."})
    drop_zero_std_groups: bool = field(default=False, metadata={
        "help": "AT-GRPO: leave groups whose candidates all tie out of the update (counted in the metrics)."})
    num_turns: int = field(default=1, metadata={"help": "Horizon H: turns of the rollout tree."})
    joint_mode: str = field(default="aligned", metadata={"help": "'aligned' (K joint actions) or 'cross' (K**n)."})
    gamma: float = field(default=1.0, metadata={"help": "Discount of later turns' rewards."})
    episodes_per_step: int = field(default=1, metadata={"help": "Tasks rolled out per process per optimizer step."})
    model_dtype: str = field(default="auto", metadata={"help": "'auto', 'float32', 'bfloat16' or 'float16'."})
    cpu_malloc_mmap_threshold: int = field(default=131072, metadata={
        "help": "CPU only: pin glibc's mmap threshold (bytes) so freed activations return to the OS; 0 = glibc's "
                "dynamic default."})
    num_generations: int | None = field(default=4, metadata={"help": "K: samples per agent at every node."})
    loss_type: str | None = field(default=None, metadata={
        "help": "Policy objective. 'response': MAGRPO Eq. 2, a clipped ratio of whole-response probabilities and the "
                "gradient of the summed token log-probs, averaged over the responses (trl_multiagent.losses); or "
                "one of TRL's loss types ('grpo', 'bnpo', 'dr_grpo', 'dapo', ...). None: 'response' for MAGRPO, "
                "'grpo' (GRPO's per-response token mean) for AT-GRPO."})
    use_bias_correction_kl: bool = field(default=False, metadata={
        "help": "TRL's importance-sampling correction of the KL term (TRL's default is True); the papers' KL is "
                "the plain estimator, so it is off here."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Micro-batch of the update, in samples."})
    logging_steps: float = field(default=1, metadata={"help": "Log every this many optimizer steps."})
    bf16: bool | None = field(default=None, metadata={"help": "bf16 mixed precision; off on CPU by default."})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "Replace the results of an earlier run in output_dir. Without it, a run refuses an output_dir that "
                "holds another run's results (unless it resumes from one of its checkpoints)."})

    def __post_init__(self):
        cuda = torch.cuda.is_available()
        if self.bf16 is None:
            self.bf16 = cuda
        if self.loss_type is None:
            self.loss_type = "grpo" if self.grouping == "agent_turn" else RESPONSE_LOSS
        check_loss_settings(self)
        check_common_values(self)
        if self.num_turns < 1:
            raise ValueError(f"num_turns must be at least 1, got {self.num_turns}")
        if self.grouping not in ("joint", "agent_turn"):
            raise ValueError(f"grouping must be 'joint' (MAGRPO) or 'agent_turn' (AT-GRPO), got {self.grouping!r}")
        if self.agent_order not in ("sequential", "parallel"):
            raise ValueError(f"agent_order must be 'sequential' or 'parallel', got {self.agent_order!r}")
        if self.joint_mode not in ("aligned", "cross"):
            raise ValueError(f"joint_mode must be 'aligned' or 'cross', got {self.joint_mode!r}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.cpu_malloc_mmap_threshold < 0:
            raise ValueError(f"cpu_malloc_mmap_threshold must be >= 0 bytes, got {self.cpu_malloc_mmap_threshold}")
        if self.episodes_per_step < 1:
            raise ValueError(f"episodes_per_step must be at least 1, got {self.episodes_per_step}")
        if self.model_dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"model_dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {self.model_dtype!r}")
        if self.gradient_accumulation_steps != 1:
            raise ValueError(
                "gradient_accumulation_steps must be 1 for multi-agent trainers: every sample of a rollout goes into "
                "one optimizer step. Raise episodes_per_step for a larger batch."
            )
        if self.steps_per_generation not in (None, 1) or self.generation_batch_size is not None:
            raise ValueError("steps_per_generation / generation_batch_size are not used here; set episodes_per_step.")
        # GRPOConfig requires generation_batch_size % num_generations == 0, a constraint on single-agent prompt
        # groups that does not apply to a tree rollout; satisfy it, then set the values this trainer uses.
        self.steps_per_generation = self.num_generations
        self.remove_unused_columns = False
        if not cuda:
            self.dataloader_pin_memory = False
        if self.ddp_broadcast_buffers is None:
            self.ddp_broadcast_buffers = False
        if not self.use_cpu and int(os.environ.get("LOCAL_RANK", -1)) != -1 and not torch.accelerator.is_available():
            # Launched by torchrun on a machine without an accelerator: accelerate recognises a multi-CPU (gloo) run
            # only with cpu=True; without it every process would silently train alone with num_processes == 1.
            self.use_cpu = True
        super().__post_init__()
        self.steps_per_generation = 1
        self.generation_batch_size = self.per_device_train_batch_size * self.world_size
        if self.use_vllm:
            raise ValueError("use_vllm is not supported by the multi-agent trainers yet; generation runs in transformers.")
        if self.log_completions:
            raise ValueError("log_completions is not supported by the multi-agent trainers; see metrics.jsonl.")


class MultiAgentGRPOTrainer(GRPOTrainer):
    """Trainer for MAGRPO (Multi-Agent Group Relative Policy Optimization) and the base of the other trainers.

    Paper: "LLM Collaboration With Multi-Agent Reinforcement Learning", Liu et al. (MAGRPO), Algorithm 1, Eq. 1-2.

    Args:
        agents: the team, as a list of [`AgentSpec`] (loaded here) or an already built [`AgentPool`].
        environment: a zero-argument factory returning a fresh [`Environment`] (a class works), called once per task.
        args: a [`MultiAgentGRPOConfig`].
        train_dataset: one row per task, passed to `Environment.reset`.
        callbacks: extra `transformers.TrainerCallback` objects.

    Every run writes `<output_dir>/metrics.jsonl`, `<output_dir>/summary.json` and the final adapters under
    `<output_dir>/adapters/<policy>/`. Checkpoints (`save_steps`) hold every adapter, the optimizer (one param group
    per policy), the scheduler, RNG states and counters; `resume_from_checkpoint` restores them.
    """

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

    def __init__(
        self,
        agents: Sequence[AgentSpec] | AgentPool,
        environment: Callable[[], Environment],
        args: MultiAgentGRPOConfig,
        train_dataset: Dataset,
        callbacks: list | None = None,
    ):
        if not isinstance(args, MultiAgentGRPOConfig):
            raise TypeError(f"args must be a MultiAgentGRPOConfig, got {type(args).__name__}")
        # ---- validation before any model loads
        specs = list(agents.specs.values()) if isinstance(agents, AgentPool) else list(agents)
        check_team(specs)
        if args.grouping == "agent_turn":  # the same trainer runs AT-GRPO; summaries and model cards name it
            self._name = "AT-GRPO"
            self._paper = {"title": "Stronger-MAS: Multi-Agent Reinforcement Learning for Collaborative LLMs"}
        probe = environment()
        self.validate_environment(probe, [s.name for s in specs], train_dataset, args)
        check_context_length(specs, args.max_completion_length)
        check_output_dir(args.output_dir, args.resume_from_checkpoint, args.overwrite_output_dir)
        check_checkpoint(args.resume_from_checkpoint, args.output_dir, sorted({s.policy for s in specs}),
                         [c.name for c in self.build_critics(specs, args)])

        if set_cpu_mmap_threshold(args.cpu_malloc_mmap_threshold):
            logger.info("glibc mmap threshold pinned to %d bytes (cpu_malloc_mmap_threshold)",
                        args.cpu_malloc_mmap_threshold)
        if not isinstance(agents, AgentPool):
            # The new LoRA adapters are initialised at random (lora_A); seed first so that two runs with the same
            # `seed` start from the same adapters (Trainer.__init__ seeds only after the model exists).
            enable_full_determinism(args.seed) if args.full_determinism else set_seed(args.seed)
        self.pool = agents if isinstance(agents, AgentPool) else \
            AgentPool(specs, dtype=args.model_dtype, critics=self.build_critics(specs, args))
        self.pool.prepare_for_training(args.temperature)
        self.environment_factory = environment
        self.agent_order = list(probe.agents)
        self.sampler = self.build_sampler(args)
        first_tokenizer = next(iter(self.pool.tokenizers.values()))

        Trainer.__init__(
            self,
            model=self.pool,
            args=args,
            data_collator=identity,
            train_dataset=train_dataset,
            processing_class=first_tokenizer,
            callbacks=callbacks,
        )
        self._init_grpo_state(args)
        # As GRPOTrainer.__init__ does: one seed per process, or every process would sample the same completions
        # for the same prompt (the adapters were initialised above with the common seed, so they start equal).
        set_seed(args.seed, device_specific=True)
        if not args.disable_tqdm:
            from trl.trainer.callbacks import RichProgressCallback

            self.remove_callback(ProgressCallback)
            self.add_callback(RichProgressCallback())
        self.add_callback(MetricsFileCallback(args.output_dir))

    # ------------------------------------------------------------------------------------------------ set-up
    def validate_environment(self, probe, agent_names: Sequence[str], train_dataset: Dataset,
                             args: MultiAgentGRPOConfig) -> None:
        """Check the environment (``probe``, one instance from the factory), the team and the dataset before any model
        loads; a subclass whose environments follow another protocol (e.g. pipelines) overrides it."""
        if not isinstance(probe, Environment):
            raise TypeError(f"environment() must return an Environment, got {type(probe).__name__}")
        validate_team_against_environment(agent_names, probe)
        if train_dataset is None or len(train_dataset) == 0:
            raise ValueError("train_dataset is empty: it needs one row per task")
        probe.validate_dataset_columns(list(train_dataset.column_names), name="train_dataset")
        if args.grouping == "agent_turn" and args.agent_order == "sequential" \
                and not getattr(probe, "supports_partial_actions", False):
            raise ValueError(f"{type(probe).__name__} does not accept one agent's action alone "
                             "(supports_partial_actions), which sequential AT-GRPO needs; set agent_order='parallel'.")
        if args.num_turns > probe.max_turns:
            logger.warning("num_turns=%d exceeds the environment's max_turns=%d; episodes end at the environment's "
                           "budget.", args.num_turns, probe.max_turns)

    def build_sampler(self, args: MultiAgentGRPOConfig) -> JointTreeSampler | AgentTurnSampler:
        """The rollout topology: MAGRPO's joint tree (``grouping="joint"``) or AT-GRPO's agent-and-turn groups with
        greedy tree sampling (``grouping="agent_turn"``)."""
        if args.grouping == "agent_turn":
            return AgentTurnSampler(num_samples=args.num_generations, num_turns=args.num_turns,
                                    agent_order=args.agent_order, alpha=args.alpha, scale_rewards=args.scale_rewards,
                                    drop_zero_std_groups=args.drop_zero_std_groups)
        return JointTreeSampler(num_samples=args.num_generations, num_turns=args.num_turns,
                                joint_mode=args.joint_mode, gamma=args.gamma, scale_rewards=args.scale_rewards)

    def build_critics(self, specs: Sequence[AgentSpec], args: MultiAgentGRPOConfig) -> list:
        """The critics (:class:`~trl_multiagent.critics.CriticSpec`) the pool adds to the team's bases; called before
        the pool loads (a subclass that needs value models returns them; the GRPO-style trainers need none)."""
        return []

    def _init_grpo_state(self, args: MultiAgentGRPOConfig) -> None:
        """The attributes that GRPOTrainer's loss and logging (reused as they are) read."""
        from collections import defaultdict, deque

        self.loss_type = args.loss_type
        self.beta = args.beta
        self.ref_model = None  # the reference is the base with the adapter disabled
        self.num_iterations = args.num_iterations
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        self.importance_sampling_level = args.importance_sampling_level
        self.top_entropy_quantile = args.top_entropy_quantile
        self.off_policy_mask_threshold = args.off_policy_mask_threshold
        self.aux_loss_enabled = False
        self.use_vllm = False
        self.vllm_importance_sampling_correction = False
        self.entropy_coef = args.entropy_coef
        self.use_adaptive_entropy = args.use_adaptive_entropy
        self._entropy_bonus_enabled = self.entropy_coef != 0.0 or self.use_adaptive_entropy
        self._last_world_entropy = math.inf
        self._entropy_window_stats = None
        self.max_completion_length = args.max_completion_length
        self.current_gradient_accumulation_steps = 1  # gradient_accumulation_steps is always 1 here
        self.num_generations = args.num_generations
        self.temperature = args.temperature
        self.shuffle_dataset = args.shuffle_dataset
        self.log_completions = False
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._logs = {"prompt": deque(), "completion": deque(), "rewards": defaultdict(deque), "advantages": deque(),
                      "extra": defaultdict(deque), "images": deque()}
        self._step = 0
        self._buffered_inputs: Experience | None = None
        self._current_train_step_time = 0.0
        self.generation_config = GenerationConfig(
            max_new_tokens=args.max_completion_length,
            do_sample=True,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            **(args.generation_kwargs or {}),
        )

    def _remove_unused_columns(self, dataset, description=None):
        return dataset  # environments read arbitrary task columns

    def _set_signature_columns_if_needed(self):
        self._signature_columns = []

    def get_train_dataloader(self):
        return self._get_dataloader(dataset=self.train_dataset, description="Training",
                                    batch_size=self.args.episodes_per_step, sampler_fn=self._get_train_sampler,
                                    is_training=True)

    def _get_train_sampler(self, dataset=None):
        # Each chunk of (episodes_per_step x processes) tasks is repeated num_iterations times, so that every process
        # sees its own tasks for as many steps as the rollout is reused (as TRL's GRPOTrainer does).
        dataset = self.train_dataset if dataset is None else dataset
        return RepeatSampler(data_source=dataset, mini_repeat_count=1,
                             batch_size=self.args.episodes_per_step * self.accelerator.num_processes,
                             repeat_count=self.num_iterations, shuffle=self.shuffle_dataset, seed=self.args.seed)

    def create_optimizer(self, model=None):
        """One optimizer, one param group per policy (its adapter's parameters, its own learning rate) and per critic
        (its adapter and value head; default rate ``critic_learning_rate`` where the config has one)."""
        if self.optimizer is None:
            groups = []
            for group in self.pool.trainable_groups():
                lr = group["learning_rate"]
                if lr is None and group["kind"] == "critic":
                    lr = getattr(self.args, "critic_learning_rate", None)
                if lr is None:
                    lr = self.args.learning_rate
                groups.append({"params": group["params"], "lr": lr, "weight_decay": self.args.weight_decay,
                               group["kind"]: group["name"]})
            optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, self.pool)
            optimizer_kwargs.pop("lr", None)
            self.optimizer = optimizer_cls(groups, lr=self.args.learning_rate, **optimizer_kwargs)
        return self.optimizer

    # ------------------------------------------------------------------------------------------------ the step
    def training_step(self, model, inputs, num_items_in_batch=None):
        start = time.perf_counter()
        model.train()
        # The phase of the num_iterations cycle comes from global_step (restored on resume), not from a counter of
        # this run's calls: a run resumed mid-cycle re-rolls (the buffer is not checkpointed) and stays in phase
        # with the RepeatSampler, which hands out each chunk of tasks num_iterations times.
        if self.state.global_step % self.num_iterations == 0 or self._buffered_inputs is None:
            self._buffered_inputs = self.rollout(inputs)
        loss = self.update(model, self._buffered_inputs)
        self._step += 1
        self._metrics["train"]["step_time"].append(time.perf_counter() - start)
        return loss

    @torch.no_grad()
    def rollout(self, tasks: Sequence[Mapping[str, Any]]) -> Experience:
        """Roll the team out on ``tasks`` and compute advantages; attach behaviour/reference log-probs if needed."""
        start = time.perf_counter()
        experience = self.sampler.rollout(self.pool, self.environment_factory, list(tasks), self.generation_config)
        self._metrics["train"]["rollout_time"].append(time.perf_counter() - start)
        need_old = self.num_iterations > 1
        if need_old or self.beta != 0.0:
            for policy in self.pool.policies:
                rows = experience.samples_of(policy)
                for chunk in _chunks(rows, self.args.per_device_train_batch_size):
                    batch = self._collate(policy, chunk)
                    if need_old:
                        logps = self._logps(functools.partial(self.pool, policy), batch)
                        for s, row, m in zip(chunk, logps, batch["completion_mask"]):
                            s.old_logps = row[m.bool()].tolist()
                    if self.beta != 0.0:
                        with self.pool.reference(policy) as ref_model:
                            logps = self._logps(ref_model, batch)
                        for s, row, m in zip(chunk, logps, batch["completion_mask"]):
                            s.ref_logps = row[m.bool()].tolist()
        for key, value in self._gather_stats(experience.stats).items():
            self._metrics["train"][key].append(value)
        release_freed_memory()  # the generation caches are gone; keep their pages from pinning the heap
        return experience

    def _gather_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """Rollout statistics averaged over processes (each process rolls out its own tasks), as TRL logs rewards
        gathered from all processes. Keys may differ between processes (e.g. ``turn/1/reward``): each key is the mean
        over the processes that have it."""
        if self.accelerator.num_processes == 1:
            return stats
        gathered: list[dict[str, float] | None] = [None] * self.accelerator.num_processes
        dist.all_gather_object(gathered, stats)
        merged: dict[str, float] = {}
        for key in dict.fromkeys(k for g in gathered for k in g):
            values = [g[key] for g in gathered if key in g and not math.isnan(g[key])]
            merged[key] = sum(values) / len(values) if values else math.nan
        return merged

    def _logps(self, model, batch) -> torch.Tensor:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                              batch["completion_ids"].size(1))
        return logps

    def update(self, model, experience: Experience) -> torch.Tensor:
        """The policy objective for every policy, its adapter active, on that policy's samples of the step.

        ``loss_type="response"``: MAGRPO Eq. 2 (:func:`~trl_multiagent.losses.response_policy_loss`); otherwise TRL's
        own loss (``GRPOTrainer._compute_loss``). Each policy's loss is the (weighted) mean over ALL its samples of
        the step, computed in micro-batches whose gradients add up to it; policies' parameters are disjoint, so their
        losses are simply summed. Across processes, gradients are averaged once at the end (every process runs the
        same number of loss calls, so TRL's metric collectives stay aligned).
        """
        world = self.accelerator.num_processes
        micro = self.args.per_device_train_batch_size
        response = self.loss_type == RESPONSE_LOSS
        plan = {p: experience.samples_of(p) for p in self.pool.policies}
        weights = {p: self.sample_weights(p, rows) for p, rows in plan.items()}
        if any(w is not None for w in weights.values()) and not response and self.loss_type not in _ROW_MEAN_LOSSES:
            raise ValueError(f"per-sample loss weights need a per-response loss ({sorted(_ROW_MEAN_LOSSES)} or "
                             f"{RESPONSE_LOSS!r}), got loss_type={self.loss_type!r}")
        chunked = {p: _weighted_chunks(rows, weights[p], micro, equal_within=not response) for p, rows in plan.items()}
        chunk_counts = {p: len(chunked[p]) for p in plan}
        totals = {p: (len(rows), sum(len(s.generation.completion_ids) for s in rows)) for p, rows in plan.items()}
        if world > 1:
            counts = torch.tensor([[chunk_counts[p], *totals[p]] for p in plan], dtype=torch.float64)
            local_tokens = counts[:, 2].clone()
            counts[:, 2] = 0
            maxed = counts.clone()
            dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
            global_tokens = local_tokens.clone()
            dist.all_reduce(global_tokens, op=dist.ReduceOp.SUM)
            for i, p in enumerate(plan):
                chunk_counts[p] = int(maxed[i, 0])
                totals[p] = (totals[p][0], totals[p][1], float(global_tokens[i]))
        total_loss = torch.zeros((), device=self.accelerator.device)
        sync_ctx = self.accelerator.no_sync(model) if world > 1 else contextlib.nullcontext()
        with sync_ctx:
            for policy in plan:
                n_tokens = totals[policy][1]
                global_tokens = totals[policy][2] if world > 1 else n_tokens
                chunks = chunked[policy]
                for c in range(chunk_counts[policy]):
                    chunk, row_weights = chunks[c] if c < len(chunks) else (None, None)
                    batch = self._collate(policy, chunk) if chunk else self._dummy_batch(policy)
                    if response:
                        w = torch.tensor(row_weights if chunk else [0.0], dtype=torch.float32)
                        loss = self._response_loss(model, policy, batch, w.to(self.accelerator.device))
                    else:
                        if chunk is None:
                            weight = 0.0
                        elif self.loss_type in _ROW_MEAN_LOSSES:
                            weight = sum(row_weights)  # equal weights within a chunk: row mean x chunk weight
                        elif self.loss_type in _TOKEN_MEAN_LOSSES:
                            weight = batch["completion_mask"].sum().item() / max(n_tokens, 1)
                        elif self.loss_type in _TOKEN_SUM_LOSSES:
                            weight = 1.0
                            batch["num_items_in_batch"] = torch.tensor(float(global_tokens))
                        else:
                            raise ValueError(f"loss_type {self.loss_type!r} is not supported by {type(self).__name__}")
                        loss = self._compute_loss(functools.partial(model, policy), batch) * weight
                    self.accelerator.backward(loss)
                    total_loss = total_loss + loss.detach()
                release_freed_memory()
        if world > 1:
            self._average_gradients_across_processes()
        return total_loss

    def _response_loss(self, model, policy: str, batch: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """MAGRPO Eq. 2 on one micro-batch of ``policy``'s responses (``weights``: each response's share of the
        policy's loss), through the one log-prob path; logs entropy, clipped fraction and KL like TRL's loss."""
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            functools.partial(model, policy), input_ids, attention_mask, batch["completion_ids"].size(1),
            compute_entropy=True)
        old = batch.get("old_per_token_logps")
        loss, stats = response_policy_loss(
            logps, logps.detach() if old is None else old, batch["completion_mask"], batch["advantages"],
            self.epsilon_low, self.epsilon_high, ref_per_token_logps=batch.get("ref_per_token_logps"),
            beta=self.beta, weights=weights, delta=self.args.delta)
        if float(weights.sum()) > 0:  # not a zero-weight batch that only keeps processes in step
            mask = batch["completion_mask"].to(entropies.dtype)
            metrics = self._metrics["train"]
            metrics["entropy"].append(((entropies * mask).sum() / mask.sum().clamp(min=1.0)).item())
            metrics["clip_ratio/region_mean"].append(stats["clipped"].mean().item())
            if self.beta != 0.0:
                metrics["kl"].append(stats["kl"].mean().item())
        return loss

    def _clip_grad_norm(self, model):
        """Clip each policy's and each critic's gradient to ``max_grad_norm`` separately, so that one agent's large
        gradient never shrinks another agent's step. Logs every group's norm before clipping
        (``policy/<name>/grad_norm``, ``critic/<name>/grad_norm``) and returns the norm of all of them together
        (TRL's ``grad_norm``)."""
        self.accelerator.unscale_gradients()
        norms = []
        for group in self.pool.trainable_groups():
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            norm = torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)
            self._metrics["train"][f"{group['kind']}/{group['name']}/grad_norm"].append(float(norm))
            norms.append(norm.detach().float())
        return torch.stack(norms).pow(2).sum().sqrt() if norms else torch.zeros(())

    def sample_weights(self, policy: str, rows: Sequence[Sample]) -> list[float] | None:
        """Per-sample weights of one policy's loss (summing to 1 over ``rows``), or ``None`` for the plain mean over
        its samples. A subclass whose objective weights samples unequally (MHGPO Eq. 6) overrides it; needs a
        per-sequence ``loss_type``."""
        return None

    def _average_gradients_across_processes(self) -> None:
        """Average the gradients of every optimizer group (policies and critics) over processes, in one collective."""
        groups = [g["params"] for g in self.pool.trainable_groups()]
        used = torch.tensor([float(any(p.grad is not None for p in params)) for params in groups])
        dist.all_reduce(used, op=dist.ReduceOp.MAX)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for params in groups for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.accelerator.num_processes
        offset = 0
        for params, was_used in zip(groups, used.tolist()):
            for p in params:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p).clone() if was_used else None
                offset += n

    def _collate(self, policy: str, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        """Pad one policy's samples into TRL's loss inputs (prompts left-padded, completions right-padded)."""
        tok = self.pool.tokenizer_of(policy)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        device = self.accelerator.device
        p_len = max(len(s.generation.prompt_ids) for s in samples)
        c_len = max(max(len(s.generation.completion_ids) for s in samples), 1)
        prompt_ids = torch.full((len(samples), p_len), pad, dtype=torch.long)
        prompt_mask = torch.zeros((len(samples), p_len), dtype=torch.long)
        completion_ids = torch.full((len(samples), c_len), pad, dtype=torch.long)
        completion_mask = torch.zeros((len(samples), c_len), dtype=torch.long)
        for i, s in enumerate(samples):
            p, c = s.generation.prompt_ids, s.generation.completion_ids
            prompt_ids[i, p_len - len(p):] = torch.tensor(p)
            prompt_mask[i, p_len - len(p):] = 1
            if c:
                completion_ids[i, :len(c)] = torch.tensor(c)
                completion_mask[i, :len(c)] = 1
        batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                 "completion_mask": completion_mask,
                 "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32)}
        for key, attr in (("old_per_token_logps", "old_logps"), ("ref_per_token_logps", "ref_logps")):
            if all(getattr(s, attr) is not None for s in samples):
                values = torch.zeros((len(samples), c_len), dtype=torch.float32)
                for i, s in enumerate(samples):
                    row = getattr(s, attr)
                    values[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
                batch[key] = values
        return {k: v.to(device) for k, v in batch.items()}

    def _dummy_batch(self, policy: str) -> dict[str, torch.Tensor]:
        """A one-token batch with zero weight, run only to keep collectives aligned across processes."""
        tok = self.pool.tokenizer_of(policy)
        eos = tok.eos_token_id if tok.eos_token_id is not None else 0
        one = torch.tensor([[eos]], device=self.accelerator.device)
        batch = {"prompt_ids": one, "prompt_mask": torch.ones_like(one), "completion_ids": one.clone(),
                 "completion_mask": torch.ones_like(one), "advantages": torch.zeros(1, device=one.device)}
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = torch.zeros((1, 1), device=one.device)
        if self.num_iterations > 1:
            batch["old_per_token_logps"] = torch.zeros((1, 1), device=one.device)
        return batch

    # ------------------------------------------------------------------------------------------------ saving
    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Save every policy's adapter under ``<output_dir>/adapters/<policy>/`` (not the frozen bases)."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if self.args.should_save:
            self.pool.save_adapters(output_dir)
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def _save_checkpoint(self, model, trial):
        Trainer._save_checkpoint(self, model, trial)  # no model card: the team is not one hub model

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        logger.info("Loading adapters from %s", resume_from_checkpoint)
        self.pool.load_adapters(resume_from_checkpoint)

    def train(self, resume_from_checkpoint=None, *args, **kwargs) -> TrainOutput:
        """Train, then write the final adapters and ``<output_dir>/summary.json``. ``run_status.json`` marks the
        output directory ``running`` meanwhile and ``finished`` at the end."""
        check_checkpoint(resume_from_checkpoint, self.args.output_dir, list(self.pool.policies), list(self.pool.critics))
        if self.args.should_save:
            write_run_status(self.args.output_dir, "running")
        output = super().train(resume_from_checkpoint, *args, **kwargs)
        self.save_model(self.args.output_dir)
        if self.args.should_save:
            write_summary(self, output)
            write_run_status(self.args.output_dir, "finished")
        return output


def check_context_length(specs: Sequence[AgentSpec], max_completion_length: int) -> None:
    """``max_completion_length`` fits the context of every agent's model (read from its config, no weights)."""
    for model in dict.fromkeys(s.model_name for s in specs):
        limit = context_length(model)
        if limit is not None and max_completion_length >= limit:
            raise ValueError(f"max_completion_length={max_completion_length} does not fit the context of {model} "
                             f"({limit} tokens, prompt included); lower it")


def validate_team_against_environment(agent_names: Sequence[str], env: Environment) -> None:
    """The team's agent names must be exactly the environment's roles."""
    roles = list(env.agents)
    if sorted(agent_names) != sorted(roles):
        raise ValueError(
            f"The agents {list(agent_names)} do not match the roles of {type(env).__name__}: {roles}. "
            "Give one AgentSpec per role, named after it."
        )


def write_summary(trainer: MultiAgentGRPOTrainer, output: TrainOutput) -> Path:
    """``summary.json``: algorithm, team, run length, final and best logged values of the main metrics."""
    history = [h for h in trainer.state.log_history if "loss" in h or "reward" in h]
    last = history[-1] if history else {}
    rewards = [h["reward"] for h in history if isinstance(h.get("reward"), (int, float))]
    summary = {
        "algorithm": trainer._name,
        "trainer": type(trainer).__name__,
        "global_step": trainer.state.global_step,
        "train_runtime_s": output.metrics.get("train_runtime"),
        "train_loss": output.metrics.get("train_loss"),
        "first_reward": rewards[0] if rewards else None,
        "last_reward": rewards[-1] if rewards else None,
        "mean_reward_first_quarter": _mean(rewards[: max(1, len(rewards) // 4)]) if rewards else None,
        "mean_reward_last_quarter": _mean(rewards[-max(1, len(rewards) // 4):]) if rewards else None,
        "final_metrics": {k: v for k, v in last.items() if isinstance(v, (int, float))},
        "agents": {name: {"policy": s.policy, "model": s.model_name, "quantization": s.quantization}
                   for name, s in trainer.pool.specs.items()},
        "adapters": {p: str(Path(trainer.args.output_dir) / "adapters" / p) for p in trainer.pool.policies},
        "config": {k: getattr(trainer.args, k) for k in ("num_generations", "num_turns", "grouping", "joint_mode",
                                                         "agent_order", "alpha", "drop_zero_std_groups", "gamma",
                                                         "episodes_per_step", "learning_rate", "beta", "epsilon",
                                                         "temperature", "max_completion_length", "seed")
                   if hasattr(trainer.args, k)},
    }
    path = Path(trainer.args.output_dir) / "summary.json"
    path.write_text(json.dumps(summary, indent=2, default=str))
    return path


def _mean(xs):
    return sum(xs) / len(xs)


def _chunks(rows, size):
    for i in range(0, len(rows), size):
        yield rows[i:i + size]


def _weighted_chunks(rows, weights, size, equal_within: bool) -> list[tuple[list, list[float]]]:
    """Micro-batches of at most ``size`` rows, each with its rows' shares of the policy's loss (``1/len(rows)`` each
    without ``weights``). ``equal_within``: group rows of equal weight first, so that a row-mean loss times the
    chunk's total weight is exactly the weighted sum of its rows (TRL's per-response losses)."""
    if weights is None:
        weights = [1.0 / len(rows)] * len(rows) if rows else []
    if len(weights) != len(rows):
        raise ValueError(f"{len(weights)} sample weights for {len(rows)} samples")
    if not equal_within:
        return [(rows[i:i + size], [float(w) for w in weights[i:i + size]]) for i in range(0, len(rows), size)]
    classes: dict[float, list] = {}
    for row, w in zip(rows, weights):
        classes.setdefault(float(w), []).append(row)
    return [(chunk, [w] * len(chunk)) for w, members in classes.items() for chunk in _chunks(members, size)]
