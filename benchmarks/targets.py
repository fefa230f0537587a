"""The speed targets of ``make bench`` that need the main job's model and data (called by benchmarks/bench.py).

Each measurement runs in a fresh subprocess, one after the other (never two side by side):

* ``generation``: ``benchmarks/generation_throughput.py``: a team step's rollout (2 agents, QLoRA adapters on one
  4-bit base) against plain HF ``generate`` of the base, and against the compute limit from a matmul timed in the
  same run -> ``rollout_vs_plain_generate``, ``rollout_vs_roofline``.
* ``agents`` (this file, ``python benchmarks/targets.py agents``): seconds per generated token of the team-level
  generation with 4 agents (4 adapters) on one base against 1 agent, the same 8 prompts x 4 samples, every row
  forced to the same length, the two timed alternately over 3 rounds -> ``per_token_4_agents_vs_1`` (the median of
  the paired ratios); beside it the positions each call prefills and its linear-layer FLOPs per generated token
  (``flops_per_token_4_agents_vs_1``: each agent prefills the prompts' shared opening with its own adapter).
* ``demo step``: the main job, make demo's math team (:data:`MAIN_JOB`: AT-GRPO, reasoner and tool agent, two turns)
  for a few steps without evaluation; the mean ``step_time`` of the steps after the first -> ``demo_step_s`` (until
  2026-11-27 this measured the TL;DR writing job, the main job when issue 40 set the target); and the loss's forward plus backward seconds
  against their FLOPs (frozen linears, LoRA and attention's products: :func:`train_pass_step_flops`) at the
  matmul rate measured around the run -> ``train_pass_vs_matmul`` (:func:`train_pass_bound`). Beside it, not a target: the same ratio at the faster of that rate (MKL's ``sgemm``)
  and oneDNN's packed matmul (``measure.packed_matmul_flops``, the kernel of the library's frozen matmuls), which on
  some CPUs uses wider vector instructions than MKL (``experiments/speed/isa_caps/``) -> ``train_pass_fastest_matmul``.
* ``decode``: ``benchmarks/decode_step.py``: one decoding step at 1, 16 and 64 rows against
  ``max(weight bytes / bandwidth, FLOPs / matmul rate)`` of the same run -> ``decode_vs_bound_{1,16,64}`` (and, not
  a target, ``lean_over_fastest_matmul_bound``: the same with the faster matmul rate above).
* ``evaluation``: ``benchmarks/eval_speed.py`` (the main job's before-training evaluation on 10 held-out posts)
  against the same command run once on the code before the speed work (``experiments/speed/eval_speed/reference.json``),
  with each side's seconds scaled by its own matmul rate -> ``eval_speedup``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_EVAL = ROOT / "experiments" / "speed" / "eval_speed" / "reference.json"

#: name -> (target, "ge" | "le")
TARGETS = {
    "rollout_vs_plain_generate": (1.0, "ge"),
    "rollout_vs_roofline": (0.5, "ge"),
    "step_vs_trl": (0.5, "le"),  # issue 40 (0.8 before)
    "decode_vs_bound_1": (2.0, "le"),
    "decode_vs_bound_16": (2.0, "le"),
    "decode_vs_bound_64": (2.0, "le"),
    "train_pass_vs_matmul": (1.5, "le"),
    "per_token_4_agents_vs_1": (1.0, "le"),
    "memory_4_agents_vs_1": (1.05, "le"),
    "demo_step_s": (10.0, "le"),
    "eval_speedup": (10.0, "ge"),
}


def target(name: str, value: float) -> dict:
    goal, way = TARGETS[name]
    met = value >= goal if way == "ge" else value <= goal
    return {"value": round(float(value), 4), "target": goal, "met": bool(met)}


def _run(cmd: list[str], log) -> float:
    log.info("targets: %s", " ".join(cmd))
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def measure_generation(tmp: Path, log) -> dict:
    out = tmp / "generation.json"
    wall = _run([sys.executable, "benchmarks/generation_throughput.py", "--out", str(out)], log)
    return {**json.loads(out.read_text()), "wall_s": wall}


def measure_agents(tmp: Path, log) -> dict:
    out = tmp / "agents.json"
    wall = _run([sys.executable, "benchmarks/targets.py", "agents", "--out", str(out)], log)
    return {**json.loads(out.read_text()), "wall_s": wall}


def linear_flops_per_token(model: str) -> dict[str, float]:
    """FLOPs per token of a Llama-architecture model's forward: ``layers``, the linear layers of its decoder layers
    (q, k, v, o and the gated MLP: 2 x their weights), and ``lm_head`` (2 x hidden x vocabulary, paid only where a
    log-prob is needed). Attention's products and LoRA are not in it (the training passes' bound adds them:
    :func:`train_pass_flops`)."""
    from transformers import AutoConfig

    from trl_multiagent.models.loading import resolve_model

    c = AutoConfig.from_pretrained(resolve_model(model))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    q_o = 2 * c.hidden_size * c.num_attention_heads * head_dim
    k_v = 2 * c.hidden_size * c.num_key_value_heads * head_dim
    mlp = 3 * c.hidden_size * c.intermediate_size
    return {"layers": 2.0 * c.num_hidden_layers * (q_o + k_v + mlp), "lm_head": 2.0 * c.hidden_size * c.vocab_size}


def train_pass_flops(model: str, lora_r: int) -> dict[str, float]:
    """Forward FLOPs of the training passes' products, per unit of what the trainer counts: ``layers`` and ``lm_head``
    per position (:func:`linear_flops_per_token`); ``lora`` per position, the LoRA matrices of rank ``lora_r`` on the
    seven projections of every layer (PEFT's ``all-linear`` on a Llama model: 2 x r x (inputs + outputs) each);
    ``attention_pair`` per (query, key) pair, the score product and the values' weighted sum of every query head in
    every layer (2 x 2 x heads x head_dim)."""
    from transformers import AutoConfig

    from trl_multiagent.models.loading import resolve_model

    c = AutoConfig.from_pretrained(resolve_model(model))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    q = c.num_attention_heads * head_dim
    kv = c.num_key_value_heads * head_dim
    sides = [(c.hidden_size, q), (c.hidden_size, kv), (c.hidden_size, kv), (q, c.hidden_size),
             (c.hidden_size, c.intermediate_size), (c.hidden_size, c.intermediate_size),
             (c.intermediate_size, c.hidden_size)]
    return {**linear_flops_per_token(model),
            "lora": 2.0 * lora_r * c.num_hidden_layers * sum(i + o for i, o in sides),
            "attention_pair": 4.0 * c.num_hidden_layers * c.num_attention_heads * head_dim}


def recipe_train_pass_flops(recipe: dict) -> dict[str, float]:
    """:func:`train_pass_flops` of a run's recipe (its ``summary.json`` ``recipe``), which must put LoRA on every
    projection (``lora_target_modules`` all-linear, the default)."""
    if recipe.get("lora_target_modules", "all-linear") != "all-linear":
        raise ValueError("train_pass_flops counts LoRA on the seven projections (all-linear); the recipe sets "
                         f"lora_target_modules={recipe['lora_target_modules']!r}")
    return train_pass_flops(recipe.get("model", "smollm2-135m-instruct"), recipe.get("lora_r", 16))


def train_pass_step_flops(record: dict, flops: dict[str, float]) -> dict[str, float | None]:
    """A step's forward plus backward FLOPs from its logged counts (``tokens/loss_needed``: each distinct prompt prefix
    once, every completion; ``tokens/loss_completions``; ``tokens/loss_attention_pairs``, the pairs its causal
    attention needs) and :func:`train_pass_flops`:

    * ``frozen``: the frozen linears forward (every needed position through the layers, the LM head at the completion
      positions) and their input gradients backward, the same again;
    * ``lora``: forward, and twice that backward (the input's gradient and the matrices' own);
    * ``attention``: forward, and twice that backward (the gradients of the scores, values, queries and keys);
    * ``all``: their sum, the bound of ``train_pass_vs_matmul``. Until 2026-11-28 (stop 57) the bound was ``frozen``
      alone, which :func:`train_pass_bound` reports beside it.

    A record of a library that did not log the attention pairs yet (before stop 57) gets ``attention`` and ``all``
    ``None``."""
    missing = [k for k in ("tokens/loss_needed", "tokens/loss_completions") if k not in record]
    if missing:
        raise KeyError(f"the step's record has no {missing}")
    frozen = 2 * (record["tokens/loss_needed"] * flops["layers"]
                  + record["tokens/loss_completions"] * flops["lm_head"])
    lora = 3 * record["tokens/loss_needed"] * flops["lora"]
    pairs = record.get("tokens/loss_attention_pairs")
    attention = None if pairs is None else 3 * pairs * flops["attention_pair"]
    return {"frozen": frozen, "lora": lora, "attention": attention,
            "all": None if attention is None else frozen + lora + attention}


def train_pass_bound(records: list[dict], flops: dict[str, float], matmul_flops_per_s: float) -> dict:
    """The loss's forward plus backward seconds of each step (``time/forward`` + ``time/backward``) against their
    FLOPs (:func:`train_pass_step_flops`) at the matmul rate. Returns the per-step ratios and their mean over the
    steps after the first (``None`` where the records lack the attention pairs: a library before stop 57), and the
    same against the frozen linears' FLOPs alone (the bound until stop 57)."""
    steps = [(r["time/forward"] + r["time/backward"], train_pass_step_flops(r, flops))
             for r in records if "time/forward" in r and "time/backward" in r]
    if len(steps) < 2:
        raise RuntimeError("the demo run logged fewer than two steps with the loss's times and token counts")
    frozen_only = [seconds / (f["frozen"] / matmul_flops_per_s) for seconds, f in steps]
    complete = all(f["all"] is not None for _, f in steps)
    ratios = [seconds / (f["all"] / matmul_flops_per_s) for seconds, f in steps] if complete else None
    return {"per_step": ratios, "mean_after_first": statistics.fmean(ratios[1:]) if complete else None,
            "per_step_frozen_linears_only": frozen_only,
            "mean_after_first_frozen_linears_only": statistics.fmean(frozen_only[1:]),
            "flops_share_after_first": {k: statistics.fmean(f[k] / f["all"] for _, f in steps[1:])
                                        for k in ("frozen", "lora", "attention")} if complete else None,
            "flops_per_token": flops, "matmul_gflops": matmul_flops_per_s / 1e9}


