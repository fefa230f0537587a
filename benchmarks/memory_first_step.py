"""The tensors the first training step of ``make bench``'s memory runs creates and keeps: what, besides the gradients
and the optimizer's moments, stays allocated from the first step into the second, and how torch's live bytes peak in
each phase of both steps.

    python benchmarks/memory_first_step.py [--out experiments/speed/memory_ab/first_step_tensors.json]

Runs ``bench.py``'s memory child (MAGRPO, n agents on one shared 4-bit SmolLM2-135M, LoRA r=8, K=4, 32 forced tokens,
2 steps) for 1 and 4 agents, each in a fresh subprocess, under ``torch.profiler`` with ``profile_memory`` over the
whole ``train()``. Every CPU allocation and free of a tensor is read from the profiler's event tree (a private torch
API, ``kineto_results.experimental_event_tree``) with the innermost of the trainer's phase ranges that holds it
(``time/generation``, ``time/forward``, ``time/backward``, ``time/optimizer``; ``other`` outside them). Reported per
run:

* ``kept_from_first_step``: the allocations made before the first ``time/optimizer`` range ends that are still
  allocated when the second one begins, by phase: count, MiB and the most common sizes;
* ``phase_peaks``: for each occurrence of a phase, in order, the peak of torch's live CPU bytes during it, counted
  from the start of ``train()`` (the model, loaded before, is not in it).

Unlike resident memory these counts do not depend on the allocator: what the heap holds beyond them is glibc's (see
``memory_phases.py`` for the resident side). The profiler's own memory makes the children's resident memory larger
than ``make bench``'s; it is recorded, not compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
TAG = "MEMORY_FIRST_STEP="
PHASES = ("time/generation", "time/forward", "time/backward", "time/optimizer", "time/environment")


def allocations(prof) -> tuple[list[tuple[int, int, int, str]], list[tuple[int, int]]]:
    """``(time ns, address, bytes (negative: a free), phase)`` of every CPU allocation event of a finished profile, in
    time order, and the ``(start, end)`` ns of each ``time/optimizer`` range."""
    from torch._C._profiler import _EventType

    events, optimizer = [], []
    stack = [(root, "other") for root in prof.profiler.kineto_results.experimental_event_tree()]
    while stack:
        event, phase = stack.pop()
        if event.name in PHASES:
            phase = event.name
            if phase == "time/optimizer":
                optimizer.append((event.start_time_ns, event.end_time_ns))
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            fields = event.extra_fields
            events.append((event.start_time_ns, fields.ptr, fields.alloc_size, phase))
        stack.extend((child, phase) for child in event.children)
    return sorted(events), sorted(optimizer)


def analyse(events, optimizer) -> dict:
    """The two reports of the module docstring from :func:`allocations`' output."""
    if len(optimizer) < 2:
        raise RuntimeError(f"two optimizer steps were expected, the profile holds {len(optimizer)}")
    first_end, second_start = optimizer[0][1], optimizer[1][0]
    # 1. what is still allocated when the second optimizer step begins, and was made before the first one ended
    live: dict[int, tuple[int, int, str]] = {}  # address -> (time, bytes, phase) of the allocation
    for time_ns, ptr, size, phase in events:
        if time_ns >= second_start:
            break
        if size > 0:
            live[ptr] = (time_ns, size, phase)
        else:
            live.pop(ptr, None)
    kept: dict[str, list] = defaultdict(lambda: [0, 0, Counter()])
    for made, nbytes, phase in live.values():
        if made < first_end:
            entry = kept[phase]
            entry[0] += 1
            entry[1] += nbytes
            entry[2][nbytes] += 1
    # 2. torch's live bytes at their peak in each stretch of one phase (a stretch outside the ranges ends none)
    peaks: list[dict] = []
    total = 0
    for _, _, size, phase in events:
        total += size
        if phase == "other":
            continue
        if not peaks or peaks[-1]["phase"] != phase:
            peaks.append({"phase": phase, "peak_live_mib": total / 2**20})
        peaks[-1]["peak_live_mib"] = max(peaks[-1]["peak_live_mib"], total / 2**20)
    return {"kept_from_first_step": {phase: {"tensors": n, "mib": b / 2**20,
                                             "sizes_bytes": [[s, c] for s, c in sizes.most_common(6)]}
                                     for phase, (n, b, sizes) in sorted(kept.items(), key=lambda kv: -kv[1][1])},
            "phase_peaks": [{"phase": e["phase"], "peak_live_mib": round(e["peak_live_mib"], 1)} for e in peaks]}


def child(n_agents: int, output_dir: str) -> dict:
    sys.path.insert(0, str(HERE))
    import bench
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trl_multiagent.models.loading import resolve_model
    from trl_multiagent.trainers import MAGRPOTrainer

    original, found = MAGRPOTrainer.train, {}

    def train(self, *args, **kwargs):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = original(self, *args, **kwargs)
        found.update(analyse(*allocations(prof)))
        return out

    MAGRPOTrainer.train = train
    cfg = {"n_agents": n_agents, "layout": "shared", "model_paths": [resolve_model("smollm2-135m-instruct")] * n_agents,
           "steps": 2, "num_generations": 4, "max_completion_length": 32, "lora_r": 8, "lora_alpha": 16,
           "threads": torch.get_num_threads(), "output_dir": output_dir}
    result = bench.memory_child(cfg)
    return {"agents": n_agents, **found, "trainable_params": result["trainable_params"],
            "vmhwm_mib_with_profiler": result["peak_rss_mib"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/memory_ab/first_step_tensors.json")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        n, output_dir = json.loads(args.child)
        print(TAG + json.dumps(child(n, output_dir)), flush=True)
        return 0
    from measure import child_result, write_result

    from trl_multiagent.runtime.provenance import cpu_model

    runs = []
    with tempfile.TemporaryDirectory(prefix="memory-first-step-") as tmp:
        for n in (1, 4):
            found = child_result([sys.executable, __file__, "--child", json.dumps([n, f"{tmp}/out{n}"])], TAG)
            if found is None:
                return 1
            runs.append(found)
    write_result(args.out, {
        "command": "python benchmarks/memory_first_step.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
