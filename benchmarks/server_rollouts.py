"""A team's training steps with generation through vLLM, five ways, as ratios measured in one run (issue 63 item 4):

* ``server k=0``: a ``vllm serve`` of the base on its own CPU core(s), the trainer on the other(s), synchronous;
* ``colocated``: vLLM's engine inside the training process (``vllm_mode: colocate``), on the trainer's core(s) only;
* ``colocated k=1``: the same engine generating the next step's rollout in a worker thread while the trainer updates
  (``max_staleness: 1``), on the same core(s);
* ``server k=1``, ``server k=2``: the server, with asynchronous rollouts (``max_staleness``): the next k steps'
  rollouts are generated while the trainer updates.

    .venv-vllm/bin/python benchmarks/server_rollouts.py                  # the main job's recipe, 6 steps, 2 rounds
    .venv-vllm/bin/python benchmarks/server_rollouts.py --steps 4 --rounds 1 --out /tmp/sr.json --episodes_per_step 1

Every way is a fresh ``python -m trl_multiagent train`` of the same recipe and seed (``--evaluator none``), run in
alternating order round after round (any other ``--field value`` is a recipe field of every run); the server is started once and serves every server run (each run loads its own
adapter versions and the server is told nothing else). Per run: the mean ``step_time`` of the steps after the first
(steps per hour = 3600 over it) and the tokens generated per second of step (``tokens/generated`` over
``step_time``). The ratios are each way's over ``server k=0``'s, median over rounds. Needs vLLM (``make test-vllm``'s
``.venv-vllm``); the CPU split is ``--server_cores`` (default: the first core) and the rest for the trainer. Writes
``experiments/speed/server_rollouts/<cpu>.json`` and ``.md`` (``--out``: elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB = "recipes/configs/math_generalisation_at_grpo.yaml"
WAYS = ("server k=0", "colocated", "colocated k=1", "server k=1", "server k=2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_flags(cores: set[int], max_loras: int, rank: int) -> tuple[list[str], dict[str, str]]:
    """The server's flags and environment: LoRA loading at runtime, ``cores`` for its threads."""
    env = {"OMP_NUM_THREADS": str(len(cores)), "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cores)))}
    return ["--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(rank), "--dtype", "float32",
            "--logprobs-mode", "processed_logprobs", "--max-model-len", "2048", "--gpu-memory-utilization", "0.2",
            "--seed", "0", "--generation-config", "vllm",
            # vllm-cpu 0.32 fails a seeded request whose prefill is split in chunks ("CPU Generator does not use
            # offset", every later request answered 500): a token budget no step's prefill exceeds keeps it whole
            "--max-num-batched-tokens", "65536"], env


def run_way(way: str, args, port: int, cores: set[int], out: Path) -> dict:
    """One training run of ``way``; its steps' times and tokens from metrics.jsonl."""
    command = [sys.executable, "-m", "trl_multiagent", "train", "--config", args.config, "--max_steps",
               str(args.steps), "--evaluator", "none", "--output_dir", str(out), "--overwrite_output_dir", "true",
               "--disable_tqdm", "true", "--save_strategy", "no", "--use_vllm", "true", "--num_threads",
               str(len(cores)), *args.override]
    if way.startswith("colocated"):
        command += ["--vllm_mode", "colocate", "--vllm_gpu_memory_utilization", "0.2"]  # on a CPU: of its memory
        command += ["--max_staleness", way.rsplit("=", 1)[1]] if "k=" in way else []
    else:
        command += ["--vllm_mode", "server", "--vllm_server_base_url", f"http://127.0.0.1:{port}",
                    "--max_staleness", way.rsplit("=", 1)[1]]
    env = {**os.environ, "OMP_NUM_THREADS": str(len(cores)), "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cores)))}
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, cores))
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{way}: the run failed ({result.returncode}): {result.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step_time" in r]
    later = steps[1:] or steps
    seconds = sum(r["step_time"] for r in later)
    tokens = sum(r["tokens/generated"] for r in later)
    return {"way": way, "step_time_s": [round(r["step_time"], 3) for r in steps],
            "mean_step_s_after_first": seconds / len(later), "steps_per_hour": 3600 * len(later) / seconds,
            "generated_tokens": tokens, "tokens_per_step_second": tokens / seconds, "wall_s": wall,
            "staleness_max": max((r.get("async/staleness_max", 0.0) for r in steps), default=0.0),
            "reward": statistics.fmean(r["reward"] for r in steps if "reward" in r)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=MAIN_JOB)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server_cores", default="0", help="comma-separated CPU cores of the server")
    parser.add_argument("--out", default=None)
    args, args.override = parser.parse_known_args(argv)  # the rest: recipe fields, --field value
    sys.path.insert(0, str(ROOT))
    from trl_multiagent.command.recipe_parser import parse_recipe
    from trl_multiagent.models.loading import resolve_model
    from trl_multiagent.runtime.provenance import cpu_generation, cpu_model, versions
    from trl_multiagent.testing import serve_vllm

    recipe = parse_recipe(["--config", args.config, *args.override])[0]
    model = resolve_model(recipe.model)
    all_cores = sorted(os.sched_getaffinity(0))
    server_cores = {int(c) for c in args.server_cores.split(",")}
    trainer_cores = set(all_cores) - server_cores
    if not trainer_cores:
        raise SystemExit(f"--server_cores {args.server_cores} leaves no core of {all_cores} to the trainer")
    policies = 1 if recipe.policy_mapping == "shared" else 2
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        port = free_port()
        flags, env = server_flags(server_cores, policies * 3 + 1, recipe.lora_r)
        runs = []
        with serve_vllm(model, port, flags, tmp / "serve.log", cores=server_cores, env=env):
            for r in range(args.rounds):
                order = WAYS if r % 2 == 0 else WAYS[::-1]
                for way in order:
                    print(f"round {r + 1}: {way} ...", file=sys.stderr, flush=True)
                    runs.append({"round": r + 1, **run_way(way, args, port, trainer_cores,
                                                             tmp / way.replace(" ", "_").replace("=", ""))})
                    print(f"  {runs[-1]['mean_step_s_after_first']:.2f} s a step", file=sys.stderr, flush=True)
    ratios = {}
    for way in WAYS[1:]:
        per_round = [a["steps_per_hour"] / b["steps_per_hour"] for a, b in zip(
            [x for x in runs if x["way"] == way], [x for x in runs if x["way"] == "server k=0"])]
        tokens = [a["tokens_per_step_second"] / b["tokens_per_step_second"] for a, b in zip(
            [x for x in runs if x["way"] == way], [x for x in runs if x["way"] == "server k=0"])]
        ratios[way] = {"steps_per_hour_vs_server_k0": statistics.median(per_round),
                       "tokens_per_s_vs_server_k0": statistics.median(tokens), "each_round": per_round}
    record = {"command": "python benchmarks/server_rollouts.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu_model(),
              "cpu_generation": cpu_generation(), "server_cores": sorted(server_cores),
              "trainer_cores": sorted(trainer_cores), "recipe": args.config, "steps": args.steps,
              "versions": versions(), "ratios": ratios, "runs": runs}
    slug = "_".join(filter(None, (cpu_model(), cpu_generation()))).lower().replace(" ", "_")
    out = Path(args.out) if args.out else ROOT / "experiments" / "speed" / "server_rollouts" / f"{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    lines = [f"# Team steps through vLLM ({record['cpu']} {record['cpu_generation']}, {record['date']})", "",
             f"`{record['command']}`: {args.config}, {args.steps} steps a run, server on cores {sorted(server_cores)}, "
             f"trainer on {sorted(trainer_cores)}; the colocated engine runs on the trainer's cores only.", "",
             "| way | s a step (after the first, median over rounds) | steps per hour vs server k=0 | "
             "tokens per s vs server k=0 | largest staleness |", "|---|---|---|---|---|"]
    for way in WAYS:
        mine = [x for x in runs if x["way"] == way]
        ratio = ratios.get(way, {"steps_per_hour_vs_server_k0": 1.0, "tokens_per_s_vs_server_k0": 1.0})
        lines.append(f"| {way} | {statistics.median(x['mean_step_s_after_first'] for x in mine):.2f} | "
                     f"{ratio['steps_per_hour_vs_server_k0']:.3f} | {ratio['tokens_per_s_vs_server_k0']:.3f} | "
                     f"{max(x['staleness_max'] for x in mine):.0f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
