"""Where the peak memory of ``make bench``'s memory runs falls: the peak RSS of each phase of a team step.

    python benchmarks/memory_phases.py [--out docs/results/memory_phases.json]

Runs ``bench.py``'s memory child (MAGRPO, n agents on one shared 4-bit SmolLM2-135M, LoRA r=8, K=4, 32 forced
tokens, 2 steps) for 1 and 4 agents, each in a fresh subprocess. A thread samples the process's RSS every 2 ms and
charges it to the phase the main thread is in: ``build`` (the trainer), ``generation`` (``AgentPool.generate_many``),
``forward`` (``AgentPool.forward``), ``backward`` (``torch.autograd.backward``), ``optimizer`` (``AdamW.step``),
``other`` (the rest of ``train``). The sampler sees most, not every, peak (it may miss a spike shorter than 2 ms):
the child's ``VmHWM`` is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TAG = "MEMORY_PHASES="


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(n_agents: int, output_dir: str) -> dict:
    sys.path.insert(0, str(HERE))
    import bench
    import torch

    from trl_multiagent.agents import AgentPool
    from trl_multiagent.models import resolve_model
    from trl_multiagent.trainers import MultiAgentGRPOTrainer

    phase, peaks = ["build"], {}

    def sample():
        while True:
            rss, name = _rss_mib(), phase[-1]
            peaks[name] = max(peaks.get(name, 0.0), rss)
            time.sleep(0.002)

    def tagged(owner, attr, name):
        original = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            phase.append(name)
            try:
                return original(*args, **kwargs)
            finally:
                phase.pop()
        setattr(owner, attr, wrapper)

    tagged(AgentPool, "generate_many", "generation")
    tagged(AgentPool, "forward", "forward")
    tagged(torch.autograd, "backward", "backward")
    tagged(torch.optim.AdamW, "step", "optimizer")
    tagged(MultiAgentGRPOTrainer, "train", "other")
    threading.Thread(target=sample, daemon=True).start()
    cfg = {"n_agents": n_agents, "layout": "shared", "model_paths": [resolve_model("smollm2-135m-instruct")] * n_agents,
           "steps": 2, "num_generations": 4, "max_completion_length": 32, "lora_r": 8, "lora_alpha": 16,
           "threads": torch.get_num_threads(), "output_dir": output_dir}
    result = bench.memory_child(cfg)
    time.sleep(0.02)
    return {"agents": n_agents, "peak_by_phase_mib": {k: round(v, 1) for k, v in peaks.items()},
            "vmhwm_mib": result["peak_rss_mib"], "final_rss_mib": result["final_rss_mib"],
            "trainable_params": result["trainable_params"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/memory_phases.json")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(TAG + json.dumps(child(args.child, args.output_dir)), flush=True)
        return 0
    import tempfile

    from measure import child_result, write_result

    from trl_multiagent.provenance import cpu_model

    runs = []
    with tempfile.TemporaryDirectory(prefix="memory-phases-") as tmp:
        for n in (1, 4):
            found = child_result([sys.executable, __file__, "--child", str(n), "--output-dir", f"{tmp}/out{n}"], TAG)
            if found is None:
                return 1
            runs.append(found)
            print(found, flush=True)
    one, four = runs
    write_result(args.out, {
        "command": "python benchmarks/memory_phases.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "runs": runs,
        "four_minus_one_mib": {"vmhwm": four["vmhwm_mib"] - one["vmhwm_mib"],
                               "final_rss": four["final_rss_mib"] - one["final_rss_mib"],
                               **{f"peak_{k}": four["peak_by_phase_mib"].get(k, 0) - v
                                  for k, v in one["peak_by_phase_mib"].items()}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
