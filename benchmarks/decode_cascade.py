"""What shared-prefix ("cascade") attention could save in the main job's decoding steps: an upper estimate.

    python benchmarks/decode_cascade.py [--steps 3] [--warm] [--out experiments/speed/generation/decode_cascade.json]

After the prefill, ``decoding.decode`` copies each prompt's cache row to its K samples (``expand``), and every
decoding step's attention then reads each row's own copy of its prompt's keys and values. Cascade attention would
read them once per distinct prompt: the queries of a prompt's samples against the prompt's keys in one matmul, each
row's queries against its own generated keys in another, one softmax over both, and the two value products summed.

The script first trains make demo's recipe (``targets.MAIN_JOB``, no evaluation) for ``--steps`` steps in this
process, recording every decoding call (its distinct prompt rows, sampled rows and cache width after the prompt) and
every lean decoding step in it (its live rows and cached length), and each step's time from the run's
``metrics.jsonl``. Then, for every recorded decoding step, it times one layer's attention both ways on random tensors
of the step's shapes (the model's heads, key/value heads and head size), alternating, and checks that they agree:

- ``per_row``: as :class:`~trl_multiagent.generation.lean_step.LeanStep` computes it: two batched matmuls and a softmax
  from ``MATMUL_ATTENTION_MIN_ROWS`` rows on, ``scaled_dot_product_attention`` below, one thread where the lean step
  takes one (``ONE_THREAD``);
- ``cascade``: the prompt's columns once per distinct prompt, the live rows placed in a grid of (prompts, most rows
  of one prompt) as an implementation that keeps compaction would need, then the rows' own columns.

Each call is timed cold by default: alone, after a 256 MiB write that fills the caches with other data, as in a
decoding step, where all 30 layers' weights pass between two attentions of one layer (``--warm``: calls one after
another on the same tensors, which then stay in the caches; that favours reading a prompt's keys K times).

The estimate of a step's saving is the sum over its decoding steps of (per_row - cascade) x the model's layers: an
upper estimate, since it counts every live row's prompt as one of the call's distinct prompts (after compaction a
prompt may have fewer rows) and no cost of keeping the two caches apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from measure import write_result
from targets import MAIN_JOB

from trl_multiagent.generation import lean_step as lean
from trl_multiagent.generation import team
from trl_multiagent.runtime.provenance import cpu_model


def record_main_job(steps: int) -> tuple[list[dict], list[dict], object]:
    """Train the main job ``steps`` steps here; return its decoding calls, its logged steps and the model config."""
    from trl_multiagent.command.cli import main as cli

    calls, configs = [], []
    original_decode, original_step = team.decode, lean.LeanStep.__call__

    def decode(model, input_ids, attention_mask, config, eos_ids, batch=None, expand=None, prefix=None, **kwargs):
        width = input_ids.size(1) + (prefix[0].size(1) if prefix is not None else 0)
        calls.append({"prompts": int(input_ids.size(0)), "width": int(width), "steps": [],
                      "rows": int(expand.numel() if expand is not None else input_ids.size(0))})
        configs.append(model.config)
        return original_decode(model, input_ids, attention_mask, config, eos_ids, batch=batch, expand=expand,
                               prefix=prefix, **kwargs)

    def step(self, tokens, mask, positions, cache):
        calls[-1]["steps"].append([int(tokens.numel()), int(cache.layers[0].length)])
        return original_step(self, tokens, mask, positions, cache)

    team.decode, lean.LeanStep.__call__ = decode, step
    try:
        with tempfile.TemporaryDirectory() as out:
            code = cli(["train", "--config", MAIN_JOB, "--max_steps", str(steps), "--evaluator", "none",
                        "--output_dir", out, "--disable_tqdm", "true"])
            logged = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    finally:
        team.decode, lean.LeanStep.__call__ = original_decode, original_step
    if code:
        raise SystemExit(f"the main job failed ({code})")
    if not calls or not all(c["steps"] for c in calls):
        raise SystemExit("no lean decoding step was recorded: the main job did not decode through LeanStep")
    return calls, [m for m in logged if "step_time" in m], configs[0]


def per_row(q, keys, values, attend, scale):
    if q.size(0) >= lean.MATMUL_ATTENTION_MIN_ROWS:
        scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(scale).add_(attend)
        return torch.matmul(torch.softmax(scores, dim=-1), values)
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=attend, scale=scale)


def cascade(q, slot, grid, prompt_keys, prompt_values, prompt_attend, own_keys, own_values, own_attend, scale):
    """``q`` (rows, kv heads, group, dim); ``slot``: each row's place in the (prompts x ``grid``) grid."""
    rows, kv_heads, group, dim = q.shape
    prompts, width = prompt_keys.size(0), prompt_keys.size(2)
    placed = q.new_zeros(prompts * grid, kv_heads, group, dim).index_copy_(0, slot, q)
    placed = placed.view(prompts, grid, kv_heads, group, dim).transpose(1, 2).reshape(prompts, kv_heads,
                                                                                      grid * group, dim)
    shared = torch.matmul(placed, prompt_keys.transpose(-1, -2)).mul_(scale).add_(prompt_attend)
    shared = shared.view(prompts, kv_heads, grid, group, width).transpose(1, 2).reshape(prompts * grid, kv_heads,
                                                                                       group, width)[slot]
    own = torch.matmul(q, own_keys.transpose(-1, -2)).mul_(scale).add_(own_attend)
    weights = torch.softmax(torch.cat([shared, own], dim=-1), dim=-1)
    first = weights[..., :width].new_zeros(prompts * grid, kv_heads, group, width).index_copy_(0, slot,
                                                                                               weights[..., :width])
    first = first.view(prompts, grid, kv_heads, group, width).transpose(1, 2).reshape(prompts, kv_heads,
                                                                                     grid * group, width)
    out = torch.matmul(first, prompt_values).view(prompts, kv_heads, grid, group, dim).transpose(1, 2)
    return out.reshape(prompts * grid, kv_heads, group, dim)[slot] + torch.matmul(weights[..., width:], own_values)


