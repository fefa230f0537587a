"""The prefill's frozen q/k/v and gate/up projections with packed copies or with ``F.linear``, on the main job's
first-turn prompts: the generation of one step timed both ways, alternately, in one process.

    python benchmarks/prefill_packed.py [--rounds 5] [--out experiments/speed/generation/prefill_packed.json]

The pool is the main job's (``targets.MAIN_JOB``: a reasoner and a tool agent on one shared LoRA policy, r=16, of the
embedded SmolLM2-135M-Instruct in float32), where the teacher-forced passes pack every frozen layer
(``pool.packs_training``); the prompts are its environment's first-turn prompts of 4 training problems, 4 samples
per agent and problem (32 rows), sampled as the recipe samples (temperature 0.7, up to 40 new tokens, the same seed
both ways). Two ways:

* ``packed``: the library's prefill (``generation.team.prefill_unpacked`` leaves nothing out: the prefill computes
  q/k/v and gate/up with the per-layer packed copies that training makes anyway);
* ``unpacked``: those layers through ``F.linear``, as the prefill computed them before (the lean decoding step's
  concatenated copies only).

Both ways' decoding steps are the same lean step. Each round times one generation per way (the order alternates
between rounds); a warm-up generation per way first makes every packed copy. Reported: each way's median, the median
of the per-round ratios (unpacked over packed), the matmul rate around the run, and whether the two ways sampled the
same tokens (float summation order differs between them, so a sampled token may differ where two are nearly tied).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from measure import matmul_flops, paired_medians, write_result
from targets import MAIN_JOB
from transformers import GenerationConfig

from trl_multiagent.command.recipe import resolve_environment
from trl_multiagent.generation import team
from trl_multiagent.runtime.provenance import cpu_flags, cpu_model
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--out", default="experiments/speed/generation/prefill_packed.json")
    args = parser.parse_args(argv)
    specs = [AgentSpec(name=n, model="smollm2-135m-instruct", policy="shared", lora_r=16, lora_alpha=32)
             for n in ("reasoner", "tool")]
    pool = AgentPool(specs)
    (key,) = pool.bases
    if not (pool.packs_training(key) and pool.lean_decodes(key)):
        raise SystemExit(f"this machine's pool does not pack the training passes or decode lean (packs_training "
                         f"{pool.packs_training(key)}, lean {pool.lean_decodes(key)}): nothing to compare")
    env_class = resolve_environment("math_tool_generalisation")
    env = env_class(max_turns=2, max_feedback_chars=300, worked_examples="each_operation")
    tasks = env_class.make_dataset(num_tasks=args.problems, seed=0, split="train")
    requests = []
    for task in tasks:
        prompts = env.reset(task)
        requests += [GenerationRequest(agent, prompts[agent], num_samples=args.samples) for agent in env.agents]
    config = GenerationConfig(max_new_tokens=40, do_sample=True, temperature=0.7, top_p=1.0)
    library = team.prefill_unpacked

    def unpacked(pool_, key_, model, lean):  # the prefill as before: the lean step's concatenated layers unpacked
        return team.LeanStep.concatenated_modules(model) if lean else []

    ways = {"packed": library, "unpacked": unpacked}

    def generate(way: str) -> tuple[float, list]:
        team.prefill_unpacked = ways[way]
        try:
            torch.manual_seed(0)
            start = time.perf_counter()
            out = pool.generate_many(requests, config)
            return time.perf_counter() - start, [g.completion_ids for gens in out for g in gens]
        finally:
            team.prefill_unpacked = library

    rate_before = matmul_flops()
    tokens = {way: generate(way)[1] for way in ways}  # warm-up: every packed copy made
    times: dict[str, list[float]] = {way: [] for way in ways}
    same = []
    for round_ in range(args.rounds):
        order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
        got = {}
        for way in order:
            seconds, got[way] = generate(way)
            times[way].append(seconds)
        same.append(got["packed"] == got["unpacked"])
        print(f"round {round_ + 1}: " + ", ".join(f"{w} {times[w][-1]:.2f} s" for w in ways), flush=True)
    medians, ratios = paired_medians(times, "unpacked")
    rows = sum(r.num_samples for r in requests)
    write_result(args.out, {
        "command": "python benchmarks/prefill_packed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(), "recipe": MAIN_JOB,
        "rows": rows, "new_tokens": sum(len(t) for t in tokens["packed"]),
        "matmul_gflops": (rate_before + matmul_flops()) / 2 / 1e9, "seconds": times, "median_seconds": medians,
        "unpacked_over_packed": ratios["packed"],
        "rounds_with_the_same_tokens": sum(same), "warm_up_same_tokens": tokens["packed"] == tokens["unpacked"],
        "mean_generation_s": statistics.fmean(times["packed"]),
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
