"""The files of a team's trained weights: every policy's LoRA adapter and every critic's adapter and value head, as
:meth:`AgentPool.save_adapters <trl_multiagent.team.pool.AgentPool.save_adapters>` writes them and
:meth:`~trl_multiagent.team.pool.AgentPool.load_adapters` reads them back.

Layout under ``<directory>/adapters/``: ``<policy>/adapter_model.safetensors`` and ``adapter_config.json`` per policy;
``<critic>/value_head.safetensors`` per critic (and its own adapter unless it shares its policy's); ``team.json``, the
team's layout (agents, critics, bases).

A save never replaces good files with bad ones: every tensor of every adapter and head is checked finite BEFORE
anything is written, and one NaN or infinite value anywhere raises
:class:`~trl_multiagent.errors.NonFiniteAdapterError` (naming the policy or critic and the tensor) with nothing
written, so that the adapters of the previous save (an earlier checkpoint, the last final save) stay byte for byte
as they were. A long run whose weights went NaN thus keeps its last good adapters instead of overwriting them. The
whole ``adapters/`` folder is written beside its place (``adapters.tmp-<pid>``) and renamed over it when complete
(:func:`~trl_multiagent.runtime.atomic_files.staged_directory`), so that a process killed mid-save, a crash or a full disk
leaves the old team's files or the new team's, never a mix; out of space is one
:class:`~trl_multiagent.errors.DiskFullError` line (the space needed and left).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file, save_file

from trl_multiagent.errors import NonFiniteAdapterError
from trl_multiagent.runtime.atomic_files import staged_directory
from trl_multiagent.team.agent_spec import spec_record

ADAPTER_FILE = "adapter_model.safetensors"
VALUE_HEAD_FILE = "value_head.safetensors"


def _cpu_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def pool_weight_files(pool) -> list[tuple[str, str, str, dict[str, torch.Tensor], Any]]:
    """Every weights file a save of ``pool`` writes, as ``(owner kind, owner name, file name, tensors, peft config or
    None)``, with the tensors on the CPU: policies first, then critics (their adapter unless shared, their head)."""
    files = []
    for policy, info in pool.policies.items():
        base = pool.bases[info.base_key]
        files.append(("policy", policy, ADAPTER_FILE, _cpu_state(get_peft_model_state_dict(base, adapter_name=policy)),
                      base.peft_config[policy]))
    for name, info in pool.critics.items():
        if not info.spec.share_adapter:
            base = pool.bases[info.base_key]
            files.append(("critic", name, ADAPTER_FILE,
                          _cpu_state(get_peft_model_state_dict(base, adapter_name=info.adapter)),
                          base.peft_config[info.adapter]))
        files.append(("critic", name, VALUE_HEAD_FILE, _cpu_state(pool.value_heads[name].state_dict()), None))
    return files


def check_finite(files, root: Path) -> None:
    """Raise :class:`~trl_multiagent.errors.NonFiniteAdapterError` when any tensor of ``files``
    (:func:`pool_weight_files`) holds a NaN or infinite value: the first such tensor by name, its owner, how many of
    its values, and how many other tensors are affected."""
    bad = []
    for kind, owner, file_name, state, _ in files:
        for key, tensor in state.items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                bad.append((kind, owner, file_name, key, tensor))
    if not bad:
        return
    kind, owner, file_name, key, tensor = bad[0]
    values = [name for name, present in (("nan", torch.isnan(tensor).any()), ("inf", torch.isinf(tensor).any()))
              if bool(present)]
    count = int((~torch.isfinite(tensor)).sum())
    more = f" (and {len(bad) - 1} more tensors, of {', '.join(sorted({f'{k} {o!r}' for k, o, *_ in bad[1:]}))})" \
        if bad[1:] else ""
    raise NonFiniteAdapterError(
        f"{kind} {owner!r}: tensor {key!r} ({file_name}) has {count} non-finite values ({'/'.join(values)}) of "
        f"{tensor.numel()}{more}; nothing was written to {str(root)!r} (adapters saved before are left as they "
        "were). The weights went NaN or infinite in training: see the warnings about skipped updates, "
        "and lower learning_rate or max_grad_norm")


def save_pool_adapters(pool, directory: str | Path) -> None:
    """Write every policy's adapter, every critic's adapter and head and ``team.json`` under
    ``<directory>/adapters/``, after checking every tensor finite, all at once (see the module docstring)."""
    root = Path(directory) / "adapters"
    files = pool_weight_files(pool)
    check_finite(files, root)
    needed = sum(t.numel() * t.element_size() for *_, state, _ in files for t in state.values())
    kept = ("the adapters saved before are as they were; free space on that file system, or choose another "
            "output_dir")
    with staged_directory(root, needed, "the team's adapters", kept) as stage:
        for _, owner, file_name, state, peft_config in files:
            target = stage / owner
            target.mkdir(parents=True, exist_ok=True)
            save_file(state, str(target / file_name))
            if peft_config is not None:
                peft_config.save_pretrained(str(target))
        team = {"agents": [spec_record(s) for s in pool.specs.values()],
                "critics": [asdict(c.spec) for c in pool.critics.values()],
                "bases": {k: {"model": m, "quantization": q} for k, (m, q) in pool.base_sources.items()}}
        (stage / "team.json").write_text(json.dumps(team, indent=2))


def load_pool_adapters(pool, directory: str | Path, only: Sequence[str] | None = None,
                       source: str | None = None) -> None:
    """Load every policy's adapter (and every critic's adapter and head) from ``<directory>/adapters/<name>/``;
    ``only``: just those policies' adapters (no critic); ``source``: the one policy of ``only`` takes the adapter
    saved under that other policy's name (policies swapped between roles, AT-GRPO's Table 4)."""
    root = Path(directory) / "adapters"
    adapters = [(p, info.base_key) for p, info in pool.policies.items() if only is None or p in only]
    if source is not None and (only is None or len(only) != 1):
        raise ValueError("load_pool_adapters: source= needs exactly one policy in only=")
    if only is None:
        adapters += [(c, info.base_key) for c, info in pool.critics.items() if not info.spec.share_adapter]
    for name, key in adapters:
        path = root / (source or name) / ADAPTER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"No adapter for {name!r} at {path}")
        result = set_peft_model_state_dict(pool.bases[key], load_file(str(path)), adapter_name=name)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"Adapter {path} does not fit {name!r}: unexpected keys {unexpected[:3]}")
    for name in pool.critics if only is None else ():
        path = root / name / VALUE_HEAD_FILE
        if not path.is_file():
            raise FileNotFoundError(f"No value head for critic {name!r} at {path}")
        pool.value_heads[name].load_state_dict(load_file(str(path)))
