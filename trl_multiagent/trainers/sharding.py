"""Sharded training of a team: what runs under FSDP (through accelerate) and what is refused, and why.

A team is one :class:`~trl_multiagent.team.pool.AgentPool` (each distinct base once, every policy a LoRA adapter on
it). Under ``accelerate launch --config_file recipes/accelerate_configs/fsdp.yaml`` accelerate shards the pool with
FSDP2 (``fully_shard``): every decoder layer is one FSDP unit holding its slice of the frozen base AND of every
agent's adapter, the pool itself is the root unit (embeddings, final norm, LM head, value heads). What the trainer
does differently under FSDP (:class:`~trl_multiagent.trainers.base.MultiAgentTrainer`):

* **update**: every backward pass reduce-scatters its gradients (FSDP's own averaging over processes) instead of the
  ``no_sync`` + one all-reduce of the DDP path; every process already runs the same number of loss calls per policy
  (zero-weight batches where it has fewer samples), so FSDP's collectives stay in step and the sum of the averaged
  micro-batch gradients is the same average as DDP's.
* **per-agent clipping**: each policy's gradient norm is the norm over all shards (a DTensor reduction), so one
  agent's clipping is the same as on one process.
* **rollout** (generation, behaviour and reference log-probs): the team's decoding loop calls the bases directly,
  outside FSDP's forward, so the rollout runs inside :func:`unsharded`: every FSDP unit is all-gathered once and kept
  whole until the rollout ends (as TRL summons full parameters for generation), then resharded.
* **adapters saved and loaded**: the LoRA tensors are gathered from their shards when saved (all processes take
  part, the main process writes) and scattered back to their shards when loaded (:func:`gathered_adapter_state`,
  :func:`sharded_adapter_loading`).

Refused before any model loads (:func:`check_parallelism`), each with its reason: DeepSpeed (its engine owns backward
and the optimizer step: it reduces gradients inside every backward pass and clips one global norm, so the per-agent
clipping of every trainer would silently become one team-wide clip, and ZeRO-3's partitioned weights would need
gathering inside the team's own decoding loop; FSDP2 shards the same things as ZeRO-3), FSDP1 (deprecated by
transformers; the trainer implements FSDP2's gathering), the trainers with critics under FSDP (CoLLM-CC/DC and
MAPoRL: their value heads run outside the pool's FSDP forward and their critic losses take a per-process number of
backward passes, which FSDP's collectives cannot follow; ``fsdp_refusal`` of their configs), and FSDP on a machine
without an accelerator (accelerate enables FSDP only on GPUs and would silently run plain DDP instead).

The private parts of torch's FSDP2 this module reads (the reshard-after-forward setting of an FSDP unit) are named
where they are used.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

#: Where a refused parallelism is explained (docs/guides/distributed.md).
GUIDE = "docs/guides/distributed.md"


# ---------------------------------------------------------------------------------------------------- checks
def _env_true(name: str) -> bool:
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes")


def requested_parallelism(config) -> tuple[str | None, int | None]:
    """What the launch asks for: ``("fsdp", version)``, ``("deepspeed", None)`` or ``(None, None)``, from the
    config's own ``fsdp`` / ``deepspeed`` fields or the environment ``accelerate launch`` sets from its config file
    (``ACCELERATE_USE_FSDP``, ``FSDP_VERSION``, ``ACCELERATE_USE_DEEPSPEED``)."""
    if getattr(config, "deepspeed", None) or _env_true("ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed", None
    fsdp_args = getattr(config, "fsdp", None)
    if fsdp_args or _env_true("ACCELERATE_USE_FSDP"):
        fsdp_config = getattr(config, "fsdp_config", None) or {}
        version = os.environ.get("FSDP_VERSION") if _env_true("ACCELERATE_USE_FSDP") else None
        if version is None:
            version = fsdp_config.get("version", fsdp_config.get("fsdp_version", 2))
        return "fsdp", int(version)
    return None, None


def accelerator_available() -> bool:
    """Whether this machine has an accelerator (GPU) that accelerate can run FSDP on."""
    return torch.accelerator.is_available()


def check_parallelism(config) -> None:
    """Refuse, before any model loads, the parallelisms the trainers cannot run as they should (module docstring)."""
    kind, version = requested_parallelism(config)
    if kind == "deepspeed":
        raise ValueError(
            "DeepSpeed (ZeRO-2/3) is not supported by the multi-agent trainers: DeepSpeed's engine owns backward and "
            "the optimizer step, reduces gradients inside every backward pass and clips one global gradient norm, so "
            "each agent's own clipping (max_grad_norm per policy) would silently become one clip of the whole team, "
            "and ZeRO-3's partitioned weights would have to be gathered inside the team's decoding loop. Use FSDP "
            "(recipes/accelerate_configs/fsdp.yaml), which shards parameters, gradients and optimizer states as "
            f"ZeRO-3 does, or DDP (recipes/accelerate_configs/ddp.yaml). See {GUIDE}.")
    if kind == "fsdp":
        if version != 2:
            raise ValueError(
                f"FSDP version {version} is not supported: the multi-agent trainers run FSDP2 (fully_shard); set "
                f"fsdp_version: 2 in the accelerate config (recipes/accelerate_configs/fsdp.yaml). See {GUIDE}.")
        if getattr(config, "share_prompt_prefixes", None):
            raise ValueError("share_prompt_prefixes: true cannot run under FSDP: FSDP2 frees a layer's gathered "
                             "weights after each forward, and the shared passes run several forwards before one "
                             f"backward. Leave it unset (or false) under FSDP. See {GUIDE}.")
        refusal = getattr(config, "fsdp_refusal", None)
        if refusal:
            raise ValueError(f"{type(config).__name__} does not run under FSDP: {refusal}. Train it with DDP "
                             f"(recipes/accelerate_configs/ddp.yaml; a 4-bit base keeps a 7B team on one GPU each). "
                             f"See {GUIDE}.")
        if not accelerator_available():
            raise ValueError(
                "FSDP was requested on a machine without a GPU: accelerate enables FSDP only on accelerators and would "
                "silently train with plain data parallelism instead. On CPUs use recipes/accelerate_configs/ddp.yaml "
                f"(or torchrun); see {GUIDE}.")


# ---------------------------------------------------------------------------------------------------- state
def is_fsdp(accelerator) -> bool:
    """Whether ``accelerator`` shards the model with FSDP2."""
    return bool(getattr(accelerator, "is_fsdp2", False))


def layer_classes(pool) -> list[str]:
    """The names of the blocks FSDP wraps as units: every base's ``_no_split_modules`` (its decoder layers)."""
    names: list[str] = []
    for base in pool.bases.values():
        names += list(getattr(base.get_base_model(), "_no_split_modules", None) or [])
    return list(dict.fromkeys(names))


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    """The FSDP2 units of ``model``, the root first (``modules()`` is pre-order)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _run_forward_hooks(module: nn.Module) -> None:
    """Run FSDP's pre- and post-forward of ``module`` around nothing: its parameters are all-gathered and set on the
    modules as whole tensors (and stay so while ``reshard_after_forward`` is off)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    if "_trl_multiagent_gather" not in module.__dict__:
        module.__dict__["_trl_multiagent_gather"] = lambda: None
        register_fsdp_forward_method(module, "_trl_multiagent_gather")
    module._trl_multiagent_gather()


