"""One layer's attention in a decoding step: ``scaled_dot_product_attention`` against two batched matmuls and a
softmax, the choice behind ``lean_step.MATMUL_ATTENTION_MIN_ROWS``.

    python benchmarks/decode_attention.py [--out experiments/speed/generation/decode_attention.json]

SmolLM2-135M's attention shape: 3 key/value heads of 64 dimensions, 3 query heads per key/value head grouped as the
lean step groups them, 204 cached positions (slices of a 256-position preallocated cache) with one row's first 10
positions masked. Microseconds per call (mean of 60 after one warm-up), on torch's threads and on one; each path's
output is checked against the kernel's.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from measure import write_result

from trl_multiagent.runtime.provenance import cpu_model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/generation/decode_attention.json")
    parser.add_argument("--rows", default="1,2,4,8,16,64")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    results = []
    for rows in [int(r) for r in args.rows.split(",")]:
        cached = 204
        q = torch.randn(rows, 3, 3, 64)
        keys, values = (torch.randn(rows, 3, 256, 64)[:, :, :cached] for _ in range(2))
        mask = torch.zeros(rows, 1, 1, cached)
        mask[0, ..., :10] = -float("inf")

        def kernel(q=q, keys=keys, values=values, mask=mask):
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=0.125)

        def matmuls(q=q, keys=keys, values=values, mask=mask):
            scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(0.125).add_(mask)
            return torch.matmul(torch.softmax(scores, -1), values)

        reference = kernel()
        entry = {"rows": rows}
        for name, fn in (("kernel", kernel), ("matmuls", matmuls)):
            for n in (threads, 1):
                torch.set_num_threads(n)
                try:
                    fn()
                    start = time.perf_counter()
                    for _ in range(60):
                        out = fn()
                    entry[f"{name}_us_{n}_threads"] = (time.perf_counter() - start) / 60 * 1e6
                finally:
                    torch.set_num_threads(threads)
                torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
        results.append(entry)
        print({k: round(v, 1) if isinstance(v, float) else v for k, v in entry.items()}, flush=True)
    write_result(args.out, {"command": "python benchmarks/decode_attention.py " +
                            " ".join(argv if argv is not None else sys.argv[1:]),
                            "cpu": cpu_model(), "threads": threads, "cached_positions": 204, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
