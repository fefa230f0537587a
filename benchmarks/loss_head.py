"""The loss head on its own: log-probs of the sampled tokens and the entropies, forward and backward, from the logits
of one micro-batch of the main job, computed as one ``log_softmax`` over the whole ``(B, T, V)`` tensor (the library's
way before 2026-11-28) and by ``trl_multiagent.logprobs.token_logps_and_entropies`` (a few rows at a time).

    python benchmarks/loss_head.py [--out docs/results/teacher_forcing/loss_head.json]

The logits are float32 ``(16, 40, 49152)`` (``per_device_train_batch_size`` 16, ``max_completion_length`` 40, the
embedded model's vocabulary) at temperature 0.7; the backward pass takes a gradient on the log-probs only, as the
main job's loss does (no entropy bonus). The two ways alternate for ``--repeats`` rounds; each round's time is one
forward and backward, and the result keeps the medians and the median of the paired ratios. Each block size in
``--block-rows`` is timed too (the default block is ``HEAD_BLOCK_BYTES`` of float32 rows), and every way is checked
against the whole-tensor values first.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from measure import paired_medians, write_result

from trl_multiagent.logprobs import HEAD_BLOCK_BYTES, token_logps_and_entropies
from trl_multiagent.provenance import cpu_flags, cpu_model


def whole_tensor(logits, ids, temperature):
    """The formulas as one pass each over the whole tensor (the library's head before this benchmark)."""
    logps_all = torch.log_softmax(logits / temperature, dim=-1)
    logps = logps_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropies = -(logps_all.exp() * logps_all).sum(-1)
    return logps, entropies


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/teacher_forcing/loss_head.json")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--block-rows", type=int, nargs="*", default=[2, 5, 20, 80])
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    shape, temperature = (16, 40, 49152), 0.7
    logits = (torch.randn(shape) * 4).requires_grad_()
    ids = torch.randint(0, shape[-1], shape[:-1])
    default_rows = max(1, HEAD_BLOCK_BYTES // (4 * shape[-1]))
    ways = {"whole_tensor": lambda: whole_tensor(logits, ids, temperature),
            f"blocks_of_{default_rows}_rows (default)": lambda: token_logps_and_entropies(logits, ids, temperature)}
    for rows in args.block_rows:
        ways[f"blocks_of_{rows}_rows"] = lambda rows=rows: token_logps_and_entropies(logits, ids, temperature, rows)

    reference = [t.detach() for t in ways["whole_tensor"]()]
    for name, way in ways.items():
        out = way()
        gap = max((a.detach() - b).abs().max().item() for a, b in zip(out, reference))
        if gap > 1e-4:
            raise SystemExit(f"{name} differs from the whole-tensor formulas by {gap}")

    times = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            start = time.perf_counter()
            logps, _ = way()
            logps.sum().backward()
            times[name].append(time.perf_counter() - start)
            logits.grad = None
    medians, ratios = paired_medians(times, "whole_tensor")
    result = {
        "command": "python " + " ".join(sys.argv),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "logits_shape": list(shape), "temperature": temperature, "repeats": args.repeats,
        "head_block_bytes": HEAD_BLOCK_BYTES,
        "seconds_median": medians,
        "whole_tensor_over_way": ratios,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
