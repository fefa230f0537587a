"""Run the tests that compare two numerical paths under every kernel choice and thread count this CPU offers, and
report each comparison's worst deviation against its tolerance (tests/numerics.py).

    .venv/bin/python tests/numerics_matrix.py                 # writes experiments/speed/numerics/<cpu>.json and .md
    .venv/bin/python tests/numerics_matrix.py --tests tests/test_logprobs.py --threads 1

Kernel choices: ``ATEN_CPU_CAPABILITY`` = default (no vector instructions), avx2 and, where the CPU has AVX-512,
avx512, each with oneDNN's and MKL's instruction sets capped to match (``ONEDNN_MAX_CPU_ISA``,
``MKL_ENABLE_INSTRUCTIONS``: SSE4.1/SSE4.2 with default, AVX2 with avx2, uncapped with avx512), so that the matmuls
change their code paths too; threads: 1 and 2 (``TEST_NUM_THREADS`` for the tests' own process,
``OMP_NUM_THREADS`` for the processes they launch). Each configuration runs the tests once with ``NUMERICS_LOG``
set; a failing test fails the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from trl_multiagent.runtime.provenance import cpu_flags, cpu_model

ROOT = Path(__file__).resolve().parents[1]

#: every test with a comparison of two numerical paths (tests/numerics.py); test_vllm.py's run in .venv-vllm. Whole
#: files would work too, at several times the cost: the rest of their tests compare nothing numerical.
NUMERICAL_TESTS = [
    "tests/test_logprobs.py",
    "tests/test_lean_step.py",
    "tests/test_magrpo.py::test_two_turn_update_sums_the_per_turn_means",
    "tests/test_micro_batches.py::test_the_update_runs_a_shared_prefix_once_for_all_its_micro_batches",
    "tests/test_verifier_training.py::test_command_end_to_end_and_the_debate_trainer_loads_the_verifier",
    "tests/test_generation.py::test_mixed_adapter_batch_gives_each_row_its_own_agents_greedy_answer",
    "tests/test_generation.py::test_samples_of_one_prompt_share_one_prefill",
    "tests/test_generation.py::test_prompts_with_a_shared_prefix_prefill_it_once",
    "tests/test_generation.py::test_dense_copy_computes_what_the_4bit_layer_computes",
    "tests/test_generation.py::test_packed_frozen_linears_give_the_same_answers_as_f_linear",
    "tests/test_generation.py::test_bucketed_prefill_gives_every_row_its_greedy_answer_and_pads_less",
    "tests/test_agents.py::test_generate_many_answers_every_request_in_order",
    "tests/test_trainer.py::test_max_grad_norm_bounds_each_policy_separately",
    "tests/test_trl_equivalence.py",
    "tests/test_verifier.py::test_loss_is_token_bce_over_the_latter_half_of_the_solution",
    "tests/test_verifier.py::test_trained_verifier_saved_reloaded_and_used_as_the_debate_scorer",
    "tests/test_losses.py",
    "tests/test_maporl.py::test_value_loss_trains_only_the_critics_and_is_the_clipped_loss",
    "tests/test_collm.py::test_centralized_critic_loss_is_one_mean_over_joint_transitions",
    "tests/test_collm.py::test_actor_is_the_unclipped_ratio_objective_of_eq_2_and_4",
    "tests/test_mhgpo_trainer.py::test_eq6_agent_weights_reach_the_gradient",
    "tests/test_models.py::test_converted_model_generates_and_matches_gguf",
    "tests/test_sharded.py::test_fsdp_two_processes_match_one_process_and_resume",
    "tests/test_distributed.py",
    "tests/test_vllm_config.py",
]
#: tests/test_numerics.py checks the helpers themselves on made-up tensors, some of them deliberately beyond the
#: tolerance (the helper must fail there): its records are no comparison of two numerical paths and are left out.
SELF_TESTS = "tests/test_numerics.py"


def capabilities() -> list[str]:
    flags = set(cpu_flags())
    caps = ["default"]
    if "avx2" in flags:
        caps.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        caps.append("avx512")
    return caps


#: the instruction-set caps of oneDNN and MKL that go with each ATen capability
LIBRARY_CAPS = {"default": {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
                "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
                "avx512": {}}


def run(tests: list[str], capability: str, threads: int, log: Path) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")}
    env.update(ATEN_CPU_CAPABILITY=capability, TEST_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
               NUMERICS_LOG=str(log), **LIBRARY_CAPS[capability])
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    print(f"== ATEN_CPU_CAPABILITY={capability} threads={threads}: {' '.join(cmd[3:])}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env)
    return proc.returncode


def summarise(records: list[dict]) -> dict:
    comparisons: dict[tuple[str, str], dict] = {}
    greedy = defaultdict(lambda: {"identical": 0, "ties": 0, "worst_tie_gap_over_allowed": 0.0})
    for r in records:
        if r["test"].startswith(SELF_TESTS):
            continue
        key = (r["test"], r["what"])
        if "deviation" in r:
            c = comparisons.setdefault(key, {"test": r["test"], "what": r["what"], "terms": r["terms"],
                                             "dtype": r["dtype"], "tolerance": r["tolerance"],
                                             "worst_deviation": 0.0, "worst_config": None, "runs": 0})
            c["runs"] += 1
            if r["deviation"] >= c["worst_deviation"]:
                c["worst_deviation"], c["worst_config"] = r["deviation"], r["config"]
            c["tolerance"] = min(c["tolerance"], r["tolerance"])
        else:
            g = greedy[r["test"]]
            if r["greedy"] == "identical":
                g["identical"] += 1
            else:
                g["ties"] += 1
                g["worst_tie_gap_over_allowed"] = max(g["worst_tie_gap_over_allowed"], r["gap"] / r["allowed"])
    rows = sorted(comparisons.values(), key=lambda c: (c["test"], c["what"]))
    for c in rows:
        c["worst_over_tolerance"] = c["worst_deviation"] / c["tolerance"]
    return {"comparisons": rows, "greedy": dict(greedy)}


def markdown(result: dict) -> str:
    lines = [f"# Numerical comparisons on {result['cpu']}", "",
             f"Command: `{result['command']}`; torch {result['torch']}; kernel choices {result['capabilities']}, "
             f"threads {result['threads']}; {result['configurations']} configurations, exit codes "
             f"{result['exit_codes']}.", "",
             "Each row: one comparison of two numerical paths (tests/numerics.py), its tolerance (from its summed "
             "terms), and the worst relative deviation (norm of the difference over the norm of the reference) seen "
             "in any configuration.", "",
             "| test | comparison | terms | tolerance | worst deviation | worst / tolerance | worst in |",
             "|---|---|---|---|---|---|---|"]
    for c in result["summary"]["comparisons"]:
        test = c["test"].replace("tests/", "")
        lines.append(f"| {test} | {c['what']} | {c['terms']} | {c['tolerance']:.2e} | {c['worst_deviation']:.2e} | "
                     f"{c['worst_over_tolerance']:.1e} | {c['worst_config']} |")
    lines += ["", "Greedy decodings along two paths (equal token for token, or a rounding tie):", "",
              "| test | identical | ties | worst tie gap / allowed |", "|---|---|---|---|"]
    for test, g in sorted(result["summary"]["greedy"].items()):
        lines.append(f"| {test.replace('tests/', '')} | {g['identical']} | {g['ties']} | "
                     f"{g['worst_tie_gap_over_allowed']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", nargs="+", default=NUMERICAL_TESTS)
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--capabilities", nargs="+", default=None, help="default: every one this CPU has")
    parser.add_argument("--out", default=None, help="default: experiments/speed/numerics/<cpu>.json (and .md)")
    args = parser.parse_args(argv)
    import torch

    caps = args.capabilities or capabilities()
    records, codes = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for cap in caps:
            for threads in args.threads:
                log = Path(tmp) / f"{cap}-{threads}.jsonl"
                codes[f"{cap}/{threads}"] = run(args.tests, cap, threads, log)
                if log.exists():
                    for line in log.read_text().splitlines():
                        records.append({**json.loads(line), "config": f"{cap}/{threads}"})
    cpu = cpu_model()
    result = {"cpu": cpu, "isa": cpu_flags(),
              "torch": torch.__version__, "capabilities": caps, "threads": args.threads,
              "configurations": len(codes), "exit_codes": codes,
              "command": "python tests/numerics_matrix.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "tests": args.tests, "summary": summarise(records)}
    slug = "".join(ch if ch.isalnum() else "_" for ch in cpu).strip("_").lower()
    out = Path(args.out) if args.out else ROOT / "experiments" / "speed" / "numerics" / f"{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    worst = max((c["worst_over_tolerance"] for c in result["summary"]["comparisons"]), default=0.0)
    print(f"wrote {out} and {out.with_suffix('.md')}; worst deviation / tolerance {worst:.1e}")
    return 0 if all(code == 0 for code in codes.values()) and worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