def _reshards_after_forward(module: nn.Module) -> bool:
    # torch's private FSDP2 state: a unit reshards after forward when its post-forward mesh is set
    groups = module._get_fsdp_state()._fsdp_param_groups
    return any(g.post_forward_mesh_info is not None for g in groups)


@contextlib.contextmanager
def unsharded(model: nn.Module) -> Iterator[None]:
    """Within ``with``, every FSDP2 unit of ``model`` holds its whole parameters (gathered once, kept through every
    forward), so that code calling submodules directly (the team's decoding loop, the reference model) sees plain
    tensors; resharded on exit. All processes must enter together (the gathers are collectives). A no-op without
    FSDP."""
    modules = fsdp_modules(model)
    if not modules:
        yield
        return
    settings = [_reshards_after_forward(m) for m in modules]
    try:
        for m in modules:  # the root first: its pre-forward initialises FSDP's state for the whole tree
            m.set_reshard_after_forward(False, recurse=False)
            _run_forward_hooks(m)
        yield
    finally:
        for m, reshard in zip(modules, settings):
            m.reshard()
            m.set_reshard_after_forward(reshard, recurse=False)


def _full(value):
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


@contextlib.contextmanager
def gathered_adapter_state(pool) -> Iterator[None]:
    """Within ``with``, the state dicts of the pool's bases and value heads hold whole tensors: the trainable ones
    (LoRA, heads) gathered from their shards, the frozen base weights left out (nothing is saved of them). Every
    process must save together (the gathers are collectives)."""
    handles = []
    for module_is_head, modules in ((False, pool.bases.values()), (True, pool.value_heads.values())):
        for module in modules:
            handles.append(module.register_state_dict_post_hook(functools.partial(_to_full_hook, module_is_head)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _to_full_hook(keep_all: bool, module, state_dict, prefix, local_metadata) -> None:
    for key in list(state_dict):
        if not key.startswith(prefix):
            continue
        if keep_all or "lora_" in key:
            state_dict[key] = _full(state_dict[key]).detach()
        else:
            del state_dict[key]


@contextlib.contextmanager
def sharded_adapter_loading(pool) -> Iterator[None]:
    """Within ``with``, whole tensors loaded into the pool's sharded bases and value heads are scattered to their
    shards (each process keeps its own). Every process must load together."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    def to_shards(module, state_dict, prefix, *args):
        current = {prefix + name: p for name, p in module.named_parameters()}
        for key in list(state_dict):
            target = current.get(key)
            value = state_dict[key]
            if isinstance(target, DTensor) and not isinstance(value, DTensor):
                state_dict[key] = distribute_tensor(value.to(target.device, target.dtype), target.device_mesh,
                                                    target.placements)

    handles = [m.register_load_state_dict_pre_hook(to_shards)
               for m in (*pool.bases.values(), *pool.value_heads.values())]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def refresh_parameters(pool) -> None:
    """Point the pool's lists of trainable parameters (one per policy and critic: the optimizer groups, the clipping,
    the saving) at the parameters FSDP put in place of the originals when it sharded the pool."""
    # the pool's own bookkeeping (agents.py); rebuilt the way the pool built it
    for policy in pool.policies:
        pool._policy_params[policy] = pool._adapter_parameters(policy)
    for name, info in pool.critics.items():
        adapter = [] if info.spec.share_adapter else pool._adapter_parameters(info.adapter)
        info.params = adapter + list(pool.value_heads[name].parameters())


def plain_norm(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm as a plain tensor (a DTensor norm of sharded gradients, already reduced, made whole)."""
    return _full(norm)


def average_gradients(groups: list[list[nn.Parameter]], num_processes: int) -> None:
    """Average the gradients of every optimizer group (``groups``: each group's parameters) over the processes, in
    one collective; a group no process computed a gradient for keeps none."""
    used = torch.tensor([float(any(p.grad is not None for p in params)) for params in groups])
    dist.all_reduce(used, op=dist.ReduceOp.MAX)
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for params in groups for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= num_processes
    offset = 0
    for params, was_used in zip(groups, used.tolist()):
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone() if was_used else None
            offset += n


def average_stats(stats: dict[str, float], num_processes: int) -> dict[str, float]:
    """Per-process statistics averaged over the processes. Keys may differ between processes (e.g.
    ``turn2/team_reward``): each key is the mean over the processes that have it, NaN values left out; the
    smallest and largest completion lengths (``.../min_length``, ``.../max_terminated_length``, ...) are the minimum
    and maximum over the processes, as TRL takes them over the gathered completions."""
    if num_processes == 1:
        return stats
    gathered: list[dict[str, float] | None] = [None] * num_processes
    dist.all_gather_object(gathered, stats)
    merged: dict[str, float] = {}
    for key in dict.fromkeys(k for g in gathered for k in g):
        values = [g[key] for g in gathered if key in g and not math.isnan(g[key])]
        last = key.rsplit("/", 1)[-1]
        if values and last.startswith(("min_", "max_")) and last.endswith("length"):
            merged[key] = min(values) if last.startswith("min_") else max(values)
        else:
            merged[key] = sum(values) / len(values) if values else math.nan
    return merged