#: make demo's recipe (the Makefile's ``demo`` target)
MAIN_JOB = "recipes/configs/math_generalisation_at_grpo.yaml"


def measure_demo_step(tmp: Path, log, steps: int = 5) -> dict:
    from measure import matmul_flops, packed_matmul_flops

    out = tmp / "demo"
    rate_before, packed_before = matmul_flops(), packed_matmul_flops()
    wall = _run([sys.executable, "-m", "trl_multiagent", "train", "--config", MAIN_JOB,
                 "--max_steps", str(steps), "--evaluator", "none", "--output_dir", str(out), "--disable_tqdm",
                 "true"], log)
    rate = (rate_before + matmul_flops()) / 2
    packed_after = packed_matmul_flops()
    packed = None if packed_before is None or packed_after is None else (packed_before + packed_after) / 2
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["step_time"] for r in records if "step_time" in r]
    flops = recipe_train_pass_flops(json.loads((out / "summary.json").read_text())["recipe"])
    if any("tokens/loss_attention_pairs" not in r for r in records if "time/forward" in r):
        raise RuntimeError("the main job's steps logged no tokens/loss_attention_pairs: the bound needs them")
    parts = {k: statistics.fmean(r[k] for r in records[1:len(times)] if k in r)
             for k in ("time/generation", "time/forward", "time/backward", "time/optimizer", "time/environment")
             if any(k in r for r in records[1:len(times)])}
    return {"command": f"python -m trl_multiagent train --config {MAIN_JOB} --max_steps {steps} "
                       "--evaluator none", "step_time_s": times, "mean_step_s_after_first": statistics.fmean(times[1:]),
            "mean_parts_after_first_s": parts, "wall_s": wall,
            "train_pass": train_pass_bound(records, flops, rate),
            # not a target: the same ratio against the faster of MKL's sgemm and oneDNN's packed matmul (the kernel
            # of the library's frozen matmuls), which may use wider vector instructions than MKL on the same CPU
            "train_pass_fastest_matmul": None if packed is None else
            train_pass_bound(records, flops, max(rate, packed))}


