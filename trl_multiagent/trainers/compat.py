"""The private surface of TRL and transformers that the trainers rely on, all in this module.

A team is not one model, so the trainers do not run ``GRPOTrainer.__init__`` (it builds one model, one tokenizer and
one generation path): :meth:`TeamTrainerSurface.init_trainer` runs ``transformers.Trainer.__init__`` with the
:class:`~trl_multiagent.team.pool.AgentPool` as the model and then sets the attributes that GRPOTrainer's loss and
logging read. Everything else private is an override or a call below, each naming the method it mirrors, as of the
versions in :data:`TESTED_VERSIONS` (``pyproject.toml`` pins trl and transformers to those minor ranges; the whole
suite passed on each end of each range, ``experiments/compat/``).
``tests/test_compat.py`` fails loudly when a signature in :data:`MIRRORED` changes, or when TRL's loss or logging
reads an attribute that :meth:`TeamTrainerSurface.set_grpo_state` does not set.

Above this module the trainers use only public names: they call :meth:`~TeamTrainerSurface.trl_loss`,
:meth:`~TeamTrainerSurface.token_logps` (also what TRL's own loss reaches, through the override of
``_get_per_token_logps_and_entropies``) and :meth:`~TeamTrainerSurface.log_metric`, and implement ``save_team``,
``load_team``, ``clip_gradients`` and ``check_update`` (:class:`~trl_multiagent.trainers.base.MultiAgentTrainer`
does), which the overrides here call.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict, deque

import torch
from transformers import GenerationConfig, PrinterCallback, Trainer
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler, disable_dropout_in_model, identity

from trl_multiagent.generation.logprobs import completion_logps
from trl_multiagent.runtime.atomic_files import write_atomically
from trl_multiagent.trainers.checkpoint_staging import staged_checkpoint
from trl_multiagent.trainers.sharding import is_fsdp
from trl_multiagent.trainers.trl_args import trainer_config

#: package -> (lowest, highest) minor release the whole suite passed on (experiments/compat/, one package moved at a
#: time); the pins in pyproject.toml are exactly these ranges.
TESTED_VERSIONS = {"trl": ("1.16", "1.16"), "transformers": ("5.24", "5.25")}

#: Every private method overridden or called here -> its signature in the tested versions.
MIRRORED = {
    "transformers.Trainer._save": "(self, output_dir: str | None = None, state_dict: dict | None = None) -> None",
    "transformers.Trainer._save_checkpoint": "(self, model: torch.nn.modules.module.Module, "
                                             "trial: 'optuna.Trial | dict[str, Any] | None') -> None",
    "transformers.Trainer._get_output_dir": "(self, trial: 'optuna.Trial | dict[str, Any] | None') -> str",
    "transformers.Trainer._load_from_checkpoint": "(self, resume_from_checkpoint: str, "
                                                  "model: torch.nn.modules.module.Module | None = None) -> None",
    "transformers.Trainer._remove_unused_columns": "(self, dataset: 'datasets.Dataset', "
                                                   "description: str | None = None) -> 'datasets.Dataset'",
    "transformers.Trainer._set_signature_columns_if_needed": "(self) -> None",
    "transformers.Trainer._get_train_sampler": "(self, train_dataset: torch.utils.data.dataset.Dataset | None = None) "
                                               "-> torch.utils.data.sampler.Sampler | None",
    "transformers.Trainer._get_dataloader": "(self, dataset: torch.utils.data.dataset.Dataset, description: str, "
                                            "batch_size: int, sampler_fn: collections.abc.Callable[["
                                            "torch.utils.data.dataset.Dataset], torch.utils.data.sampler.Sampler] "
                                            "| None = None, is_training: bool = False, "
                                            "dataloader_key: str | None = None) -> "
                                            "torch.utils.data.dataloader.DataLoader",
    "transformers.Trainer._clip_grad_norm": "(self, model)",
    "transformers.Trainer.get_batch_samples": "(self, epoch_iterator: collections.abc.Iterator, num_batches: int, "
                                              "device: torch.device) -> tuple[list, torch.Tensor | int | None]",
    "transformers.Trainer._get_grad_norm": "(self, model, grad_norm=None)",
    "trl.GRPOTrainer._compute_loss": "(self, model, inputs)",
    "trl.GRPOTrainer._get_per_token_logps_and_entropies": "(self, model, input_ids, attention_mask, logits_to_keep, "
                                                          "batch_size=None, compute_entropy=False, "
                                                          "compute_aux_loss=False, pixel_values=None, "
                                                          "image_grid_thw=None, num_images=None, "
                                                          "pixel_attention_mask=None, spatial_shapes=None, "
                                                          "num_tiles=None, image_sizes=None, token_type_ids=None, "
                                                          "mm_token_type_ids=None, image_position_ids=None) -> "
                                                          "tuple[torch.Tensor, torch.Tensor | None, "
                                                          "torch.Tensor | None]",
}


class TeamTrainerSurface(GRPOTrainer):
    """The seam between a team trainer and the private parts of ``GRPOTrainer`` / ``transformers.Trainer``."""

    # ------------------------------------------------------------------------------------------------ set-up
    def take_trl_args(self, args, reward_funcs=None):
        """The config the trainer runs with: ``args`` as it is, or a plain TRL ``GRPOConfig``'s fields taken over into
        the trainer's ``config_class``; ``reward_funcs`` (``GRPOTrainer``'s keyword) refused in one line
        (:func:`~trl_multiagent.trainers.trl_args.trainer_config`)."""
        return trainer_config(self.config_class, args, reward_funcs)

    def init_trainer(self, pool, args, train_dataset, callbacks) -> None:
        """``transformers.Trainer.__init__`` with the pool as the model (instead of ``GRPOTrainer.__init__``), then
        the state GRPOTrainer's loss and logging read; ``disable_dropout`` applied to every base and adapter as
        ``GRPOTrainer.__init__`` applies it to its model, and ``print_logs: false`` honoured under ``disable_tqdm``
        (transformers' PrinterCallback prints each dict there)."""
        first_tokenizer = next(iter(pool.tokenizers.values()))
        Trainer.__init__(self, model=pool, args=args, data_collator=identity, train_dataset=train_dataset,
                         processing_class=first_tokenizer, callbacks=callbacks)
        if args.disable_dropout:
            disable_dropout_in_model(pool)
        if not getattr(args, "print_logs", True):
            self.remove_callback(PrinterCallback)
        self.set_grpo_state(args)

    def set_grpo_state(self, args) -> None:
        """The attributes that ``GRPOTrainer._compute_loss``, ``_get_per_token_logps_and_entropies`` and ``log``
        (trl 1.16) read, set from the config as GRPOTrainer.__init__ would."""
        self.loss_type = args.loss_type
        self.beta = args.beta
        self.ref_model = None  # the reference is the base with the adapter disabled
        self.num_iterations = args.num_iterations
        self.epsilon_low = args.epsilon
        self.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
        self.importance_sampling_level = args.importance_sampling_level
        self.top_entropy_quantile = args.top_entropy_quantile
        self.off_policy_mask_threshold = args.off_policy_mask_threshold
        self.aux_loss_enabled = False  # no MoE load-balancing loss (router_aux_loss_coef is then unused)
        self.router_aux_loss_coef = 0.0
        self.use_vllm = args.use_vllm  # generation through vLLM (trl_multiagent.generation.vllm); TRL's correction:
        self.vllm_importance_sampling_correction = args.use_vllm and args.vllm_importance_sampling_correction
        self.vllm_importance_sampling_mode = args.vllm_importance_sampling_mode
        self.vllm_importance_sampling_clip_min = args.vllm_importance_sampling_clip_min
        self.vllm_importance_sampling_clip_max = args.vllm_importance_sampling_clip_max
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
        self.num_completions_to_print = args.num_completions_to_print
        self.log_unique_prompts = args.log_unique_prompts
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._logs = {"prompt": deque(), "completion": deque(), "rewards": defaultdict(deque), "advantages": deque(),
                      "extra": defaultdict(deque), "images": deque()}
        self.generation_config = GenerationConfig(
            max_new_tokens=args.max_completion_length, do_sample=True, temperature=args.temperature,
            top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
            **(args.generation_kwargs or {}))

    # ------------------------------------------------------------------------------------------------ overrides
    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Mirrors ``transformers.Trainer._save``: saves the team (adapters, not the frozen bases)."""
        self.save_team(output_dir if output_dir is not None else self.args.output_dir)

    def _save_checkpoint(self, model, trial) -> None:
        """Mirrors ``transformers.Trainer._save_checkpoint``, skipping GRPOTrainer's model card (a team is not one hub
        model), and writes the checkpoint whole or not at all: into a temporary folder, renamed when complete
        (:func:`~trl_multiagent.trainers.checkpoint_staging.staged_checkpoint`)."""
        with staged_checkpoint(self, trial) as staging:
            self._checkpoint_staging = staging
            try:
                Trainer._save_checkpoint(self, model, trial)
            finally:
                self._checkpoint_staging = None

    def _get_output_dir(self, trial) -> str:
        """Mirrors ``transformers.Trainer._get_output_dir``: the temporary folder while a checkpoint is written."""
        staging = getattr(self, "_checkpoint_staging", None)
        return staging if staging is not None else super()._get_output_dir(trial)

    def save_training_args(self, output_dir: str) -> None:
        """``training_args.bin`` in ``output_dir``, as transformers writes it, whole or not at all."""
        write_atomically(os.path.join(output_dir, "training_args.bin"), lambda tmp: torch.save(self.args, tmp))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None) -> None:
        """Mirrors ``transformers.Trainer._load_from_checkpoint``: loads the team's adapters."""
        self.load_team(resume_from_checkpoint)

    def _remove_unused_columns(self, dataset, description=None):
        """Mirrors ``transformers.Trainer._remove_unused_columns``: keeps every column (environments read any)."""
        return dataset

    def _set_signature_columns_if_needed(self) -> None:
        """Mirrors ``transformers.Trainer._set_signature_columns_if_needed``: no model signature to filter by."""
        self._signature_columns = []

    def get_train_dataloader(self):
        """Batches of ``episodes_per_step`` tasks (dataset rows), through ``transformers.Trainer._get_dataloader``."""
        return self._get_dataloader(dataset=self.train_dataset, description="Training",
                                    batch_size=self.args.episodes_per_step, sampler_fn=self._get_train_sampler,
                                    is_training=True)

    def _get_train_sampler(self, train_dataset=None):
        """Mirrors ``transformers.Trainer._get_train_sampler``: :meth:`task_sampler`."""
        return self.task_sampler(self.train_dataset if train_dataset is None else train_dataset)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """Mirrors ``transformers.Trainer.get_batch_samples`` (the loop takes each step's batches through it): with
        asynchronous rollouts (``max_staleness``) the epoch's batches pass through a look-ahead, which hands over the
        same batches in the same order and lets the next steps' rollouts start early
        (:class:`~trl_multiagent.trainers.async_rollouts.Lookahead`)."""
        rollouts = getattr(self, "async_rollouts", None)
        if rollouts is not None:
            epoch_iterator = rollouts.lookahead(epoch_iterator)
        return super().get_batch_samples(epoch_iterator, num_batches, device)

    def _clip_grad_norm(self, model):
        """Mirrors ``transformers.Trainer._clip_grad_norm``: :meth:`clip_gradients`."""
        self.accelerator.unscale_gradients()
        return self.clip_gradients()

    def _get_grad_norm(self, model, grad_norm=None):
        """Mirrors ``transformers.Trainer._get_grad_norm``, which the training loop calls once per optimizer step
        whatever ``max_grad_norm`` (after :meth:`_clip_grad_norm`, right before ``optimizer.step()``): the norm as
        transformers returns it, after :meth:`check_update` saw it (a non-finite loss or norm skips the update)."""
        grad_norm = super()._get_grad_norm(model, grad_norm)
        self.check_update(grad_norm)
        return grad_norm

    # ------------------------------------------------------------------------------------------------ calls into TRL
    def trl_loss(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """TRL's own loss of ``loss_type`` on one micro-batch (``trl.GRPOTrainer._compute_loss``)."""
        return self._compute_loss(model, batch)

    def token_logps(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                    compute_entropy: bool = False):
        """Per-token log-probs (and entropies) of the completion tokens at the sampling temperature: on CPU
        :func:`trl_multiagent.generation.logprobs.completion_logps` (shared prompts, a plain LM head), on CUDA TRL's fused LM
        head (``trl.GRPOTrainer._get_per_token_logps_and_entropies``), which keeps the logits out of GPU memory."""
        if completion_ids.device.type == "cuda":
            input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
            attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
            logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(
                self, model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=compute_entropy)
            return logps, entropies
        return completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, self.temperature,
                                compute_entropy=compute_entropy, share_prompts=self.share_prompt_prefixes,
                                prefix_store=getattr(self, "prefix_store", None))

    @property
    def share_prompt_prefixes(self) -> bool:
        """``args.share_prompt_prefixes``; unset: on, except under FSDP (see the config field)."""
        share = getattr(self.args, "share_prompt_prefixes", None)
        return (not is_fsdp(self.accelerator)) if share is None else bool(share)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """Mirrors ``trl.GRPOTrainer._get_per_token_logps_and_entropies`` (what TRL's own loss calls): the last
        ``logits_to_keep`` columns are the completion; :meth:`token_logps` computes them (no aux loss: text models)."""
        split = input_ids.size(1) - logits_to_keep
        logps, entropies = self.token_logps(model, input_ids[:, :split], attention_mask[:, :split],
                                            input_ids[:, split:], attention_mask[:, split:], compute_entropy)
        return logps, entropies, None

    def log_metric(self, key: str, value: float, mode: str = "train") -> None:
        """One value of a metric; ``GRPOTrainer.log`` averages them per logging step."""
        self._metrics[mode][key].append(value)

    # ------------------------------------------------------------------------------------------------ defaults
    def task_sampler(self, dataset):
        """Each chunk of (episodes_per_step x processes) tasks is handed out ``num_iterations`` times in a row, so that
        every process sees its own tasks for as many steps as a rollout is reused (as TRL's GRPOTrainer does)."""
        return RepeatSampler(data_source=dataset, mini_repeat_count=1,
                             batch_size=self.args.episodes_per_step * self.accelerator.num_processes,
                             repeat_count=self.num_iterations, shuffle=self.shuffle_dataset, seed=self.args.seed)
