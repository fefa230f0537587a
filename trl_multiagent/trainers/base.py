"""MultiAgentTrainer: the one training loop every trainer of trl-multiagent shares, and its config.

One step, top to bottom (:meth:`MultiAgentTrainer.training_step`):

1. rollout (every ``num_iterations`` steps): the trainer's sampler (its rollout topology, :mod:`trl_multiagent.rollout`)
   plays ``episodes_per_step`` tasks per process and returns :class:`~trl_multiagent.rollout.Experience`: rewards,
   group keys and the links of the tree, no advantages;
2. credit: the trainer's :meth:`~MultiAgentTrainer.assign_credit` turns them into returns and advantages with the
   pure functions of :mod:`trl_multiagent.credit`; behaviour / reference log-probs are then added only when the loss
   needs them (``num_iterations > 1`` or vLLM's importance sampling / ``beta > 0``);
3. update: for every policy, its adapter active, the policy objective on that policy's samples: the whole-response
   objective of MAGRPO Eq. 2 (``loss_type="response"``, :func:`~trl_multiagent.credit.losses.response_policy_loss`) or one
   of TRL's loss types; trainers with critics add their value losses (:meth:`~MultiAgentTrainer.auxiliary_loss`);
4. one optimizer step: one optimizer, one param group per policy and per critic (each its own learning rate), each
   group's gradient clipped to ``max_grad_norm`` on its own.

The trainers (MAGRPO, AT-GRPO, MHGPO, CoLLM-CC/DC, MAPoRL) are siblings over this class: each brings its config
fields, its sampler (:meth:`~MultiAgentTrainer.build_sampler`), its credit (:meth:`~MultiAgentTrainer.assign_credit`),
its critics, and, where its objective differs, its update. The private parts of TRL and transformers it rests on are
all in :mod:`trl_multiagent.trainers.compat`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from accelerate.utils import set_seed
from datasets import Dataset
from transformers import ProgressCallback, enable_full_determinism
from transformers.trainer_utils import TrainOutput

from trl_multiagent.credit.losses import RESPONSE_LOSS, response_policy_loss
from trl_multiagent.environments.base import Environment
from trl_multiagent.generation.frozen_weights import FROZEN_MATMUL_DTYPES
from trl_multiagent.generation.padding import left_pad, pad_token_id, right_pad, right_pad_values
from trl_multiagent.generation.prefixes import distinct_prefix_tokens, needed_attention_pairs
from trl_multiagent.generation.teacher_forcing import PrefixStore, lm_forward
from trl_multiagent.rollout import Experience, Sample
from trl_multiagent.runtime.memory import gradients_in_one_block, keep_freed_cpu_memory, release_freed_memory
from trl_multiagent.runtime.process import configure_threads
from trl_multiagent.team.pool import AgentPool, AgentSpec, check_frozen_policies, check_team
from trl_multiagent.trainers.async_rollouts import AsyncRollouts, running_rollouts
from trl_multiagent.trainers.base_config import (  # noqa: F401  (re-exported: the trainers import them from here)
    ROW_MEAN_LOSSES,
    TOKEN_MEAN_LOSSES,
    TOKEN_SUM_LOSSES,
    TRL_LOSS_TYPES,
    MultiAgentConfig,
    check_common_values,
    check_context_length,
    check_dataset,
    validate_team_against_environment,
)
from trl_multiagent.trainers.callbacks import MetricsFileCallback, TrainingProgressCallback
from trl_multiagent.trainers.compat import TeamTrainerSurface
from trl_multiagent.trainers.completions import GeneratedSamples, record_completions
from trl_multiagent.trainers.learning_signal import note_learning_signal
from trl_multiagent.trainers.micro_batches import loss_mask, prompt_grouped_chunks, store_per_token, weighted_chunks  # noqa: F401
from trl_multiagent.trainers.outputs import (
    check_checkpoint,
    check_output_dir,
    marked_running,
    resolve_checkpoint,
    write_run_status,
    write_summary,
)
from trl_multiagent.trainers.sharding import (
    average_gradients,
    average_stats,
    gathered_adapter_state,
    is_fsdp,
    layer_classes,
    plain_norm,
    refresh_parameters,
    sharded_adapter_loading,
    unsharded,
)
from trl_multiagent.trainers.signals import train_until_signal
from trl_multiagent.trainers.update_guard import add_skipped_updates, check_update, watch_optimizer_steps

logger = logging.getLogger(__name__)


class MultiAgentTrainer(TeamTrainerSurface):
    """The shared training loop of every multi-agent trainer (see the module docstring); not used directly.

    Args:
        agents: the team, as a list of [`AgentSpec`] (loaded here) or an already built [`AgentPool`].
        environment: a zero-argument factory returning a fresh environment (a class works), called once per task.
        args: the trainer's config (a [`MultiAgentConfig`] subclass; a TRL `GRPOConfig` is taken over: trl_args.py).
        train_dataset: one row per task, passed to the environment.
        callbacks: extra `transformers.TrainerCallback` objects.

    Every run writes `<output_dir>/metrics.jsonl`, `<output_dir>/summary.json`, `<output_dir>/run_status.json` and
    the final adapters under `<output_dir>/adapters/<policy>/`. Checkpoints (`save_steps`) hold every adapter, the
    optimizer (one param group per policy and critic), the scheduler, RNG states and counters;
    `resume_from_checkpoint` restores them. `generated_samples` counts the samples this process generated for
    training and their completion tokens ([`~trl_multiagent.trainers.completions.GeneratedSamples`]).
    """

    config_class: ClassVar[type] = MultiAgentConfig
    #: The algorithm's name in summaries.
    algorithm: ClassVar[str] = ""
    #: Config fields of the trainer's own that summary.json records.
    summary_fields: ClassVar[tuple[str, ...]] = ()
    #: The held-out evaluator when a recipe says ``evaluator: auto``; None: the one the environment calls for
    #: (:func:`~trl_multiagent.evaluation.evaluator_kind`).
    default_evaluator: ClassVar[str | None] = None
    #: Held-out evaluation samples at the training temperature (unless the recipe sets ``eval_temperature``), as the
    #: paper evaluates; False: greedy, unless the evaluator itself samples.
    evaluate_sampled: ClassVar[bool] = False

    def __init__(
        self,
        agents: Sequence[AgentSpec] | AgentPool,
        environment: Callable[[], Any],
        args: MultiAgentConfig,
        train_dataset: Dataset,
        callbacks: list | None = None,
        reward_funcs: Any = None,  # GRPOTrainer's keyword, refused: the environment's (trl_args.py)
    ):
        args = self.take_trl_args(args, reward_funcs)  # a GRPOConfig's fields taken over (compat.py)
        # ---- everything that can be checked, before any model loads
        agents = self.prepare_agents(agents, args)
        specs = list(agents.specs.values()) if isinstance(agents, AgentPool) else list(agents)
        check_team(specs)
        if args.use_vllm:  # a base vLLM can serve with LoRA, before any weights load
            from trl_multiagent.generation.vllm import check_vllm_team

            check_vllm_team(specs)
        probe = environment()
        self.validate_environment(probe, [s.name for s in specs], train_dataset, args)
        self.agent_order = list(probe.agents)
        critics = self.build_critics(specs, args)
        check_context_length(specs, args.max_completion_length)
        args.resume_from_checkpoint = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)  # true -> a path
        check_output_dir(args.output_dir, args.resume_from_checkpoint, args.overwrite_output_dir)
        check_checkpoint(args.resume_from_checkpoint, args.output_dir, sorted({s.policy for s in specs}),
                         [c.name for c in critics])
        check_frozen_policies(args.frozen_policies, {s.policy for s in specs})

        threads = configure_threads(args.num_threads)
        if threads:
            logger.info("torch uses %d CPU threads in this process (num_threads)", threads)
        if args.cpu_keep_freed_memory and keep_freed_cpu_memory():
            logger.info("this process keeps the CPU memory it frees (cpu_keep_freed_memory)")
        if isinstance(agents, AgentPool):
            self.check_pool(agents, args)
            pool = agents
        else:
            # The new LoRA adapters are initialised at random (lora_A); seed first so that two runs with the same
            # `seed` start from the same adapters (Trainer.__init__ seeds only after the model exists).
            enable_full_determinism(args.seed) if args.full_determinism else set_seed(args.seed)
            pool = AgentPool(specs, dtype=args.model_dtype, critics=critics,
                             dense_copy=args.dense_copy, packed_weights=args.packed_weights,
                             lean_decode=args.lean_decode, frozen_matmul_dtype=args.frozen_matmul_dtype)
        self.pool = pool
        pool.freeze_policies(args.frozen_policies)  # AT-GRPO's Table 4 ablation: a partner that acts but never learns
        if args.use_vllm and pool.generation_backend is None:  # colocate: an engine per base; server: vllm serve
            from trl_multiagent.generation.vllm_server import make_generation_backend

            pool.generation_backend = make_generation_backend(pool, args)
        self.pool._no_split_modules = layer_classes(pool)  # the blocks FSDP wraps as units (accelerate reads it)
        self.pool.prepare_for_training(args.temperature)
        self.environment_factory = environment
        self.sampler = self.build_sampler(args)
        self.init_trainer(self.pool, args, train_dataset, callbacks)
        self._buffered_inputs: Experience | None = None
        self._timings: dict[str, float] = defaultdict(float)
        self.generated_samples = GeneratedSamples()  # every rollout's samples, counted in sample()
        self.async_rollouts = AsyncRollouts(self) if args.max_staleness else None  # rollouts ahead (max_staleness)
        # As GRPOTrainer.__init__ does: one seed per process, or every process would sample the same completions
        # for the same prompt (the adapters were initialised above with the common seed, so they start equal).
        set_seed(args.seed, device_specific=True)
        if not args.disable_tqdm:  # a one-line rich bar (step, time left, reward) instead of tqdm's
            self.remove_callback(ProgressCallback)
            self.add_callback(TrainingProgressCallback())
        self.add_callback(MetricsFileCallback(args.output_dir))

    # ------------------------------------------------------------------------------------------------ hooks
    def prepare_agents(self, agents, args):
        """The team as the trainer runs it (MHGPO maps every agent to one shared policy here); called first."""
        return agents

    def validate_environment(self, probe, agent_names: Sequence[str], train_dataset: Dataset, args) -> None:
        """Check the environment (``probe``, one instance from the factory), the team and the dataset before any model
        loads. The default is the :class:`Environment` protocol; a trainer of another protocol overrides it."""
        if not isinstance(probe, Environment):
            raise TypeError(f"environment() must return an Environment, got {type(probe).__name__}")
        validate_team_against_environment(agent_names, probe)
        check_dataset(probe, train_dataset)
        weights = getattr(args, "reward_weights", None)
        if weights is not None and list(map(float, weights)) != list(getattr(probe, "reward_weights", None) or []):
            raise ValueError(f"reward_weights={list(weights)} in the config, but the environment weighs its own reward "
                             f"functions ({type(probe).__name__}: {getattr(probe, 'reward_weights', 'no weights')}): "
                             "pass the weights to the environment (FunctionEnvironment(..., reward_weights=...)) and "
                             "leave the config's reward_weights None")
        num_turns = getattr(args, "num_turns", 1)
        if num_turns > probe.max_turns:
            logger.warning("num_turns=%d exceeds the environment's max_turns=%d; episodes end at the environment's "
                           "budget.", num_turns, probe.max_turns)

    def build_critics(self, specs: Sequence[AgentSpec], args) -> list:
        """The critics (:class:`~trl_multiagent.team.critics.CriticSpec`) the pool adds to the team's bases (none here)."""
        return []

    def check_pool(self, pool: AgentPool, args) -> None:
        """A pool built by the caller must hold what the trainer needs (e.g. its critics)."""
        if getattr(pool, "frozen_matmul_dtype", torch.float32) != FROZEN_MATMUL_DTYPES[args.frozen_matmul_dtype]:
            raise ValueError(f"The AgentPool computes its frozen linears in {pool.frozen_matmul_dtype}, the config asks "
                             f"frozen_matmul_dtype={args.frozen_matmul_dtype!r}; build the pool with the same "
                             "frozen_matmul_dtype")
        wanted = {c.name for c in self.build_critics(list(pool.specs.values()), args)}
        missing = sorted(wanted - set(pool.critics))
        if missing:
            raise ValueError(f"The AgentPool lacks the critics {missing}; pass AgentSpecs (the trainer builds them) "
                             f"or build the pool with critics={type(self).__name__}.build_critics(...)")

    def build_sampler(self, args):
        """The rollout topology (a sampler of :mod:`trl_multiagent.rollout`); every trainer defines its own."""
        raise TypeError(f"{type(self).__name__} does not define build_sampler")

    def assign_credit(self, experience: Experience) -> None:
        """The credit stage: the returns, advantages and credit metrics (``rollout.credit_stats``) of one rollout,
        from the pure functions of :mod:`trl_multiagent.credit`, written onto ``experience``. Called once per rollout,
        right after the sampler's and before any log-prob pass; every trainer defines its own."""
        raise TypeError(f"{type(self).__name__} does not define assign_credit")

    # ------------------------------------------------------------------------------------------------ optimizer
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
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, self.pool)
            optimizer_kwargs.pop("lr", None)
            self.optimizer = optimizer_cls(groups, lr=self.args.learning_rate, **optimizer_kwargs)
            watch_optimizer_steps(self, self.optimizer)  # time/optimizer, skipped updates, vLLM's stale adapters
        return self.optimizer

    def clip_gradients(self):
        """Clip each policy's and each critic's gradient to ``max_grad_norm`` separately, so that one agent's large
        gradient never shrinks another agent's step. Logs every group's norm before clipping
        (``policy/<name>/grad_norm``, ``critic/<name>/grad_norm``) and returns the norm of all of them together
        (logged as ``grad_norm``); keeps the groups' norms for :meth:`check_update` (``group_grad_norms``)."""
        norms, self.group_grad_norms = [], {}
        for group in self.pool.trainable_groups():
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            norm = plain_norm(torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm))  # FSDP: all shards
            value = self.group_grad_norms[(group["kind"], group["name"])] = float(norm)
            self.log_metric(f"{group['kind']}/{group['name']}/grad_norm", value)
            norms.append(norm.detach().float())
        return torch.stack(norms).pow(2).sum().sqrt() if norms else torch.zeros(())

    def check_update(self, grad_norm) -> bool:
        """Right before each optimizer step: skip the update if its loss or gradient norm is not finite (update_guard)."""
        return check_update(self, grad_norm)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """``GRPOTrainer.log``, with ``skipped_updates`` in the training logs once an update was skipped."""
        add_skipped_updates(self, logs)
        super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------ the step
    def training_step(self, model, inputs, num_items_in_batch=None):
        start = time.perf_counter()
        if is_fsdp(self.accelerator) and not getattr(self, "_sharded_parameters", False):
            refresh_parameters(self.pool)  # FSDP replaced the adapters' parameters by sharded ones
            self._sharded_parameters = True
        model.train()
        # The phase of the num_iterations cycle comes from global_step (restored on resume), not from a counter of
        # this run's calls: a run resumed mid-cycle re-rolls (the buffer is not checkpointed) and stays in phase
        # with the task sampler, which hands out each chunk of tasks num_iterations times.
        if self.state.global_step % self.num_iterations == 0 or self._buffered_inputs is None:
            self._buffered_inputs = self.rollout(inputs)
        loss = self.step_loss = self.update(model, self._buffered_inputs)  # check_update reads it
        self.log_metric("step_time", time.perf_counter() - start)
        for name, seconds in self._timings.items():  # where the step's time went (the optimizer's is logged apart)
            self.log_metric(f"time/{name}", seconds)
        self._timings.clear()
        return loss

    @contextlib.contextmanager
    def timed(self, name: str):
        """Add the time of the block to this step's ``time/<name>`` (generation, environment, logprob_forwards,
        forward, backward, optimizer); under ``torch.profiler`` the block is a range of that name, so that a profile
        splits the step as the metrics do (``benchmarks/step_profile.py``)."""
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(f"time/{name}"):
                yield
        finally:
            self._timings[name] += time.perf_counter() - start

    @torch.no_grad()
    def rollout(self, tasks: Sequence[Mapping[str, Any]]) -> Experience:
        """Roll the team out on ``tasks`` and assign the credit (:meth:`assign_credit`); add behaviour log-probs when
        a rollout serves several updates (``num_iterations > 1``) or vLLM's importance sampling compares them with the
        engine's, and reference log-probs when ``beta > 0``, unless the rollout brought them (MAPoRL)."""
        with unsharded(self.pool):  # FSDP: the decoding loop and the reference call the bases directly
            return self._rollout(tasks)

    def _rollout(self, tasks: Sequence[Mapping[str, Any]]) -> Experience:
        experience = self.sample(tasks)
        self.assign_credit(experience)
        note_learning_signal(self, experience)  # warns when no advantage is non-zero, rollout after rollout
        # vLLM's importance-sampling correction compares the trainer's log-probs with the engine's (as in TRL)
        need_old = (self.num_iterations > 1 or (self.use_vllm and self.vllm_importance_sampling_correction)) and \
            any(s.old_logps is None for s in experience.samples)
        if need_old or self.beta != 0.0:
            for policy in self.pool.trained_policies:  # a frozen policy's samples enter no loss
                for chunk in prompt_grouped_chunks(experience.samples_of(policy),
                                                   self.args.per_device_train_batch_size):
                    batch = self.collate(policy, chunk)
                    with self.timed("logprob_forwards"):
                        if need_old:
                            store_per_token(chunk, "old_logps", self.logps(functools.partial(self.pool, policy), batch), batch)
                        if self.beta != 0.0:
                            with self.pool.reference(policy) as ref_model:
                                store_per_token(chunk, "ref_logps", self.logps(ref_model, batch), batch)
        if self.args.log_completions:
            record_completions(self, experience, tasks)
        for key, value in average_stats(experience.stats, self.accelerator.num_processes).items():  # over processes
            self.log_metric(key, value)
        release_freed_memory()  # the generation caches are gone; keep their pages from pinning the heap
        return experience

    def sample(self, tasks: Sequence[Mapping[str, Any]]) -> Experience:
        """The sampler's rollout of ``tasks``, timed: ``rollout_time``, and within it ``time/generation`` (the pool's
        team-level generation), ``time/environment`` (the rest: environment steps, rewards, sandboxed tests) and
        ``rollout_tokens_per_s`` (generated tokens per second of generation) and ``tokens/generated``. Each sample records its adapters'
        version (``global_step``); with ``max_staleness`` the rollout was generated ahead (async_rollouts.py)."""
        if self.async_rollouts is not None:
            return self.async_rollouts.take(tasks)
        before = dict(self.pool.generation_stats)
        start = time.perf_counter()
        # a profile's range of the rollout; the pool's generation within it is a range of its own (time/generation)
        with torch.profiler.record_function("time/environment"):
            experience = self.sampler.rollout(self.pool, self.environment_factory, list(tasks), self.generation_config)
        self.generated_samples.add(experience)
        for s in experience.samples:
            s.version = self.state.global_step
        elapsed = time.perf_counter() - start
        generation = self.pool.generation_stats["seconds"] - before["seconds"]
        tokens = self.pool.generation_stats["tokens"] - before["tokens"]
        self.log_metric("rollout_time", elapsed)
        self.log_metric("tokens/generated", float(tokens))
        self._timings["generation"] += generation
        self._timings["environment"] += max(0.0, elapsed - generation)
        if generation > 0:
            self.log_metric("rollout_tokens_per_s", tokens / generation)
        return experience

    def logps(self, model, batch, compute_entropy: bool = False):
        """Per-token log-probs of a collated batch's completion tokens (the one log-prob path); with
        ``compute_entropy`` also their entropies, as ``(logps, entropies)``."""
        logps, entropies = self.token_logps(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                            batch["completion_mask"], compute_entropy=compute_entropy)
        return (logps, entropies) if compute_entropy else logps

    def update(self, model, experience: Experience) -> torch.Tensor:
        """The policy objective for every policy, its adapter active, on that policy's samples of the step.

        ``loss_type="response"``: MAGRPO Eq. 2 (:func:`~trl_multiagent.credit.losses.response_policy_loss`); otherwise TRL's
        own loss. Each policy's loss is the mean (or the weighted sum, :meth:`sample_weights`) over ALL its samples
        of the step, computed in micro-batches whose gradients add up to it; policies' parameters are disjoint, so
        their losses are summed. Across processes, gradients are averaged once at the end (every process runs the
        same number of loss calls, so TRL's metric collectives stay aligned).
        """
        world = self.accelerator.num_processes
        # the token positions the update needs at least: every policy's distinct prompt prefixes once and every
        # completion (the physical bound of the forward and backward passes, benchmarks/targets.py)
        plan = {p: experience.samples_of(p) for p in self.pool.trained_policies}  # frozen policies: no loss
        completions = sum(len(s.generation.completion_ids) for rows in plan.values() for s in rows)
        self.log_metric("tokens/loss_completions", float(completions))
        self.log_metric("tokens/loss_needed", float(completions + sum(
            distinct_prefix_tokens([s.generation.prompt_ids for s in rows]) for rows in plan.values())))
        # and the (query, key) pairs their causal attention needs at least (the bound's attention FLOPs)
        self.log_metric("tokens/loss_attention_pairs", float(sum(
            needed_attention_pairs([s.generation.prompt_ids for s in rows],
                                   [len(s.generation.completion_ids) for s in rows]) for rows in plan.values())))
        # DDP: no synchronisation until one all-reduce at the end; FSDP reduce-scatters after every backward itself
        sync_at_end = world > 1 and not is_fsdp(self.accelerator)
        response = self.loss_type == RESPONSE_LOSS
        weights = {p: self.sample_weights(p, rows) for p, rows in plan.items()}
        if any(w is not None for w in weights.values()) and not response and self.loss_type not in ROW_MEAN_LOSSES:
            raise ValueError(f"per-sample loss weights need a per-response loss ({sorted(ROW_MEAN_LOSSES)} or "
                             f"{RESPONSE_LOSS!r}), got loss_type={self.loss_type!r}")
        chunked = {p: weighted_chunks(rows, weights[p], self.args.per_device_train_batch_size,
                                       equal_within=not response) for p, rows in plan.items()}
        chunk_counts = {p: len(chunked[p]) for p in plan}
        tokens = {p: sum(s.generation.own_token_count for s in rows) for p, rows in plan.items()}
        global_tokens = dict(tokens)
        if world > 1:  # every process runs as many loss calls per policy as the busiest one
            counts = torch.tensor([[chunk_counts[p], tokens[p]] for p in plan], dtype=torch.float64)
            maxed, summed = counts.clone(), counts.clone()
            dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
            dist.all_reduce(summed, op=dist.ReduceOp.SUM)
            for i, p in enumerate(plan):
                chunk_counts[p], global_tokens[p] = int(maxed[i, 0]), float(summed[i, 1])
        total_loss = torch.zeros((), device=self.accelerator.device)
        self.step_losses = dict.fromkeys(plan, 0.0)  # per policy, for check_update's warning
        try:
            with self.accelerator.no_sync(model) if sync_at_end else contextlib.nullcontext():
                for policy in plan:
                    chunks = chunked[policy]
                    if chunk_counts[policy] and not is_fsdp(self.accelerator):  # FSDP shards its gradients itself
                        gradients_in_one_block(self.pool.policy_parameters(policy))
                    # the prefixes the micro-batches share run once (their gradient is sent back after the last one)
                    with self.timed("forward"):
                        self.prefix_store = self.build_prefix_store(model, policy, chunks)
                    for c in range(chunk_counts[policy]):
                        chunk, row_weights = chunks[c] if c < len(chunks) else (None, None)
                        batch = self.collate(policy, chunk) if chunk else self.dummy_batch(policy)
                        if response:
                            w = torch.tensor(row_weights if chunk else [0.0], dtype=self.values_dtype)
                            with self.timed("forward"):
                                loss = self.response_loss(model, policy, batch, w.to(self.accelerator.device))
                        else:
                            if chunk is None:
                                weight = 0.0
                            elif self.loss_type in ROW_MEAN_LOSSES:
                                weight = sum(row_weights)  # equal weights within a chunk: row mean x chunk weight
                            elif self.loss_type in TOKEN_MEAN_LOSSES:
                                weight = loss_mask(batch).sum().item() / max(tokens[policy], 1)
                            else:  # TOKEN_SUM_LOSSES normalise by the global token count themselves
                                weight = 1.0
                                batch["num_items_in_batch"] = torch.tensor(float(global_tokens[policy]))
                            with self.timed("forward"):
                                loss = self.trl_loss(functools.partial(model, policy), batch) * weight
                        extra = self.auxiliary_loss(model, policy, chunk, batch, experience) if chunk else None
                        for term in (loss,) if extra is None else (loss, extra):
                            with self.timed("backward"):
                                self.accelerator.backward(term)
                            total_loss = total_loss + term.detach()
                            self.step_losses[policy] = self.step_losses[policy] + term.detach()
                    if self.prefix_store is not None:
                        with self.timed("backward"):
                            self.prefix_store.backward()
                        self.prefix_store = None
                    release_freed_memory()
        finally:  # a failed pass never leaves a store (and its graph) behind for later passes
            self.prefix_store = None
        if sync_at_end:
            self.average_gradients_across_processes()
        return total_loss

    def build_prefix_store(self, model, policy: str, chunks) -> PrefixStore | None:
        """The prompt prefixes that ``policy``'s micro-batches share, run once for all of them
        (:class:`~trl_multiagent.generation.teacher_forcing.PrefixStore`); ``None`` with one micro-batch (it shares them
        itself), without prefix sharing, and on CUDA (TRL's fused head computes the log-probs there)."""
        if len(chunks) < 2 or not self.share_prompt_prefixes or self.accelerator.device.type == "cuda":
            return None
        prompts = [s.generation.prompt_ids for chunk, _ in chunks for s in chunk]
        return PrefixStore.build(lm_forward(functools.partial(model, policy)), prompts, self.accelerator.device)

    def response_loss(self, model, policy: str, batch: dict[str, torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
        """MAGRPO Eq. 2 on one micro-batch of ``policy``'s responses (``weights``: each response's share of the
        policy's loss), through the one log-prob path; logs entropy, clipped fraction and KL as TRL's loss does."""
        logps, entropies = self.logps(functools.partial(model, policy), batch, compute_entropy=True)
        old = batch.get("old_per_token_logps")
        if "importance_sampling_ratio" in batch:  # vLLM's sequence-level correction weighs each response (as TRL)
            weights = weights * batch["importance_sampling_ratio"].view(-1)
        loss, stats = response_policy_loss(
            logps, logps.detach() if old is None else old, loss_mask(batch), batch["advantages"],
            self.epsilon_low, self.epsilon_high, ref_per_token_logps=batch.get("ref_per_token_logps"),
            beta=self.beta, weights=weights, delta=self.args.delta)
        if float(weights.sum()) > 0:  # not a zero-weight batch that only keeps processes in step
            mask = loss_mask(batch).to(entropies.dtype)
            self.log_metric("entropy", ((entropies * mask).sum() / mask.sum().clamp(min=1.0)).item())
            self.log_metric("clip_ratio/region_mean", stats["clipped"].mean().item())
            if self.beta != 0.0:
                self.log_metric("kl", stats["kl"].mean().item())
        return loss

    def auxiliary_loss(self, model, policy: str, chunk: Sequence[Sample], batch: dict[str, torch.Tensor],
                       experience: Experience) -> torch.Tensor | None:
        """One more term of the objective on a micro-batch of ``policy``'s update (``chunk``, collated as ``batch``),
        backpropagated after its policy loss; ``None`` here. MAPoRL adds its critics' value loss."""
        return None

    def sample_weights(self, policy: str, rows: Sequence[Sample]) -> list[float] | None:
        """Per-sample weights of one policy's loss (the loss is ``sum_s w_s * loss_s``), or ``None`` for the plain mean
        over its samples. A trainer whose objective weights samples unequally overrides it: MHGPO Eq. 6 (weights
        summing to 1), MAGRPO with H > 1 (Algorithm 1: one mean per turn, the turns summed)."""
        return None

    def average_gradients_across_processes(self) -> None:
        """Average the gradients of every optimizer group (policies and critics) over processes, in one collective."""
        average_gradients([g["params"] for g in self.pool.trainable_groups()], self.accelerator.num_processes)

    # ------------------------------------------------------------------------------------------------ batches
    @property
    def values_dtype(self) -> torch.dtype:
        """The dtype of the loss's per-sample values (advantages, old and reference log-probs, sample weights):
        float32 as TRL's, float64 with a float64 model (``model_dtype``), so that a float64 run is float64 end to
        end."""
        return torch.float64 if self.args.model_dtype == "float64" else torch.float32

    def collate(self, policy: str, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
        """Pad one policy's samples into the loss inputs (prompts left-padded, completions right-padded)."""
        pad = pad_token_id(self.pool.tokenizer_of(policy))
        c_len = max(max(len(s.generation.completion_ids) for s in samples), 1)
        prompt_ids, prompt_mask = left_pad([s.generation.prompt_ids for s in samples], pad)
        completion_ids, completion_mask = right_pad([s.generation.completion_ids for s in samples], pad, width=c_len)
        batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                 "completion_mask": completion_mask,
                 "advantages": torch.tensor([s.advantage for s in samples], dtype=self.values_dtype)}
        if any(s.generation.tool_mask is not None for s in samples):  # tool results: attended to, never trained on
            batch["tool_mask"] = right_pad_values(
                [s.generation.tool_mask if s.generation.tool_mask is not None else [1] * len(s.generation.completion_ids)
                 for s in samples], c_len, dtype=torch.long)
        for key, attr in (("old_per_token_logps", "old_logps"), ("ref_per_token_logps", "ref_logps")):
            if all(getattr(s, attr) is not None for s in samples):
                batch[key] = right_pad_values([getattr(s, attr) for s in samples], c_len, dtype=self.values_dtype)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            from trl_multiagent.generation.vllm import add_importance_sampling

            add_importance_sampling(batch, samples, self)
        return {k: v.to(self.accelerator.device) for k, v in batch.items()}

    def dummy_batch(self, policy: str) -> dict[str, torch.Tensor]:
        """A one-token batch with zero weight, run only to keep collectives aligned across processes."""
        tok = self.pool.tokenizer_of(policy)
        eos = tok.eos_token_id if tok.eos_token_id is not None else 0
        one = torch.tensor([[eos]], device=self.accelerator.device)
        batch = {"prompt_ids": one, "prompt_mask": torch.ones_like(one), "completion_ids": one.clone(),
                 "completion_mask": torch.ones_like(one), "advantages": torch.zeros(1, device=one.device)}
        if self.beta != 0.0:
            batch["ref_per_token_logps"] = torch.zeros((1, 1), device=one.device)
        if self.num_iterations > 1 or (self.use_vllm and self.vllm_importance_sampling_correction):
            batch["old_per_token_logps"] = torch.zeros((1, 1), device=one.device)
        if self.use_vllm and self.vllm_importance_sampling_correction:
            batch["sampling_per_token_logps"] = torch.zeros((1, 1), device=one.device)
            batch["importance_sampling_ratio"] = torch.ones((1, 1), device=one.device)
        return batch

    # ------------------------------------------------------------------------------------------------ saving
    def save_team(self, output_dir: str) -> None:
        """Every policy's adapter (and every critic) under ``<output_dir>/adapters/`` (not the frozen bases). Under FSDP
        every process takes part (the adapters are gathered from their shards) and the main process writes."""
        if is_fsdp(self.accelerator):
            with gathered_adapter_state(self.pool), tempfile.TemporaryDirectory() as scratch:
                self.pool.save_adapters(output_dir if self.args.should_save else scratch)
        elif self.args.should_save:
            self.pool.save_adapters(output_dir)
        if self.args.should_save:
            self.save_training_args(output_dir)  # whole or not at all (compat)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """``Trainer.save_model``; under FSDP every process saves the team (:meth:`save_team` gathers the adapters
        only, where transformers would first gather the whole model onto the main process)."""
        if is_fsdp(self.accelerator):
            self._save(output_dir if output_dir is not None else self.args.output_dir)
            return
        super().save_model(output_dir, _internal_call)

    def load_team(self, checkpoint_dir: str) -> None:
        logger.info("Loading adapters from %s", checkpoint_dir)
        with sharded_adapter_loading(self.pool) if is_fsdp(self.accelerator) else contextlib.nullcontext():
            self.pool.load_adapters(checkpoint_dir)

    def train(self, resume_from_checkpoint=None, *args, **kwargs) -> TrainOutput:
        """Train, then write the final adapters and ``<output_dir>/summary.json``. ``run_status.json`` marks the
        output directory ``running`` meanwhile and ``finished`` at the end (SIGINT / SIGTERM: signals.py)."""
        resume_from_checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)  # true -> a path
        check_checkpoint(resume_from_checkpoint, self.args.output_dir, list(self.pool.policies),
                         list(self.pool.critics))
        # run_status "failed" with the error if it raises; asynchronous rollouts (max_staleness) closed at the end
        with marked_running(self.args.output_dir, self.args.should_save), running_rollouts(self.async_rollouts):
            output = train_until_signal(self, super().train, resume_from_checkpoint, *args, **kwargs)
            self.save_model(self.args.output_dir)  # a non-finite adapter raises, writing nothing
        if self.args.should_save:
            write_summary(self, output)
            write_run_status(self.args.output_dir, "finished")
        return output

    def summary(self) -> dict[str, Any]:
        """What this trainer adds to ``summary.json`` beyond the common part: its own config fields."""
        return {"config": {k: getattr(self.args, k) for k in self.summary_fields}}