def measure_decode(tmp: Path, log) -> dict:
    out = tmp / "decode.json"
    wall = _run([sys.executable, "benchmarks/decode_step.py", "--out", str(out)], log)
    return {**json.loads(out.read_text()), "wall_s": wall}


def decode_ratios(decode: dict) -> dict[str, float]:
    """The lean step over its bound per row count, unrounded, from ``decode_step.py``'s per-row entries (its
    ``summary`` rounds to 2 decimals: any ratio below 2.005 would read as a met 2.0)."""
    return {str(entry["rows"]): entry["lean_over_bound"] for entry in decode["steps"]}


def measure_evaluation(tmp: Path, log) -> dict:
    out = tmp / "eval.json"
    reference = json.loads(REFERENCE_EVAL.read_text())
    wall = _run([sys.executable, "benchmarks/eval_speed.py", "--problems", str(reference["problems"]),
                 "--samples", str(reference["samples"]), "--out", str(out)], log)
    new = json.loads(out.read_text())
    raw = reference["seconds"] / new["seconds"]
    # each side's time in matmul units (seconds x FLOP/s of its own run), so that a slower or faster machine state
    # during one of the two runs does not count as a speed-up
    scaled = (reference["seconds"] * reference["matmul_gflops"]) / (new["seconds"] * new["matmul_gflops"])
    return {"new": new, "reference": reference, "speedup_raw": raw, "speedup_matmul_scaled": scaled, "wall_s": wall}


