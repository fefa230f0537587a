"""The config fields inherited from TRL's ``GRPOConfig`` that no code of a team trainer reads, refused at config time.

Every trainer config extends ``GRPOConfig``, so it accepts all of its fields; but the trainers do not run
``GRPOTrainer.__init__`` nor its generation (:mod:`trl_multiagent.trainers.compat`: a team is not one model), and a
field that only those read would be accepted and then ignored. Each such field is listed here with what stands in
for it, and :func:`refuse_unused_fields` (run first by ``MultiAgentConfig.__post_init__``) refuses any value other
than its default with one line: ``X is a GRPOConfig field this library does not use: ...``. Defaults stay accepted,
so a config or a recipe that leaves them alone is unaffected.

A few fields are accepted and deliberately inert (:data:`INERT_FIELDS`, each with its reason): refusing them would
break launchers or configs carried over from TRL, and their value changes nothing here.

``tests/test_config_fields.py`` walks every field of every trainer config and fails on one that nothing reads: not
this library, not the parts of transformers' ``Trainer`` and TRL's ``GRPOTrainer`` that the trainers run, and not
listed here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: ``GRPOConfig`` fields read only by ``GRPOTrainer.__init__`` or its generation, which the team trainers do not run
#: (and a few inherited from ``TrainingArguments`` that only code the trainers replace reads): name -> what this
#: library does instead. A value other than the default is refused (:func:`refuse_unused_fields`).
UNUSED_GRPO_FIELDS: dict[str, str] = {
    "model_init_kwargs": "each agent's model is loaded from its AgentSpec (model, quantization) with the config's "
                         "model_dtype",
    "trust_remote_code": "the agents' models load without remote code (give a local checkpoint of a supported "
                         "architecture)",
    "cast_lm_head_to_fp32": "the log-probs are computed in float32 from the bases' hidden states as they are",
    "chat_template_kwargs": "each agent's prompt is rendered with its tokenizer's chat template by the environment's "
                            "prompts; change the template or the prompt instead",
    "pad_to_multiple_of": "each batch is padded to its longest row",
    "cache_implementation": "generation runs the library's own decoding loop (or vLLM with use_vllm) with its own "
                            "key-value cache",
    "use_transformers_continuous_batching": "generation runs the library's own batched decoding loop (or vLLM with "
                                            "use_vllm)",
    "use_transformers_paged": "generation runs the library's own batched decoding loop (or vLLM with use_vllm)",
    "transformers_continuous_batching_config": "generation runs the library's own batched decoding loop (or vLLM "
                                               "with use_vllm)",
    "max_tool_calling_iterations": "tool calls belong to the environment (TRLEnvironmentTeam's "
                                   "max_tool_calls_per_turn; math_tool's turns)",
    "mask_truncated_completions": "truncated completions are trained on as they are (completions/clipped_ratio "
                                  "shows how many there are; raise max_completion_length)",
    "multi_objective_aggregation": "the environment sums its weighted reward functions (reward_weights) into the "
                                   "team reward and the credit normalises it per group (scale_rewards)",
    "num_generations_eval": "the held-out evaluation samples eval_num_samples responses per task",
    "sync_ref_model": "the reference is each agent's base with its adapter switched off, never synced",
    "ref_model_mixup_alpha": "the reference is each agent's base with its adapter switched off, never synced",
    "ref_model_sync_steps": "the reference is each agent's base with its adapter switched off, never synced",
    "log_completions_hub_repo": "log_completions writes completions.jsonl and sends the table to report_to's "
                                "trackers",
    "log_multimodal": "the agents are text models",
    "ds3_gather_for_generation": "DeepSpeed is not supported (FSDP2 is)",
    "vllm_group_port": "vllm_mode: server loads each policy's LoRA adapter files through the server's HTTP API "
                       "(vllm_server_base_url or vllm_server_host/port); no weights travel over an NCCL group",
    "router_aux_loss_coef": "no mixture-of-experts load-balancing loss is added to the policy loss",
    # TrainingArguments fields (GRPOConfig's too) that only transformers' evaluation loop, its default loss or its
    # train sampler read: the trainers evaluate with the library's own evaluators, compute their own losses and draw
    # tasks with their own sampler (compat.py: task_sampler)
    "label_smoothing_factor": "the policy losses are the trainers' own (or TRL's); transformers' label smoothing of "
                              "a language-modelling loss never applies",
    "train_sampling_strategy": "tasks are drawn by the trainer's task sampler (shuffled per epoch as TRL's "
                               "GRPOTrainer draws prompts; shuffle_dataset: false keeps their order)",
    "length_column_name": "tasks are drawn by the trainer's task sampler, never grouped by length",
    "prediction_loss_only": "the held-out evaluation is the library's own (evaluator, eval_* fields of the recipe); "
                            "transformers' evaluation loop never runs",
    "eval_accumulation_steps": "the held-out evaluation is the library's own (evaluator, eval_* fields of the "
                               "recipe); transformers' evaluation loop never runs",
    "eval_do_concat_batches": "the held-out evaluation is the library's own (evaluator, eval_* fields of the "
                              "recipe); transformers' evaluation loop never runs",
    "include_for_metrics": "the held-out evaluation is the library's own (evaluator, eval_* fields of the recipe); "
                           "transformers' evaluation loop never runs",
}

#: Values besides the field's default that mean the same as the default (``pad_to_multiple_of``: TRL's ``"auto"`` is
#: ``None`` off Neuron devices, and ``GRPOConfig.__post_init__`` writes it so).
EQUIVALENT_DEFAULTS: dict[str, tuple[Any, ...]] = {"pad_to_multiple_of": (None, "auto")}

#: Fields accepted and deliberately inert, with the reason (nothing reads them; a value changes nothing).
INERT_FIELDS: dict[str, str] = {
    # torch.distributed.launch (deprecated) passes --local_rank to the script, so the command line must accept it;
    # transformers and this library read the process's rank from the LOCAL_RANK environment variable instead.
    "local_rank": "set by the deprecated torch.distributed.launch; the rank is read from LOCAL_RANK",
    # transformers documents them as read by the user's own training script, never by Trainer; a script ported from
    # TRL may set them (trl grpo's examples pass --do_train)
    "do_train": "transformers' flag for the user's own script; Trainer never reads it",
    "do_predict": "transformers' flag for the user's own script; Trainer never reads it",
}


def field_default(config_class: type, name: str) -> Any:
    """The default of field ``name`` of ``config_class`` (its ``default_factory`` called where it has one)."""
    f = {f.name: f for f in dataclasses.fields(config_class)}[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def refuse_unused_fields(config) -> None:
    """Raise ``ValueError`` (one line) when ``config`` sets a field of :data:`UNUSED_GRPO_FIELDS` to anything but its
    default, naming the field and what this library does instead. Run before ``GRPOConfig.__post_init__``, which
    rewrites some of them (``use_transformers_paged``, ``pad_to_multiple_of``)."""
    names = {f.name for f in dataclasses.fields(config)}
    for name, instead in UNUSED_GRPO_FIELDS.items():
        if name not in names:
            continue
        value, default = getattr(config, name), field_default(type(config), name)
        accepted = (default, *EQUIVALENT_DEFAULTS.get(name, ()))
        if not any(value is a or (value == a and isinstance(value, bool) == isinstance(a, bool)) for a in accepted):
            raise ValueError(f"{name} is a GRPOConfig field this library does not use: {instead}. Leave it at its "
                             f"default ({default!r}); got {value!r}")


__all__ = ["EQUIVALENT_DEFAULTS", "INERT_FIELDS", "UNUSED_GRPO_FIELDS", "field_default", "refuse_unused_fields"]