def time_shape(rows: int, length: int, prompts: int, width: int, shape: tuple[int, int, int], repeats: int,
               generator: torch.Generator, flush: torch.Tensor | None = None) -> dict:
    """Seconds of one layer's attention both ways for ``rows`` live rows over ``length + 1`` cached positions; with
    ``flush`` (a large tensor), each call timed alone after writing it."""
    heads, kv_heads, dim = shape
    group, scale, total = heads // kv_heads, dim ** -0.5, length + 1
    grid = -(-rows // prompts)
    slot = torch.arange(rows)  # rows of a prompt side by side, filled prompt after prompt
    owner = slot // grid
    prompt_keys, prompt_values = (torch.randn(prompts, kv_heads, width, dim, generator=generator) for _ in range(2))
    own_keys, own_values = (torch.randn(rows, kv_heads, total - width, dim, generator=generator) for _ in range(2))
    q = torch.randn(rows, kv_heads, group, dim, generator=generator)
    keys = torch.cat([prompt_keys[owner], own_keys], dim=2)
    values = torch.cat([prompt_values[owner], own_values], dim=2)
    attend = torch.zeros(rows, 1, 1, total)
    attend[:, :, :, : width // 8] = -torch.inf  # some left padding of the prompts
    prompt_attend = attend[:1, :, :, :width]
    own_attend = attend[:, :, :, width:]
    threads = torch.get_num_threads()
    one_thread = threads > 1 and 2 * rows * heads * total * dim < lean.ONE_THREAD
    ways = {"per_row": lambda: per_row(q, keys, values, attend, scale),
            "cascade": lambda: cascade(q, slot, grid, prompt_keys, prompt_values, prompt_attend, own_keys,
                                       own_values, own_attend, scale)}
    if one_thread:
        torch.set_num_threads(1)
    try:
        gap = (ways["per_row"]() - ways["cascade"]()).abs().max().item()
        if gap > 1e-4:
            raise SystemExit(f"cascade differs from per_row by {gap} at rows {rows}, length {length}")
        seconds = {way: [] for way in ways}
        for _ in range(3):
            for way, run in ways.items():
                run()
                if flush is None:  # warm: the same tensors again and again, in the caches after the first call
                    start = time.perf_counter()
                    for _ in range(repeats):
                        run()
                    seconds[way].append((time.perf_counter() - start) / repeats)
                    continue
                total = 0.0
                for _ in range(repeats):  # cold: the caches filled with other data before each call, as in a
                    flush.add_(1.0)       # decoding step, where every layer's weights pass between two attentions
                    start = time.perf_counter()
                    run()
                    total += time.perf_counter() - start
                seconds[way].append(total / repeats)
    finally:
        if one_thread:
            torch.set_num_threads(threads)
    return {way: statistics.median(s) for way, s in seconds.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/generation/decode_cascade.json")
    parser.add_argument("--steps", type=int, default=3, help="steps of the main job to record")
    parser.add_argument("--repeats", type=int, default=None,
                        help="calls per timing, 3 timings per way and shape (default 5; --warm: 20)")
    parser.add_argument("--warm", action="store_true",
                        help="time the calls one after another on the same tensors (in the caches), not each after "
                             "a 256 MiB write")
    args = parser.parse_args(argv)
    calls, logged, config = record_main_job(args.steps)
    shape = (config.num_attention_heads, config.num_key_value_heads,
             getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    layers = config.num_hidden_layers
    generator = torch.Generator().manual_seed(0)
    repeats = args.repeats or (20 if args.warm else 5)
    flush = None if args.warm else torch.zeros(256 * 2**20 // 4)
    timed, cache = [], {}
    for call in calls:
        seconds = {"per_row": 0.0, "cascade": 0.0}
        for rows, length in call["steps"]:
            key = (rows, length, min(call["prompts"], rows), call["width"])
            if key not in cache:
                cache[key] = time_shape(*key, shape, repeats, generator, flush)
            for way in seconds:
                seconds[way] += cache[key][way] * layers
        timed.append({**call, "attention_s": seconds, "saving_s": seconds["per_row"] - seconds["cascade"]})
        print({k: v for k, v in timed[-1].items() if k != "steps"}, flush=True)
    saving = sum(c["saving_s"] for c in timed)
    per_row_s = sum(c["attention_s"]["per_row"] for c in timed)
    step_s = [m["step_time"] for m in logged]
    generation_s = [m.get("time/generation", float("nan")) for m in logged]
    summary = {"steps": len(logged), "decoding_calls": len(timed),
               "decoding_steps": sum(len(c["steps"]) for c in timed),
               "per_row_attention_s_per_train_step": per_row_s / len(logged),
               "cascade_saving_s_per_train_step": saving / len(logged),
               "mean_step_s": statistics.mean(step_s), "mean_generation_s": statistics.mean(generation_s),
               "saving_over_step": saving / sum(step_s), "saving_over_generation": saving / sum(generation_s)}
    print(summary, flush=True)
    write_result(args.out, {
        "command": "python benchmarks/decode_cascade.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "timing": "warm" if args.warm else "cold (each call after a 256 MiB write)", "repeats": repeats,
        "attention_shape": {"heads": shape[0], "kv_heads": shape[1], "head_dim": shape[2], "layers": layers},
        "summary": summary, "logged_steps": logged, "calls": timed})
    return 0


if __name__ == "__main__":
    sys.exit(main())