def collect(speed: dict | None, memory: dict | None, log) -> dict:
    """Run the four measurements above and return ``{"targets": {...}, "measurements": {...}}``; ``speed`` and
    ``memory`` are bench.py's sections (for ``step_vs_trl`` and ``memory_4_agents_vs_1``)."""
    measurements, targets = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-targets-") as tmp:
        tmp = Path(tmp)
        g = measurements["generation"] = measure_generation(tmp, log)
        targets["rollout_vs_plain_generate"] = target("rollout_vs_plain_generate", g["rollout_vs_plain_generate"])
        targets["rollout_vs_roofline"] = target("rollout_vs_roofline", g["rollout_vs_roofline"])
        if speed is not None:
            targets["step_vs_trl"] = target("step_vs_trl", speed["ratio_ours_over_trl"])
        a = measurements["agents"] = measure_agents(tmp, log)
        targets["per_token_4_agents_vs_1"] = target("per_token_4_agents_vs_1", a["per_token_4_agents_vs_1"])
        if memory is not None and memory.get("n_max") == 4:
            targets["memory_4_agents_vs_1"] = target("memory_4_agents_vs_1", memory["ratio_shared_nmax_over_one"])
        d = measurements["demo_step"] = measure_demo_step(tmp, log)
        targets["demo_step_s"] = target("demo_step_s", d["mean_step_s_after_first"])
        targets["train_pass_vs_matmul"] = target("train_pass_vs_matmul", d["train_pass"]["mean_after_first"])
        k = measurements["decode"] = measure_decode(tmp, log)
        for rows, ratio in decode_ratios(k).items():
            targets[f"decode_vs_bound_{rows}"] = target(f"decode_vs_bound_{rows}", ratio)
        e = measurements["evaluation"] = measure_evaluation(tmp, log)
        targets["eval_speedup"] = target("eval_speedup", e["speedup_matmul_scaled"])
    return {"targets": targets, "measurements": measurements}


