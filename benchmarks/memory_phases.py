"""Where the peak memory of ``make bench``'s memory runs falls, and what glibc's heap holds there: the peak RSS of
each call of each phase of a team step, with or without each policy's gradients in one block.

    python benchmarks/memory_phases.py [--out experiments/speed/memory_phases/memory_phases.json] [--rounds 2]

Runs ``bench.py``'s memory child (MAGRPO, n agents on one shared 4-bit SmolLM2-135M, LoRA r=8, K=4, 32 forced
tokens, 2 steps) for 1 and 4 agents, each in a fresh subprocess, with the library as it is (``blocks``) and with
``trainers.base.gradients_in_one_block`` made a no-op (``scattered``: each gradient allocated by the backward pass
when it is first computed), alternating, ``--rounds`` times. A thread samples the process's RSS every 2 ms and
charges it to the call the main thread is in: ``build`` (the trainer), ``generation`` (``AgentPool.generate_many``),
``forward`` (``AgentPool.forward``), ``backward`` (``torch.autograd.backward``), ``optimizer`` (``AdamW.step``),
``other`` (the rest of ``train``), each numbered by call (``backward3``: the third). At each call's highest sample it
also reads glibc's ``mallinfo2``: ``heap_mib`` (the arenas' size), ``heap_in_use_mib``, ``heap_free_mib`` and
``mmapped_mib`` (blocks with mappings of their own). The sampler sees most, not every, peak (it may miss a spike
shorter than 2 ms): the child's ``VmHWM`` is reported beside it, and is what the ratios use.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TAG = "MEMORY_PHASES="
VARIANTS = ("blocks", "scattered")


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


class _MallInfo2(ctypes.Structure):  # <malloc.h>, glibc 2.33 and later
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_reader():
    """A function returning glibc's heap counters in MiB, or ``None`` where there is no ``mallinfo2``."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2

    def read() -> dict[str, float]:
        m = mallinfo2()
        return {"heap_mib": round(m.arena / 2**20, 1), "heap_in_use_mib": round(m.uordblks / 2**20, 1),
                "heap_free_mib": round(m.fordblks / 2**20, 1), "mmapped_mib": round(m.hblkhd / 2**20, 1)}
    return read


def child(n_agents: int, variant: str, output_dir: str) -> dict:
    sys.path.insert(0, str(HERE))
    import bench
    import torch

    import trl_multiagent.trainers.base as trainer_base
    from trl_multiagent.models.loading import resolve_model
    from trl_multiagent.team.pool import AgentPool
    from trl_multiagent.trainers import MAGRPOTrainer

    if variant == "scattered":
        trainer_base.gradients_in_one_block = lambda params: 0
    heap = _heap_reader()
    phase, calls, peaks = ["build"], {}, {}

    def sample():
        while True:
            rss, name = _rss_mib(), phase[-1]
            if rss > peaks.get(name, {}).get("rss_mib", 0.0):
                peaks[name] = {"rss_mib": round(rss, 1), **(heap() if heap else {})}
            time.sleep(0.002)

    def tagged(owner, attr, name):
        original = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            phase.append(f"{name}{calls[name]}")
            try:
                return original(*args, **kwargs)
            finally:
                phase.pop()
        setattr(owner, attr, wrapper)

    tagged(AgentPool, "generate_many", "generation")
    tagged(AgentPool, "forward", "forward")
    tagged(torch.autograd, "backward", "backward")
    tagged(torch.optim.AdamW, "step", "optimizer")
    tagged(MAGRPOTrainer, "train", "other")
    threading.Thread(target=sample, daemon=True).start()
    cfg = {"n_agents": n_agents, "layout": "shared", "model_paths": [resolve_model("smollm2-135m-instruct")] * n_agents,
           "steps": 2, "num_generations": 4, "max_completion_length": 32, "lora_r": 8, "lora_alpha": 16,
           "threads": torch.get_num_threads(), "output_dir": output_dir}
    result = bench.memory_child(cfg)
    time.sleep(0.02)
    by_phase: dict[str, float] = {}
    for name, found in peaks.items():
        kind = name.rstrip("0123456789")
        by_phase[kind] = max(by_phase.get(kind, 0.0), found["rss_mib"])
    return {"agents": n_agents, "variant": variant, "peak_by_phase_mib": by_phase, "peak_by_call": peaks,
            "vmhwm_mib": result["peak_rss_mib"], "final_rss_mib": result["final_rss_mib"],
            "trainable_params": result["trainable_params"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/memory_phases/memory_phases.json")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        n, variant, output_dir = json.loads(args.child)
        print(TAG + json.dumps(child(n, variant, output_dir)), flush=True)
        return 0
    import tempfile

    from measure import child_result, write_result

    from trl_multiagent.runtime.provenance import cpu_model

    runs, ratios = [], []
    with tempfile.TemporaryDirectory(prefix="memory-phases-") as tmp:
        for round_ in range(1, args.rounds + 1):
            for variant in VARIANTS:
                pair = {}
                for n in (1, 4):
                    spec = json.dumps([n, variant, f"{tmp}/out{round_}{variant}{n}"])
                    found = child_result([sys.executable, __file__, "--child", spec], TAG)
                    if found is None:
                        return 1
                    found["round"] = round_
                    runs.append(found)
                    pair[n] = found
                ratios.append({"round": round_, "variant": variant,
                               "vmhwm_mib": {n: pair[n]["vmhwm_mib"] for n in (1, 4)},
                               "memory_4_agents_vs_1": pair[4]["vmhwm_mib"] / pair[1]["vmhwm_mib"]})
                print(ratios[-1], flush=True)
    write_result(args.out, {
        "command": "python benchmarks/memory_phases.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "load": os.getloadavg(), "ratios": ratios, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
