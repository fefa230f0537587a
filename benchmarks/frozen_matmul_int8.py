"""An int8 weight-only copy of the frozen weights for generation (issue 40's candidate), against the packed copies.

    python benchmarks/frozen_matmul_int8.py [--rounds 5] [--out experiments/speed/frozen_matmul_dtype/int8.json]

A decoding step's frozen matmuls read every weight of the base; an int8 copy would read a quarter of float32's
bytes. This script times the frozen matmuls of one decoding step of the embedded SmolLM2-135M-Instruct (per layer:
q/k/v concatenated, o, gate/up concatenated, down; 30 layers; then the LM head) at 1, 4, 16, 32 and 64 rows, three
ways, alternating within every round:

- ``packed_float32``: the library's default (``frozen_weights.packed_matmul`` on oneDNN-packed float32 copies);
- ``packed_bfloat16``: the library's ``frozen_matmul_dtype: bfloat16`` copies (inputs cast to bfloat16 and back);
- ``int8_weight_only``: the weights rounded to int8 with one scale per output channel (``max |w| / 127``), through
  PyTorch's CPU kernel ``torch._weight_int8pack_mm`` on bfloat16 inputs (its float32 path was 5-25 times slower than
  float32 ``F.linear`` in a first try), cast back to float32.

The weights are the model's own (random where it is not found). It reports the median seconds of the whole set of
matmuls per way and row count, and each way's largest error against float32 on one row (relative to the output's
largest entry).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from measure import write_result

from trl_multiagent.generation.frozen_weights import packed_matmul, packed_weight
from trl_multiagent.runtime.provenance import cpu_flags, cpu_model

ROWS = (1, 4, 16, 32, 64)


def model_weights() -> list[torch.Tensor]:
    """The frozen matmuls' weights of one decoding step: per layer q/k/v and gate/up concatenated, o, down; the head."""
    from transformers import AutoModelForCausalLM

    from trl_multiagent.models.loading import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m-instruct"), dtype=torch.float32)
    out = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        out += [torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach(), a.o_proj.weight.detach(),
                torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach(), m.down_proj.weight.detach()]
    return out + [model.lm_head.weight.detach()]


def int8_copy(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scales = weight.abs().amax(1).clamp(min=1e-12) / 127
    return torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8), scales.to(torch.bfloat16)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/frozen_matmul_dtype/int8.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    weights = model_weights()
    holder = torch.nn.Module()
    f32 = [packed_weight(holder, [w], name=f"w{i}") for i, w in enumerate(weights)]
    b16 = [packed_weight(holder, [w], name=f"w{i}", dtype=torch.bfloat16) for i, w in enumerate(weights)]
    i8 = [int8_copy(w) for w in weights]
    ways = {
        "packed_float32": lambda xs: [packed_matmul(x, p, None) for x, p in zip(xs, f32)],
        "packed_bfloat16": lambda xs: [packed_matmul(x, p, None) for x, p in zip(xs, b16)],
        "int8_weight_only": lambda xs: [torch._weight_int8pack_mm(x.to(torch.bfloat16), q, s).float()
                                        for x, (q, s) in zip(xs, i8)],
    }
    generator = torch.Generator().manual_seed(0)
    one = [torch.randn(1, w.size(1), generator=generator) for w in weights]
    reference = ways["packed_float32"](one)
    error = {way: max(((y - r).abs().max() / r.abs().max()).item() for y, r in zip(run(one), reference))
             for way, run in ways.items()}
    seconds = {rows: {way: [] for way in ways} for rows in ROWS}
    for _ in range(args.rounds):
        for rows in ROWS:
            xs = [torch.randn(rows, w.size(1), generator=generator) for w in weights]
            for way, run in ways.items():
                run(xs)
                start = time.perf_counter()
                run(xs)
                seconds[rows][way].append(time.perf_counter() - start)
    medians = {rows: {way: statistics.median(s) for way, s in by.items()} for rows, by in seconds.items()}
    for rows, by in medians.items():
        print(rows, {way: f"{s * 1e3:.1f} ms" for way, s in by.items()}, flush=True)
    print("largest error against float32, relative:", error, flush=True)
    write_result(args.out, {
        "command": "python benchmarks/frozen_matmul_int8.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "weights": len(weights), "weight_bytes_float32": sum(w.numel() * 4 for w in weights),
        "seconds_median": medians, "seconds_all": seconds, "relative_error_one_row": error,
        "float32_over_int8": {rows: by["packed_float32"] / by["int8_weight_only"] for rows, by in medians.items()},
        "float32_over_bfloat16": {rows: by["packed_float32"] / by["packed_bfloat16"] for rows, by in medians.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