# ------------------------------------------------------------------------------------------------ agents
def prefill_positions(pool, requests) -> int:
    """The prompt positions team-level generation prefills for ``requests`` (one base, distinct prompts): each shared
    prefix once per adapter (``generation/prefixes.py:shared_prefixes``, keyed by the agent's adapter as
    ``generation/team.py`` keys it), then every prompt's rest. Each agent prefills the opening its prompts share with
    its own adapter, so a team of n agents prefills it n times."""
    from trl_multiagent.generation.prefixes import shared_prefixes

    tokens = [pool.encode_prompt(r.agent, r.prompt) for r in requests]
    group_of, prefix_len = shared_prefixes(tokens, [pool.policy_of(r.agent) for r in requests])
    return sum(prefix_len) + sum(len(t) - prefix_len[g] for t, g in zip(tokens, group_of))


def profile_calls(pools: dict, requests: dict, config, calls: int = 2) -> dict:
    """``calls`` generation calls of each pool of ``pools`` (1 and 4 agents), alternately, each under
    ``torch.profiler``: per pool the median over its calls of the wall seconds and of the operators' self CPU time by
    kind (``step_profile.kind``; Python ranges such as ``time/generation`` count as ``python``) and per operator, and
    the operators whose median time differs most between the 4-agent and the 1-agent call. The profiler adds a few
    microseconds per operator, so the 4-agent call's additional operators weigh a little more than unprofiled."""
    import torch
    from measure import KINDS, kind

    records: dict[int, list] = {1: [], 4: []}
    for r in range(calls):
        for n in ((1, 4) if r % 2 == 0 else (4, 1)):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                pools[n].generate_many(requests[n], config)
                wall = time.perf_counter() - start
            ops = {e.key: (e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()}
            records[n].append((wall, ops))
    out = {}
    for n, runs in records.items():
        names = {k for _, ops in runs for k in ops}
        operators = {k: {"seconds": statistics.median(ops.get(k, (0.0, 0))[0] for _, ops in runs),
                         "count": statistics.median(ops.get(k, (0.0, 0))[1] for _, ops in runs)} for k in names}
        kinds = dict.fromkeys(KINDS, 0.0)
        for k, v in operators.items():
            kinds[kind(k)] += v["seconds"]
        out[f"{n}_agents"] = {"wall_s": [w for w, _ in runs], "kinds_s": kinds, "operators": operators}
    one, four = out["1_agents"]["operators"], out["4_agents"]["operators"]
    zero = {"seconds": 0.0, "count": 0}
    diffs = sorted(((four.get(k, zero)["seconds"] - one.get(k, zero)["seconds"], k) for k in set(one) | set(four)),
                   reverse=True)
    out["largest_differences_s"] = {k: {"4_minus_1_s": d, "1_agent": one.get(k, zero), "4_agents": four.get(k, zero)}
                                    for d, k in diffs[:12] + diffs[-6:]}
    out["kinds_4_minus_1_s"] = {k: out["4_agents"]["kinds_s"][k] - out["1_agents"]["kinds_s"][k] for k in KINDS}
    return out


def agents_workload(n: int, prompts: int = 8, samples: int = 4, new_tokens: int = 48):
    """``(pool, requests, config)`` of the ``agents`` measurement at ``n`` agents on one 4-bit SmolLM2-135M base
    (LoRA r=16, B drawn so the adapters are not no-ops): ``prompts`` TL;DR prompts, agent i taking every n-th,
    ``samples`` each, every row forced to ``new_tokens``; the pool warmed up by one call."""
    import torch
    from transformers import GenerationConfig

    from trl_multiagent.environments.writing import TLDREnv
    from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

    torch.manual_seed(0)
    env = TLDREnv()
    texts = [env.reset(task)["summary"] for task in TLDREnv.make_rows(prompts)]
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                              temperature=0.8, top_p=0.95)
    names = [f"agent{i}" for i in range(n)]
    pool = AgentPool([AgentSpec(a, model="smollm2-135m-instruct", quantization="4bit", lora_r=16, lora_alpha=32)
                      for a in names])
    with torch.no_grad():  # adapters as after training (B = 0 at initialisation would be a no-op)
        for name, p in pool.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    requests = [GenerationRequest(names[i % n], t, num_samples=samples) for i, t in enumerate(texts)]
    pool.generate_many(requests[:n], config)  # warm-up
    return pool, requests, config


