"""The loss head on its own: log-probs of the sampled tokens and the entropies, forward and backward, from the logits
of one micro-batch of the main job, computed as one ``log_softmax`` over the whole ``(B, T, V)`` tensor (the library's
way before 2026-11-28) and by ``trl_multiagent.generation.logprobs.token_logps_and_entropies`` (a few rows at a time).

    python benchmarks/loss_head.py [--out experiments/speed/teacher_forcing/loss_head.json]
    python benchmarks/loss_head.py --device cuda --dtype bfloat16 --shape 16 256 32000 --block-rows 64 256 1024 4096

By default the logits are float32 ``(16, 40, 49152)`` (``per_device_train_batch_size`` 16, ``max_completion_length``
40, the embedded model's vocabulary) at temperature 0.7; ``--shape``, ``--dtype`` and ``--device`` change them (on
CUDA each round is timed between two ``torch.cuda.synchronize()``); the backward pass takes a gradient on the log-probs only, as the
main job's loss does (no entropy bonus). The two ways alternate for ``--repeats`` rounds; each round's time is one
forward and backward, and the result keeps the medians and the median of the paired ratios. Each block size in
``--block-rows`` is timed too (the default block is ``logprobs.head_block_rows``: 2 MiB of float32 rows on the CPU, 512 MiB elsewhere), and every way is checked
against the whole-tensor values first.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from measure import paired_medians, write_result

from trl_multiagent.generation.logprobs import (
    ACCELERATOR_HEAD_BLOCK_BYTES,
    HEAD_BLOCK_BYTES,
    head_block_rows,
    token_logps_and_entropies,
)
from trl_multiagent.runtime.provenance import cpu_flags, cpu_model


def whole_tensor(logits, ids, temperature):
    """The formulas as one pass each over the whole tensor (the library's head before this benchmark), in float32 for
    half-precision logits, as the blocked head normalises them."""
    logps_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logps = logps_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropies = -(logps_all.exp() * logps_all).sum(-1)
    return logps, entropies


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/teacher_forcing/loss_head.json")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-rows", type=int, nargs="*", default=[2, 5, 20, 80])
    parser.add_argument("--shape", type=int, nargs=3, default=[16, 40, 49152], metavar=("B", "T", "V"))
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("loss_head: error: --device cuda given but torch.cuda.is_available() is False")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    shape, temperature = tuple(args.shape), 0.7
    logits = (torch.randn(shape, device=device) * 4).to(getattr(torch, args.dtype)).requires_grad_()
    ids = torch.randint(0, shape[-1], shape[:-1], device=device)
    default_rows = head_block_rows(device, shape[-1])
    ways = {"whole_tensor": lambda: whole_tensor(logits, ids, temperature),
            f"blocks_of_{default_rows}_rows (default)": lambda: token_logps_and_entropies(logits, ids, temperature)}
    for rows in args.block_rows:
        ways[f"blocks_of_{rows}_rows"] = lambda rows=rows: token_logps_and_entropies(logits, ids, temperature, rows)

    reference = [t.detach() for t in ways["whole_tensor"]()]
    for name, way in ways.items():
        out = way()
        gap = max((a.detach() - b).abs().max().item() for a, b in zip(out, reference))
        if gap > (1e-4 if args.dtype == "float32" else 1e-3):
            raise SystemExit(f"{name} differs from the whole-tensor formulas by {gap}")

    times = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            sync()
            start = time.perf_counter()
            logps, _ = way()
            logps.sum().backward()
            sync()
            times[name].append(time.perf_counter() - start)
            logits.grad = None
    medians, ratios = paired_medians(times, "whole_tensor")
    result = {
        "command": "python " + " ".join(sys.argv),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "logits_shape": list(shape), "logits_dtype": args.dtype, "temperature": temperature, "repeats": args.repeats,
        "head_block_bytes": HEAD_BLOCK_BYTES if device.type == "cpu" else ACCELERATOR_HEAD_BLOCK_BYTES,
        "seconds_median": medians,
        "whole_tensor_over_way": ratios,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
