"""MultiAgentConfig: the config every trainer's config extends (over TRL's ``GRPOConfig``), the checks of the
values all trainers share (loss settings, ranges, tracking backends), and the checks of the team, its environment
and its dataset; all run before any model loads."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from datasets import Dataset
from trl import GRPOConfig

from trl_multiagent.credit.losses import RESPONSE_LOSS
from trl_multiagent.generation.compute_paths import DENSE_COPY, LEAN_DECODE, PACKED_WEIGHTS
from trl_multiagent.generation.frozen_weights import FROZEN_MATMUL_DTYPES, bfloat16_matmuls_available
from trl_multiagent.models.loading import MODEL_DTYPES, context_length
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers.async_rollouts import check_async_config
from trl_multiagent.trainers.sharding import check_parallelism
from trl_multiagent.trainers.unused_fields import refuse_unused_fields

#: TRL's loss types (``GRPOConfig.loss_type``), all selectable by name next to ``"response"``.
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
#: How TRL's loss types aggregate: a mean over responses / over a micro-batch's tokens / a sum over a global count.
ROW_MEAN_LOSSES = {"grpo", "dr_grpo", "sapo", "luspo"}
TOKEN_MEAN_LOSSES = {"bnpo"}
TOKEN_SUM_LOSSES = {"dapo", "cispo", "vespo"}



# ---------------------------------------------------------------------------------------------------- config
@dataclass
class MultiAgentConfig(GRPOConfig):
    r"""The fields every multi-agent trainer shares, over [`~trl.GRPOConfig`] (whose fields all keep their meaning).

    Parameters:
        episodes_per_step (`int`, defaults to `1`):
            Tasks (dataset rows) each process rolls out per optimizer step; every sample of those episodes goes into
            that one step.
        num_turns (`int`, defaults to `1`):
            Turns of an episode: the horizon H of MAGRPO and CoLLM, AT-GRPO's turn budget, MAPoRL's debate turns T
            (fewer where the environment ends an episode early). MHGPO's pipeline is one pass: 1.
        gamma (`float`, defaults to `1.0`):
            Discount of later turns' rewards, in [0, 1]: MAGRPO's returns, CoLLM's TD targets, MAPoRL's reward
            modes. AT-GRPO (each turn's own reward, Eq. 3) and MHGPO (one end reward) use none.
        model_dtype (`str`, defaults to `"auto"`):
            Weights dtype of full-precision bases: `"auto"` (bfloat16 on CUDA, float32 on CPU), `"float32"`,
            `"bfloat16"`, `"float16"` or `"float64"` (slow; for numerical checks, where two computations of one
            quantity are compared far below float32's rounding).
        overwrite_output_dir (`bool`, defaults to `False`):
            Replace the results of an earlier run in `output_dir`. Without it a run refuses a directory that holds
            another run's results, unless it resumes from one of its checkpoints.
        resume_from_checkpoint (`str` or `None`, defaults to `None`):
            A `checkpoint-<step>` folder to continue from, or `true` / `last` (any case) for the last complete one of
            `output_dir` (resolved to its path before any model loads).
        max_nonfinite_updates_in_a_row (`int`, defaults to `3`):
            An optimizer update whose loss or gradient norm is NaN or infinite is skipped (no optimizer step, the
            adapters unchanged; the step still counts), with a warning and the metric `skipped_updates`; this many
            skipped in a row are tolerated, one more ends the run with one error. `0`: the first one ends it.
        save_on_signal (`bool`, defaults to `True`):
            On SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption) the step in progress is finished and training
            stops (exit code 130 / 143, `run_status.json` `interrupted` with the command that resumes it); with this,
            a checkpoint of that step is saved first (when a step was done before the signal). A second signal stops
            at once.
        max_staleness (`int`, defaults to `0`):
            TRL AsyncGRPO's name. `0`: synchronous rollouts (generate, then train, step after step). k > 0: the next k
            steps' rollouts are generated in a worker thread while the trainer updates, each with the adapters of the
            step that started it, and no sample is trained on more than k optimizer steps after the adapters that
            generated it (`trl_multiagent/trainers/async_rollouts.py`); needs `use_vllm`: `vllm_mode: server` (a
            server that holds up to 1 + k versions of each adapter: `--max-loras` policies x (1 + k)) or `colocate`
            (the engine generates in the worker thread, the pinned versions kept until trained on),
            `vllm_importance_sampling_correction` and `num_iterations` 1. Metrics `async/staleness_mean`,
            `async/staleness_max`, `async/dropped_samples`.

    Notes:
        `per_device_train_batch_size` is the micro-batch (samples per forward/backward pass) of the update;
        `gradient_accumulation_steps` and `steps_per_generation` must stay 1 (raise `episodes_per_step` instead).
        `GRPOConfig.__post_init__` is given the values this config means, with one exception
        ([`grpo_group_check_values`]): its two checks of TRL's prompt groups (`num_generations` at least 2, TRL's
        generation batch `per_device_train_batch_size x processes x steps_per_generation` a multiple of it) concern
        `GRPOTrainer`'s own sampling, which a team does not use; where the config's `num_generations` (1: one path per
        episode) or micro-batch (not a multiple of K) fails them, they see the nearest values they accept, and the
        config keeps its own (`num_generations` K, `steps_per_generation` 1).
        `num_iterations` reuses one rollout for that many optimizer steps, as in TRL. `loss_type` is
        `"response"` (the whole-response objective of MAGRPO Eq. 2 and CoLLM Eq. 2/4) or any TRL loss type.
        `GRPOConfig` fields that only `GRPOTrainer.__init__` reads are refused unless left at their defaults
        (`trl_multiagent/trainers/unused_fields.py`). `print_logs` prints each logging step's dict as TRL does.
    """

    #: The smallest ``num_generations`` the trainer's sampler accepts.
    min_generations: ClassVar[int] = 2
    #: Why this trainer cannot run under FSDP, or None where it can (checked before any model loads).
    fsdp_refusal: ClassVar[str | None] = None

    episodes_per_step: int = field(default=1, metadata={"help": "Tasks rolled out per process per optimizer step."})
    num_turns: int = field(default=1, metadata={
        "help": "Turns of an episode (H; AT-GRPO's turn budget; MAPoRL's debate turns), fewer where the environment "
                "ends it early."})
    gamma: float = field(default=1.0, metadata={
        "help": "Discount of later turns' rewards, in [0, 1] (MAGRPO, CoLLM, MAPoRL; unused by AT-GRPO and MHGPO)."})
    model_dtype: str = field(default="auto", metadata={
        "help": "'auto', 'float32', 'bfloat16', 'float16' or 'float64' (slow; for numerical checks)."})
    num_threads: int | None = field(default=None, metadata={
        "help": "torch's CPU threads in each process; None: OMP_NUM_THREADS when you set it, else the CPUs this "
                "process may run on, shared among the processes of this machine (the 1 that accelerate launch sets "
                "on its own would leave all but one core idle)."})
    cpu_keep_freed_memory: bool = field(default=False, metadata={
        "help": "On CPU with glibc: the process keeps the memory it frees for its next allocations (no trimming, "
                "blocks up to 1 GiB from the heap) instead of giving it back to the OS after the rollout and after "
                "each policy's update, where every page was faulted in again at the next step. The main job (one "
                "policy) took 0.89-0.93 times as long per step with it, at 1.015 times the peak memory "
                "(experiments/speed/step_profile/README.md, 'Page faults'); its recipe turns it on. Off by default: "
                "between the updates of several policies the trims keep a team nearer one agent's memory (a 4-agent "
                "team on one base: 1.059 times one agent's peak with it, 1.050 without, in one run). Process-wide; "
                "left alone when MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_ or a GLIBC_TUNABLES "
                "malloc setting is in the environment. summary.json records it (machine.cpu_allocator)."})
    dense_copy: str = field(default="auto", metadata={
        "help": "4-bit (QLoRA) bases compute with a de-quantised copy of their frozen weights, the same numbers "
                "without de-quantising at every matmul (several times faster on CPU, more memory): 'always', "
                "'never', or 'auto' (when the copy takes at most a quarter of the machine's total memory, so that the "
                "same recipe on the same machine always takes the same path)."})
    packed_weights: str = field(default="auto", metadata={
        "help": "Generation on CPU float32 bases computes the frozen linears with oneDNN-packed copies of their "
                "weights (faster decoding; the sums run in another order, so tokens can differ from F.linear's at "
                "near-ties), and so do the teacher-forced passes of the losses, forward and backward, where three "
                "copies fit: 'always', 'never', or 'auto' (when the copy, for the passes three copies, takes at most "
                "a quarter of the machine's total memory). summary.json records the paths taken (machine.paths: "
                "packed_weights, packed_training)."})
    lean_decode: str = field(default="auto", metadata={
        "help": "Generation computes the one-token decoding steps of Llama-architecture bases with the library's lean "
                "step (trl_multiagent/generation/lean_step.py: few operations per layer, the same numbers as "
                "transformers' forward up to the order of float sums) instead of transformers' forward: 'auto' (every "
                "base it supports; the others fall back to the forward, logged), 'always' (an unsupported base is an "
                "error) or 'never'. summary.json records the path taken (machine.paths)."})
    frozen_matmul_dtype: str = field(default="float32", metadata={
        "help": "The dtype the packed copies of the frozen (base) linears compute in on the CPU, in generation and in "
                "the teacher-forced passes alike: 'float32', or 'bfloat16' (the weights rounded to bfloat16 once, each "
                "frozen matmul's input and output rounded to bfloat16 around oneDNN's bfloat16 kernel, float32 "
                "accumulation; LoRA, attention, norms and the loss stay float32). Decoding steps 1.2-1.3x faster on a "
                "CPU with bfloat16 instructions, but the sampling and trained policies then differ beyond float32 "
                "rounding, and the main job's held-out gain was smaller in each of three seeds "
                "(experiments/speed/frozen_matmul_dtype/); an error where it cannot apply (no oneDNN bfloat16 "
                "matmuls, packed_weights 'never', CUDA, a model_dtype other than float32). summary.json records it "
                "(machine.paths)."})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "Replace the results of an earlier run in output_dir. Without it, a run refuses an output_dir that "
                "holds another run's results (unless it resumes from one of its checkpoints)."})
    resume_from_checkpoint: str | None = field(default=None, metadata={
        "help": "Continue a run from one of its checkpoints: a checkpoint-<step> folder, or true / last (any case) for "
                "the last complete checkpoint-* of output_dir (one whose save finished; resolved to its path before "
                "any model loads, an error when there is none). The optimizer, scheduler, RNG states and counters "
                "are restored, so the run goes on as if never stopped; max_steps may be raised to train further."})
    max_nonfinite_updates_in_a_row: int = field(default=3, metadata={
        "help": "An optimizer update whose loss or gradient norm is NaN or infinite is skipped: its gradients are "
                "dropped and the optimizer does not step, so the adapters stay as they were (the step still counts), "
                "with a warning that counts them and the metric skipped_updates (updates skipped so far). This many "
                "skipped updates in a row are tolerated; one more ends the run with one error (run_status.json: "
                "failed). 0: the first non-finite update ends it."})
    save_on_signal: bool = field(default=True, metadata={
        "help": "On SIGINT (Ctrl-C) or SIGTERM (a scheduler's preemption), finish the step in progress, save a "
                "checkpoint of it (when a step was done before the signal) and stop: exit code 130 / 143, "
                "run_status.json 'interrupted' with the step and the command that resumes the run "
                "(--resume_from_checkpoint true). false: stop after the step without saving. A second signal stops "
                "at once."})
    frozen_policies: list[str] = field(default_factory=list, metadata={
        "help": "Policies that act but do not learn: their agents play every episode with the adapters they start "
                "with (fresh ones compute nothing: the base; init_adapters loads trained ones), their samples enter "
                "no loss and their adapters no optimizer. AT-GRPO's Table 4 ablation trains each agent of a team "
                "with a policy per role while its partner stays frozen (frozen_policies: [tool], then [reasoner]). "
                "Every name must be a policy of the team, and at least one policy must still train."})
    max_staleness: int = field(default=0, metadata={
        "help": "Asynchronous rollouts (TRL AsyncGRPO's name): 0 (default) generates each step's rollout and then "
                "trains on it; k > 0 generates the next k steps' rollouts in a worker thread while the trainer updates, "
                "each with the adapters of the step that started it, and trains no sample more than k optimizer steps "
                "after the adapters that generated it (the importance-sampling correction weighs the samples by the "
                "trained policy over the one that sampled them). Needs use_vllm (vllm_mode server, with --max-loras "
                "at least policies x (1 + k), or colocate: the engine then generates in the worker), "
                "vllm_importance_sampling_correction and num_iterations 1. The tasks of "
                "each step are the same whatever k."})
    num_generations: int | None = field(default=4, metadata={"help": (
        "K: samples per agent and branch point. GRPOConfig's checks of TRL's own prompt groups (K >= 2, "
        "per_device_train_batch_size x processes a multiple of K) do not apply to a team's rollout: a K they refuse "
        "(1 where the trainer takes it; one that does not divide the micro-batch) is kept, those checks alone see "
        "the nearest values they accept (grpo_group_check_values).")})
    loss_type: str = field(default=RESPONSE_LOSS, metadata={
        "help": "Policy objective: 'response' (MAGRPO Eq. 2: clipped ratio of whole-response probabilities, gradient "
                "of the summed token log-probs, mean over responses) or one of TRL's loss types ('grpo', 'bnpo', "
                "'dr_grpo', 'dapo', ...)."})
    use_bias_correction_kl: bool = field(default=False, metadata={
        "help": "TRL's importance-sampling correction of the KL term (TRL's default is True); the papers' KL is the "
                "plain estimator."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": (
        "Micro-batch of the update, in samples (rows of every agent and turn) per forward/backward pass: a speed and "
        "memory setting, the loss is the same. Unlike TRL's GRPOTrainer, where it counts the completions per device "
        "and step, the step's size here is episodes_per_step tasks x num_generations samples (x agents x turns).")})
    logging_steps: float = field(default=1, metadata={"help": "Log every this many optimizer steps."})
    print_logs: bool = field(default=True, metadata={
        "help": "Print each logging step's dict of metrics on the console, as TRL's GRPOTrainer does (transformers' "
                "ProgressCallback: floats to 4 significant digits), above the progress bar; false: the bar alone. "
                "metrics.jsonl and report_to receive every dict either way."})
    bf16: bool | None = field(default=None, metadata={"help": "bf16 mixed precision; off on CPU by default."})
    share_prompt_prefixes: bool | None = field(default=None, metadata={
        "help": "Teacher-forced passes (log-probs, critic values) run a prompt shared by several rows, and an opening "
                "shared by several prompts, once (trl_multiagent/generation/teacher_forcing.py; the same numbers up to float "
                "summation order). None: on, except under FSDP, where one pass per row is required (FSDP2 frees a "
                "layer's gathered weights after each forward); true under FSDP is an error."})
    activation_checkpointing: bool | None = field(default=None, metadata={
        "help": "Recompute activations in the backward pass to save memory (about a fifth slower); off by default "
                "(None: the deprecated gradient_checkpointing's value where given, else off): turn it on only when "
                "memory needs it."})
    gradient_checkpointing: bool | None = field(default=None, metadata={
        "help": "transformers' deprecated alias of activation_checkpointing (taken as it when that is unset)."})

    @property
    def evaluation_agent_order(self) -> str:
        """How the agents act in held-out episodes: ``"parallel"`` (all at once), or ``"sequential"`` for a trainer
        whose agents act one after another (AT-GRPO's ``agent_order``)."""
        return "parallel"

    def check_frozen_matmul_dtype(self, cuda: bool) -> None:
        """``frozen_matmul_dtype`` is one of :data:`FROZEN_MATMUL_DTYPES` and, when ``bfloat16``, can apply here:
        packed copies of a float32 base on a CPU with oneDNN bfloat16 matmuls (an error before any model loads)."""
        if self.frozen_matmul_dtype not in FROZEN_MATMUL_DTYPES:
            raise ValueError(f"frozen_matmul_dtype must be one of {sorted(FROZEN_MATMUL_DTYPES)}, got "
                             f"{self.frozen_matmul_dtype!r}")
        if self.frozen_matmul_dtype == "float32":
            return
        problems = []
        if cuda:
            problems.append("it applies to the CPU's packed copies, and CUDA is available (use model_dtype "
                            "'bfloat16' or bf16 there)")
        if self.packed_weights == "never":
            problems.append("packed_weights is 'never' (the bfloat16 copies are packed copies)")
        if self.model_dtype not in ("auto", "float32"):
            problems.append(f"model_dtype is {self.model_dtype!r} (it rounds copies of a float32 base)")
        if not cuda and not bfloat16_matmuls_available():
            problems.append("oneDNN offers no bfloat16 matmuls on this CPU / torch build")
        if problems:
            raise ValueError("frozen_matmul_dtype 'bfloat16' cannot apply: " + "; ".join(problems) +
                             ". Use frozen_matmul_dtype 'float32'.")

    def __post_init__(self):
        refuse_unused_fields(self)  # GRPOConfig fields only GRPOTrainer.__init__ reads: refused unless left default
        cuda = torch.cuda.is_available()
        if self.bf16 is None:
            self.bf16 = cuda
        check_loss_settings(self)
        check_common_values(self, self.min_generations)
        if self.episodes_per_step < 1:
            raise ValueError(f"episodes_per_step must be at least 1, got {self.episodes_per_step}")
        if self.num_turns < 1:
            raise ValueError(f"num_turns must be at least 1, got {self.num_turns}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not isinstance(self.max_nonfinite_updates_in_a_row, int) or self.max_nonfinite_updates_in_a_row < 0:
            raise ValueError("max_nonfinite_updates_in_a_row must be an integer >= 0 (0: the first non-finite update "
                             f"ends the run), got {self.max_nonfinite_updates_in_a_row!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be at least 1 or None, got {self.num_threads}")
        if self.dense_copy not in DENSE_COPY:
            raise ValueError(f"dense_copy must be one of {DENSE_COPY}, got {self.dense_copy!r}")
        if self.packed_weights not in PACKED_WEIGHTS:
            raise ValueError(f"packed_weights must be one of {PACKED_WEIGHTS}, got {self.packed_weights!r}")
        if self.lean_decode not in LEAN_DECODE:
            raise ValueError(f"lean_decode must be one of {LEAN_DECODE}, got {self.lean_decode!r}")
        if self.model_dtype not in MODEL_DTYPES:
            raise ValueError(f"model_dtype must be one of {MODEL_DTYPES}, got {self.model_dtype!r}")
        self.check_frozen_matmul_dtype(cuda)
        if self.gradient_accumulation_steps != 1:
            raise ValueError("gradient_accumulation_steps must be 1 for multi-agent trainers: every sample of a rollout "
                             "goes into one optimizer step. Raise episodes_per_step for a larger batch.")
        if self.steps_per_generation not in (None, 1) or self.generation_batch_size is not None:
            raise ValueError("steps_per_generation / generation_batch_size are not used here; set episodes_per_step.")
        check_parallelism(self)  # FSDP2 runs; DeepSpeed, FSDP1 and FSDP without a GPU are refused with the reason
        if isinstance(self.frozen_policies, str):  # --frozen_policies tool on a command line
            self.frozen_policies = [name for name in self.frozen_policies.split(",") if name]
        self.frozen_policies = list(self.frozen_policies or [])
        check_async_config(self)  # max_staleness: an integer >= 0; > 0 needs vLLM, the correction, 1 iteration
        if self.use_vllm:  # vLLM importable, colocate mode, importance-sampling settings that fit the loss
            from trl_multiagent.generation.vllm import check_vllm_config

            check_vllm_config(self)
        self.remove_unused_columns = False
        if not cuda:
            self.dataloader_pin_memory = False
        if self.ddp_broadcast_buffers is None:
            self.ddp_broadcast_buffers = False
        if not self.use_cpu and int(os.environ.get("LOCAL_RANK", -1)) != -1 and not torch.accelerator.is_available():
            # Launched by torchrun on a machine without an accelerator: accelerate recognises a multi-CPU (gloo) run
            # only with cpu=True; without it every process would silently train alone with num_processes == 1.
            self.use_cpu = True
        # GRPOConfig.__post_init__ sees this config's values, but for the one exception of grpo_group_check_values
        samples = self.num_generations
        self.num_generations, self.steps_per_generation = grpo_group_check_values(samples,
                                                                                  self.per_device_train_batch_size)
        super().__post_init__()
        self.num_generations, self.steps_per_generation = samples, 1
        self.generation_batch_size = self.per_device_train_batch_size * self.world_size  # GRPOConfig's, with 1 step
        check_tracking_backends(self.report_to)


def grpo_group_check_values(num_generations: int, per_device_train_batch_size: int) -> tuple[int, int]:
    """The ``(num_generations, steps_per_generation)`` that ``GRPOConfig.__post_init__`` checks for a team config: the
    config's own K and 1 wherever those checks accept them, else the nearest values they accept.

    The one exception to giving ``GRPOConfig`` the values a team config means. Its two checks of TRL's prompt groups,
    ``num_generations >= 2`` and TRL's generation batch (``per_device_train_batch_size x processes x
    steps_per_generation`` completions) a multiple of ``num_generations``, keep whole groups of K completions in
    ``GRPOTrainer``'s own sampling. A team's sampler rolls out its own groups and ``per_device_train_batch_size`` is
    the update's micro-batch, so a K of 1 (one path per episode: the actor-critic trainer, MAPoRL) and a K that does
    not divide the micro-batch are valid here: for those the checks see K (2 where it is 1) and the fewest steps per
    generation that make the batch whole groups. The config keeps K and ``steps_per_generation`` 1 (``__post_init__``);
    the test ``tests/test_config_fields.py::test_grpo_config_sees_the_values_a_team_config_means`` states where
    ``GRPOConfig`` refuses them."""
    k = max(2, num_generations)
    return k, k // math.gcd(k, per_device_train_batch_size)


#: report_to backends and the module each needs; they come with ``pip install 'trl-multiagent[tracking]'``.
TRACKING_MODULES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb", "mlflow": "mlflow"}


def check_tracking_backends(report_to) -> None:
    """Every backend named in ``report_to`` can be imported, and wandb can log in (or logs offline): a missing one
    or a wandb without a login is an error here, before any model loads (transformers would fail only when the
    trainer is built, wandb at the first step: :mod:`~trl_multiagent.trainers.tracking_login`)."""
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    missing = [n for n in names if n in TRACKING_MODULES and importlib.util.find_spec(TRACKING_MODULES[n]) is None]
    if missing:
        raise ValueError(f"report_to names {missing}, which is not installed: pip install 'trl-multiagent[tracking]' "
                         f"(tensorboard, trackio, wandb), or pip install {' '.join(TRACKING_MODULES[n] for n in missing)}"
                         ", or set report_to: none")
    if "wandb" in names:
        from trl_multiagent.trainers.tracking_login import wandb_login_problem

        problem = wandb_login_problem()
        if problem:
            raise ValueError(problem)


def check_loss_settings(config) -> None:
    """``loss_type`` names a known objective, and the whole-response objective gets no per-token option it ignores."""
    if config.loss_type != RESPONSE_LOSS and config.loss_type not in TRL_LOSS_TYPES:
        raise ValueError(f"loss_type must be {RESPONSE_LOSS!r} or one of TRL's {list(TRL_LOSS_TYPES)}, got "
                         f"{config.loss_type!r}")
    if config.loss_type == RESPONSE_LOSS:
        per_token = {"entropy_coef": config.entropy_coef != 0.0, "use_adaptive_entropy": config.use_adaptive_entropy,
                     "top_entropy_quantile": config.top_entropy_quantile < 1.0,
                     "off_policy_mask_threshold": config.off_policy_mask_threshold is not None,
                     "use_bias_correction_kl": config.use_bias_correction_kl}
        used = [name for name, on in per_token.items() if on]
        if used:
            raise ValueError(f"{used[0]} is an option of TRL's per-token losses; the whole-response objective "
                             f"(loss_type={RESPONSE_LOSS!r}) does not use it. Unset it or choose a TRL loss_type.")


def check_common_values(config, min_generations: int) -> None:
    """Values every multi-agent config needs in range, checked before GRPOConfig's own checks (some of which would
    otherwise fail with a ZeroDivisionError, or only when the model samples)."""
    def need(ok: bool, name: str, rule: str) -> None:
        if not ok:
            raise ValueError(f"{name} must be {rule}, got {getattr(config, name)!r}")

    k = config.num_generations
    if min_generations >= 2:
        need(isinstance(k, int) and k >= min_generations, "num_generations",
             f"an integer >= {min_generations} (K: a group of one sample has advantage 0, so it teaches nothing)")
    else:
        need(isinstance(k, int) and k >= min_generations, "num_generations", f"an integer >= {min_generations}")
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
    need(isinstance(config.max_steps, int) and config.max_steps >= -1, "max_steps",
         "-1 (no step limit: num_train_epochs decides), 0 (evaluate only, no training) or a positive number of steps")
    need(config.save_steps is None or config.save_steps > 0, "save_steps", "> 0 (a step count, or a fraction < 1 of "
         "the run)")
    need(config.save_total_limit is None or config.save_total_limit >= 1, "save_total_limit",
         "at least 1, or empty for no limit")
    need(config.num_train_epochs > 0, "num_train_epochs", "> 0")
    need(config.warmup_steps >= 0, "warmup_steps", ">= 0")
    need(config.output_dir is None or (isinstance(config.output_dir, str) and config.output_dir.strip() != ""),
         "output_dir", "a directory path (it is empty)")


# ---------------------------------------------------------------------------------------------------- trainer


# ---------------------------------------------------------------------------------------------------- the team
def validate_team_against_environment(agent_names: Sequence[str], env) -> None:
    """The team's agent names must be exactly the environment's roles."""
    roles = list(env.agents)
    if sorted(agent_names) != sorted(roles):
        raise ValueError(f"The agents {list(agent_names)} do not match the roles of {type(env).__name__}: {roles}. "
                         "Give one AgentSpec per role, named after it.")


def check_dataset(env, train_dataset: Dataset) -> None:
    """One row per task, with the columns the environment reads."""
    if train_dataset is None or len(train_dataset) == 0:
        raise ValueError("train_dataset is empty: it needs one row per task")
    env.validate_dataset_columns(list(train_dataset.column_names), name="train_dataset")


def check_context_length(specs: Sequence[AgentSpec], max_completion_length: int) -> None:
    """``max_completion_length`` fits the context of every agent's model (read from its config, no weights)."""
    for model in dict.fromkeys(s.model_name for s in specs):
        limit = context_length(model)
        if limit is not None and max_completion_length >= limit:
            raise ValueError(f"max_completion_length={max_completion_length} does not fit the context of {model} "
                             f"({limit} tokens, prompt included); lower it")
