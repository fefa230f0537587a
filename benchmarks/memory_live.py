"""The live tensors of ``make bench``'s memory runs, as the allocator sees them: 1 and 4 agents, packed or not.

    python benchmarks/memory_live.py [--out experiments/speed/memory_ab/live_tensors.json]

``memory_4_agents_vs_1`` compares peak resident memory (``VmHWM``), which holds, besides the live tensors, whatever
glibc keeps of the memory freed before. To tell the two apart, this script runs ``bench.py``'s memory child (MAGRPO,
n agents on one shared 4-bit SmolLM2-135M, LoRA r=8, K=4, 32 forced tokens, 2 steps), each configuration in a fresh
subprocess, with ``torch.profiler``'s memory events over the second step's ``training_step`` (rollout, forward and
backward; the optimizer's step is outside it). Summing every allocation and free of a CPU tensor in time order gives
the live tensor bytes relative to the step's start: their peak (``peak_live_mib``), and what is still live at the
step's end (``net_live_mib``: the gradients, which stay until the optimizer's step). Unlike resident memory these
counts do not depend on the allocator, so one run each suffices.

Configurations: 1 and 4 agents, each with the teacher-forced pass's completions packed per prompt (the library) and
one row per completion (``teacher_forcing.PACKED_MODEL_TYPES`` emptied in the child). The profiler's own memory makes
the children's resident memory larger than ``make bench``'s; it is recorded, not compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
TAG = "MEMORY_LIVE="


def child(n_agents: int, packed: bool, output_dir: str) -> dict:
    sys.path.insert(0, str(HERE))
    import bench
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trl_multiagent.generation import teacher_forcing
    from trl_multiagent.models.loading import resolve_model
    from trl_multiagent.trainers import MAGRPOTrainer

    if not packed:
        teacher_forcing.PACKED_MODEL_TYPES = frozenset()
    original, calls, found = MAGRPOTrainer.training_step, [0], {}

    def step(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] != 2:
            return original(self, *args, **kwargs)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = original(self, *args, **kwargs)
        events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                        key=lambda e: e.start_ns())
        live = peak = 0
        for event in events:
            live += event.nbytes()
            peak = max(peak, live)
        found.update(peak_live_mib=peak / 2**20, net_live_mib=live / 2**20, memory_events=len(events))
        return out

    MAGRPOTrainer.training_step = step
    cfg = {"n_agents": n_agents, "layout": "shared", "model_paths": [resolve_model("smollm2-135m-instruct")] * n_agents,
           "steps": 2, "num_generations": 4, "max_completion_length": 32, "lora_r": 8, "lora_alpha": 16,
           "threads": torch.get_num_threads(), "output_dir": output_dir}
    result = bench.memory_child(cfg)
    if not found:
        raise RuntimeError("the second training step was not profiled")
    return {"agents": n_agents, "packed": packed, **found, "trainable_params": result["trainable_params"],
            "vmhwm_mib_with_profiler": result["peak_rss_mib"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/memory_ab/live_tensors.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        n, packed, output_dir = json.loads(args.child)
        print(TAG + json.dumps(child(n, packed, output_dir)), flush=True)
        return 0
    from measure import child_result, write_result

    from trl_multiagent.runtime.provenance import cpu_model

    runs = []
    with tempfile.TemporaryDirectory(prefix="memory-live-") as tmp:
        for n in (1, 4):
            for packed in (True, False):
                spec = json.dumps([n, packed, f"{tmp}/out{n}{int(packed)}"])
                found = child_result([sys.executable, __file__, "--child", spec], TAG)
                if found is None:
                    return 1
                runs.append(found)
                print(found, flush=True)

    def run(n, packed):
        return next(r for r in runs if r["agents"] == n and r["packed"] == packed)

    summary = {}
    for packed in (True, False):
        one, four = run(1, packed), run(4, packed)
        summary["packed" if packed else "rows"] = {
            "peak_live_4_minus_1_mib": four["peak_live_mib"] - one["peak_live_mib"],
            "transient_live_mib": {n: r["peak_live_mib"] - r["net_live_mib"] for n, r in ((1, one), (4, four))},
            "gradients_mib": {n: r["trainable_params"] * 4 / 2**20 for n, r in ((1, one), (4, four))}}
    summary["packed_minus_rows_peak_live_mib"] = {n: run(n, True)["peak_live_mib"] - run(n, False)["peak_live_mib"]
                                                  for n in (1, 4)}
    print(summary, flush=True)
    write_result(args.out, {
        "command": "python benchmarks/memory_live.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "runs": runs, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