def agents_main(out: str, prompts: int = 8, samples: int = 4, new_tokens: int = 48, rounds: int = 3,
                profile: int = 0) -> dict:
    """Team-level generation of the same ``prompts`` x ``samples`` rows by 1 agent and by 4 agents on one base
    (:func:`agents_workload`), every row forced to ``new_tokens``: both pools loaded, then ``rounds`` rounds each
    timing one call of each, alternately (the order swapped every round), so that a round's two calls share the
    machine's state. ``per_token_4_agents_vs_1`` is the median over rounds of the paired ratios of seconds per token
    (until 2026-11-27: the faster of two calls of each, the 1-agent calls all before the 4-agent ones). ``profile``:
    that many more calls of each team afterwards, under the profiler (:func:`profile_calls`), not timed for the
    target."""
    import torch

    result = {"prompts": prompts, "samples": samples, "new_tokens": new_tokens, "threads": torch.get_num_threads(),
              "rounds": rounds}
    pools, requests = {}, {}
    for n in (1, 4):
        pools[n], requests[n], config = agents_workload(n, prompts, samples, new_tokens)
    seconds, tokens = {1: [], 4: []}, {}
    for r in range(rounds):
        for n in ((1, 4) if r % 2 == 0 else (4, 1)):
            start = time.perf_counter()
            out_ = pools[n].generate_many(requests[n], config)
            seconds[n].append(time.perf_counter() - start)
            tokens[n] = sum(len(g.completion_ids) for gens in out_ for g in gens)
    for n in (1, 4):
        median = statistics.median(seconds[n])
        result[f"{n}_agents"] = {"seconds": median, "seconds_each_round": seconds[n], "tokens": tokens[n],
                                 "seconds_per_token": median / tokens[n],
                                 "prefill_positions": prefill_positions(pools[n], requests[n])}
    ratios = [(s4 / tokens[4]) / (s1 / tokens[1]) for s1, s4 in zip(seconds[1], seconds[4])]
    result["ratio_each_round"] = ratios
    result["per_token_4_agents_vs_1"] = statistics.median(ratios)
    # the arithmetic of each call through the linear layers (prefill positions, then every generated token with the
    # LM head), per generated token: the ratio the per-token times would have at equal efficiency
    flops = linear_flops_per_token("smollm2-135m-instruct")
    work = {n: (result[f"{n}_agents"]["prefill_positions"] * flops["layers"]
                + tokens[n] * (flops["layers"] + flops["lm_head"])) / tokens[n] for n in (1, 4)}
    result["linear_flops_per_token"] = work
    result["flops_per_token_4_agents_vs_1"] = work[4] / work[1]
    if profile:
        result["profile"] = profile_calls(pools, requests, config, profile)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result


def team_time_main(out: str, agents: int, calls: int) -> dict:
    """``calls`` timed calls of the ``agents`` workload at ``agents`` agents (:func:`agents_workload`), in the library
    this process imports (``PYTHONPATH`` decides: ``experiments/speed/agents_paired/ab.sh`` times two commits so)."""
    import trl_multiagent

    pool, requests, config = agents_workload(agents)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        pool.generate_many(requests, config)
        seconds.append(time.perf_counter() - start)
    result = {"library": str(Path(trl_multiagent.__file__).resolve().parents[1]), "agents": agents,
              "seconds": seconds, "median_s": statistics.median(seconds)}
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["agents", "team-time"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--profile", type=int, default=0, metavar="CALLS",
                        help="agents: after the timed rounds, profile CALLS more calls of each team (profile_calls)")
    parser.add_argument("--agents", type=int, default=4, help="team-time: the team's size")
    parser.add_argument("--calls", type=int, default=5, help="team-time: timed calls")
    args = parser.parse_args(argv)
    if args.what == "team-time":
        print(json.dumps(team_time_main(args.out, args.agents, args.calls)))
    else:
        print(json.dumps(agents_main(args.out, profile=args.profile), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
