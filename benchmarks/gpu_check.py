"""GPU check (issue 38 item 4): a few MAGRPO steps of a team on a CUDA machine, against TRL's GRPOTrainer.

    python benchmarks/gpu_check.py --out experiments/speed/gpu            # CUDA: ~0.5B Llama, bf16 (+ 4-bit base)
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/x  # the same code on a tiny model, CPU, < 1 min

The model is a Llama built from a config in this file (random weights, no download): about 0.5B parameters
(32000-token vocabulary, 28 layers of width 1024), or with ``--tiny`` a few thousand. Its tokenizer is the
character-level one of the tests (``trl_multiagent.testing.char_tokenizer``), padded with filler tokens to the model's vocabulary, with a
plain chat template. For each base -- the weights in bf16 (float32 on CPU) and, when bitsandbytes can quantize on
the GPU, a 4-bit NF4 base (on CPU only with ``--cpu-4bit``: slow) -- it measures:

- team: ``MAGRPOTrainer`` (MAGRPO) with 1, 2 and 4 agents on ONE shared base, one LoRA adapter per agent:
  seconds per step, generated tokens per second (the trainer's ``rollout_tokens_per_s``: tokens over generation
  time; and tokens over the whole step) and peak memory (``torch.cuda.max_memory_allocated`` on CUDA; the peak RSS,
  ``VmHWM`` reset through ``/proc/self/clear_refs``, on CPU), with the ratio of 4 agents to 1;
- speed: one agent's step against TRL's ``GRPOTrainer`` on the same model, LoRA, prompts, reward, batch and forced
  completion length, alternating one step each (``benchmarks/bench.py: run_speed``), and each side's generated
  tokens per second of ``generate``.

Writes ``gpu_check.json`` (after every stage, so a run cut short keeps what it measured) and ``gpu_check.md`` in
``--out``. The stages run in order of importance (the bf16 base first); one that would end past ``--budget-s``
seconds (estimated from the bf16 base's stages) is skipped with the reason recorded: the GPU machines allow 8 minutes
for the whole check. Without CUDA it stops with one error
line unless ``--device cpu`` is given. benchmarks/GPU_CHECK.md says how to run it on a machine without network.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib
import json
import os
import platform
import shlex
import string
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import bench  # noqa: E402  (sets HF_HUB_OFFLINE, TRL_EXPERIMENTAL_SILENCE, TOKENIZERS_PARALLELISM)

log = bench.log

#: the model on CUDA: a Llama of about 0.5B parameters (491M: 28 x 15.2M in the layers, 2 x 32.8M in the
#: untied embedding and head)
GPU_MODEL = dict(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)
TINY_MODEL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512)
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")
#: modules the check imports, and the distribution that brings each (GPU_CHECK.md: the wheels to carry)
NEEDED = {"torch": "torch", "transformers": "transformers", "trl": "trl", "peft": "peft", "accelerate": "accelerate",
          "datasets": "datasets", "tokenizers": "tokenizers", "trl_multiagent": "this repository (run from its root)"}
#: the agent counts of the team stage; the memory ratio is the last over the first
TEAM_SIZES = (2, 1, 4)


class CheckError(Exception):
    """A condition the check cannot run under; main() prints it as one line and exits 2."""


# ------------------------------------------------------------------------------------------------------ setting up
def require_modules() -> None:
    missing = []
    for module, dist in NEEDED.items():
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any import failure is reported the same way
            missing.append(f"{module} ({dist}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    if missing:
        raise CheckError("cannot import " + "; ".join(missing) + ". benchmarks/GPU_CHECK.md lists the wheels to "
                         "install (pip install --no-index --no-deps wheels/*.whl)")


def pick_device(requested: str) -> str:
    try:
        import torch
    except ImportError as exc:
        raise CheckError(f"torch does not import ({exc}); this check needs a CUDA build of torch") from None
    if requested == "cuda" and not torch.cuda.is_available():
        raise CheckError(f"CUDA is not available here (torch {torch.__version__}, built for CUDA "
                         f"{torch.version.cuda}): run on a machine with a GPU, or pass --device cpu (with --tiny for "
                         "the small CPU run)")
    return requested


def vocabulary(size: int) -> list[str]:
    """Tokens after the three specials of ``trl_multiagent.testing.char_tokenizer``: printable characters (the prompts' text), then filler
    tokens up to ``size`` entries (the encoder splits text into characters, so fillers are only generated)."""
    chars = list(dict.fromkeys(string.ascii_letters + string.digits + string.punctuation + " \n"))
    return chars + [f"<t{i}>" for i in range(size - 3 - len(chars))]


def build_checkpoint(directory: Path, sizes: dict, dtype, device: str) -> dict:
    """A random Llama of ``sizes`` and its tokenizer, saved to ``directory``; returns its description."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trl_multiagent.testing import char_tokenizer

    tok = char_tokenizer(vocabulary(sizes["vocab_size"]))
    tok.chat_template = CHAT_TEMPLATE
    assert len(tok) == sizes["vocab_size"], (len(tok), sizes["vocab_size"])
    config = LlamaConfig(**sizes, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(device):  # random init on the GPU: seconds instead of a minute of CPU
        model = LlamaForCausalLM(config).to(dtype)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    del model
    free_memory(device)
    return {"architecture": "LlamaForCausalLM", "config": sizes, "parameters": params, "dtype": str(dtype),
            "build_s": time.perf_counter() - t0,
            "checkpoint_mib": sum(f.stat().st_size for f in directory.iterdir()) / 2**20}


def four_bit_support(device: str) -> str | None:
    """None when bitsandbytes quantizes a tensor to NF4 on ``device``; else why not."""
    import torch

    try:
        import bitsandbytes  # noqa: F401
        from bitsandbytes.functional import quantize_4bit
    except Exception as exc:  # noqa: BLE001 - a CPU-only build or a missing library both mean no 4-bit here
        return f"bitsandbytes does not import: {type(exc).__name__}: {exc}"
    try:
        quantize_4bit(torch.randn(64, 64, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32),
                      quant_type="nf4")
    except Exception as exc:  # noqa: BLE001
        return f"bitsandbytes cannot quantize on {device}: {type(exc).__name__}: {exc}"
    return None


# ------------------------------------------------------------------------------------------------------ memory
def free_memory(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class PeakMemory:
    """Peak memory of a stretch of work: ``torch.cuda.max_memory_allocated`` on CUDA; on CPU the process's peak RSS
    (``VmHWM``), reset by writing 5 to ``/proc/self/clear_refs``."""

    def __init__(self, device: str):
        self.device = device
        self.measure = "torch.cuda.max_memory_allocated" if device == "cuda" else "VmHWM (peak RSS)"

    def start(self) -> float:
        import torch

        free_memory(self.device)
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            return torch.cuda.memory_allocated() / 2**20
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError as exc:  # the peak then includes what came before; say so
            log.warning("cannot reset the peak RSS (%s): the CPU peaks are those of the process so far", exc)
        return bench.rss_mib()

    def peak(self) -> float:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**20
        return bench.hwm_mib()


# ------------------------------------------------------------------------------------------------------ stages
def team_run(n_agents: int, model_path: str, quantization: str | None, s: dict, workdir: Path) -> dict:
    """``n_agents`` agents on one shared base (one LoRA adapter each), ``s["team_steps"]`` MAGRPO steps."""
    from transformers import PrinterCallback, ProgressCallback

    from trl_multiagent.environments import FunctionEnvironment
    from trl_multiagent.runtime.provenance import pool_paths
    from trl_multiagent.team.pool import AgentSpec
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    names = [f"agent{i + 1}" for i in range(n_agents)]
    specs = [AgentSpec(a, model=model_path, quantization=quantization, lora_r=s["lora_r"], lora_alpha=s["lora_alpha"],
                       lora_dropout=0.0) for a in names]
    env = lambda: FunctionEnvironment(names, {a: (lambda task: task["prompt"]) for a in names},  # noqa: E731
                                      bench.bench_reward)
    K, L = s["num_generations"], s["max_completion_length"]
    args = MAGRPOConfig(
        output_dir=str(workdir / f"team{n_agents}-{quantization or 'full'}"), num_generations=K,
        max_completion_length=L, per_device_train_batch_size=K, generation_kwargs={"min_new_tokens": L},
        episodes_per_step=1, max_steps=s["team_steps"], beta=0.0, learning_rate=1e-5, gradient_checkpointing=False,
        bf16=s["dtype"] == "bfloat16", model_dtype=s["dtype"], use_cpu=s["use_cpu"], report_to=[],
        disable_tqdm=True, seed=0, logging_steps=1, save_strategy="no")
    memory = PeakMemory(s["device"])
    before = memory.start()
    t0 = time.perf_counter()
    trainer = MAGRPOTrainer(specs, env, args, bench.chat_dataset(s["dataset_rows"]))
    build_s = time.perf_counter() - t0
    after_build = memory.peak()
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    timer = bench._step_timer_callback()
    trainer.add_callback(timer)
    trainer.train()
    peak = memory.peak()
    logs = [h for h in trainer.state.log_history if "rollout_tokens_per_s" in h]
    n_bases = len(trainer.pool.bases)
    paths = pool_paths(trainer.pool)  # which numerical path each base took (de-quantised copy, packed, lean step)
    trainable = sum(p.numel() for pol in trainer.pool.policies for p in trainer.pool.policy_parameters(pol))
    del trainer
    free_memory(s["device"])
    warm = s["warmup_steps"]
    tokens_per_step = n_agents * K * L  # every completion is forced to L tokens (min_new_tokens = L)
    step_s = bench.median(timer.times[warm:])
    return {
        "agents": n_agents, "bases": n_bases, "paths": paths, "trainable_params": trainable, "steps": len(timer.times),
        "build_s": build_s, "step_s": timer.times, "median_step_s": step_s,
        "generated_tokens_per_step": tokens_per_step,
        "generate_tokens_per_s": bench.median([h["rollout_tokens_per_s"] for h in logs][warm:]),
        "step_tokens_per_s": tokens_per_step / step_s,
        "memory_before_mib": before, "memory_after_build_mib": after_build, "peak_memory_mib": peak,
        "rewards": [h.get("reward") for h in logs],
    }


def speed_run(model_path: str, quantization: str | None, s: dict) -> dict:
    """One agent against TRL's GRPOTrainer: ``bench.run_speed`` with this device's settings, summarised."""
    settings = {"model": model_path, "quantization": quantization, "dtype": s["dtype"], "use_cpu": s["use_cpu"],
                "threads": s["threads"], "warmup_steps": s["warmup_steps"], "steps": s["speed_steps"],
                "block_steps": 1, "num_generations": s["num_generations"],
                "max_completion_length": s["max_completion_length"], "lora_r": s["lora_r"],
                "lora_alpha": s["lora_alpha"], "dataset_rows": s["dataset_rows"], "profile": False}
    raw = bench.run_speed(settings)
    free_memory(s["device"])
    out = {"trainable_params": raw["trainable_params"], "ratio_ours_over_trl": raw["ratio_ours_over_trl"],
           "median_paired_block_ratio": raw["median_paired_block_ratio"],
           "same_generate_shapes": raw["identical_generate_output_shapes"]}
    for side in ("trl", "ours"):
        r = raw[side]
        rows, new = (r["generate_shapes"][0]["output"][0],
                     r["generate_shapes"][0]["output"][1] - r["generate_shapes"][0]["input"][1])
        out[side] = {"step_s": r["step_s"], "median_step_s": r["median_step_s"],
                     "median_generate_s": r["median_generate_s"], "median_update_s": r["median_update_s"],
                     "generated_rows": rows, "generated_tokens_per_row": new,
                     "generate_tokens_per_s": rows * new / r["median_generate_s"]}
    out["ratio_generate_tokens_per_s_ours_over_trl"] = \
        out["ours"]["generate_tokens_per_s"] / out["trl"]["generate_tokens_per_s"]
    return out


def run_stage(report: dict, key: tuple[str, str], fn, started: float, budget_s: float, out: Path,
              estimate_s: float = 0.0) -> None:
    """Run one stage into ``report["bases"][base][stage]``: its result, or why it was skipped or failed. It is
    skipped when ``estimate_s`` more seconds would take the run past ``budget_s``."""
    base, stage = key
    slot = report["bases"][base]
    elapsed = time.perf_counter() - started
    if elapsed + estimate_s > budget_s:
        slot[stage] = {"skipped": f"time budget: {elapsed:.0f} s used of {budget_s:.0f} s, and the stage would take "
                                  f"about {estimate_s:.0f} s"}
        log.warning("%s/%s skipped: %s", base, stage, slot[stage]["skipped"])
        return
    log.info("%s/%s ...", base, stage)
    t0 = time.perf_counter()
    try:
        slot[stage] = fn()
    except Exception as exc:  # noqa: BLE001 - one failed stage is recorded; the others still run
        slot[stage] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
        log.error("%s/%s failed: %s", base, stage, slot[stage]["error"])
    slot[stage]["wall_s"] = time.perf_counter() - t0
    report["runtime_s"] = time.perf_counter() - started
    write_outputs(report, out)


def summarise(report: dict) -> None:
    """Headline numbers of each base: the ratios the issue asks for."""
    for slot in report["bases"].values():
        team, speed = slot.get("team", {}), slot.get("speed", {})
        runs = {r["agents"]: r for r in team.get("runs", [])}
        first, last = min(TEAM_SIZES), max(TEAM_SIZES)
        slot["summary"] = {
            "step_vs_trl": speed.get("ratio_ours_over_trl"),
            "memory_4_agents_vs_1": (runs[last]["peak_memory_mib"] / runs[first]["peak_memory_mib"]
                                     if first in runs and last in runs else None),
            "team2_median_step_s": runs[2]["median_step_s"] if 2 in runs else None,
            "team2_generate_tokens_per_s": runs[2]["generate_tokens_per_s"] if 2 in runs else None,
        }


def team_stage(model_path: str, quantization: str | None, s: dict, workdir: Path) -> dict:
    runs = []
    for n in TEAM_SIZES:
        runs.append(team_run(n, model_path, quantization, s, workdir))
        log.info("  %d agent(s): %.3f s/step, %.0f generated tokens/s, peak %.0f MiB", n, runs[-1]["median_step_s"],
                 runs[-1]["generate_tokens_per_s"], runs[-1]["peak_memory_mib"])
    return {"runs": runs, "memory_measure": PeakMemory(s["device"]).measure}


# ------------------------------------------------------------------------------------------------------ output
def _f(x, fmt=".3f") -> str:
    return "-" if x is None else format(x, fmt)


def write_outputs(report: dict, out: Path) -> None:
    summarise(report)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    d, m, s = report["device"], report["model"], report["settings"]
    lines = [
        "# GPU check" + (" (tiny model, CPU: a test run, not a measurement)" if s["tiny"] else ""),
        "",
        f"Command: `{report['command']}` ({report['date']}, {report.get('runtime_s', 0):.0f} s). Device: "
        f"{d['name']}; torch {report['versions']['torch']}, trl {report['versions']['trl']}, transformers "
        f"{report['versions']['transformers']}, peft {report['versions']['peft']}, bitsandbytes "
        f"{report['versions']['bitsandbytes']}. Raw numbers: `gpu_check.json`.",
        "",
        f"Model: random Llama, {m['parameters'] / 1e6:.1f}M parameters ({m['config']['num_hidden_layers']} layers, "
        f"width {m['config']['hidden_size']}, vocabulary {m['config']['vocab_size']}), {s['dtype']}; LoRA r="
        f"{s['lora_r']} on every linear layer; K={s['num_generations']} samples of {s['max_completion_length']} "
        f"forced tokens per prompt, one prompt per step; medians over the steps after the first "
        f"{s['warmup_steps']}.",
        "",
        "| base | one agent's step vs TRL GRPOTrainer | 2-agent team: s/step | 2-agent team: generated tokens/s | "
        "peak memory, 4 agents vs 1 |",
        "|---|---|---|---|---|",
    ]
    for base, slot in report["bases"].items():
        if "skipped" in slot:
            lines.append(f"| {base} | skipped: {slot['skipped']} | | | |")
            continue
        sm = slot.get("summary", {})
        lines.append(f"| {base} ({slot['dtype']}) | {_f(sm.get('step_vs_trl'))} | "
                     f"{_f(sm.get('team2_median_step_s'))} | {_f(sm.get('team2_generate_tokens_per_s'), '.0f')} | "
                     f"{_f(sm.get('memory_4_agents_vs_1'))} |")
    for base, slot in report["bases"].items():
        if "skipped" in slot:
            continue
        lines += ["", f"## {base} base", ""]
        team, speed = slot.get("team", {}), slot.get("speed", {})
        if "runs" in team:
            lines += [f"Team (MAGRPO, one shared base, one adapter per agent); memory: {team['memory_measure']}.", "",
                      "| agents | bases | median s/step | generated tokens/s (generation) | tokens/s (whole step) | "
                      "peak memory MiB | before MiB |", "|---|---|---|---|---|---|---|"]
            for r in sorted(team["runs"], key=lambda r: r["agents"]):
                lines.append(f"| {r['agents']} | {r['bases']} | {r['median_step_s']:.3f} | "
                             f"{r['generate_tokens_per_s']:.0f} | {r['step_tokens_per_s']:.0f} | "
                             f"{r['peak_memory_mib']:.0f} | {r['memory_before_mib']:.0f} |")
        elif team:
            lines.append(f"Team: {team.get('skipped') or team.get('error')}")
        lines.append("")
        if "ours" in speed:
            lines += ["| one agent | median s/step | median generate s | generated tokens/s |", "|---|---|---|---|"]
            for side, label in (("trl", "TRL GRPOTrainer"), ("ours", "MAGRPOTrainer")):
                r = speed[side]
                lines.append(f"| {label} | {r['median_step_s']:.3f} | {r['median_generate_s']:.3f} | "
                             f"{r['generate_tokens_per_s']:.0f} |")
            lines.append(f"\nRatio ours / TRL: {speed['ratio_ours_over_trl']:.3f} (paired per step "
                         f"{speed['median_paired_block_ratio']:.3f}).")
        elif speed:
            lines.append(f"Speed: {speed.get('skipped') or speed.get('error')}")
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for gpu_check.json and gpu_check.md")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and few steps (the test's CPU run)")
    parser.add_argument("--num-generations", type=int, default=None, help="K (default 8; 2 with --tiny)")
    parser.add_argument("--completion-length", type=int, default=None, help="forced tokens (default 64; 4 tiny)")
    parser.add_argument("--team-steps", type=int, default=None, help="steps per team run (default 3; 2 tiny)")
    parser.add_argument("--speed-steps", type=int, default=None, help="steps per trainer vs TRL (default 5; 2 tiny)")
    parser.add_argument("--skip-4bit", action="store_true", help="only the bf16 (float32 on CPU) base")
    parser.add_argument("--cpu-4bit", action="store_true",
                        help="on CPU, also the 4-bit base (off by default: bitsandbytes' CPU kernels take minutes)")
    parser.add_argument("--budget-s", type=float, default=450,
                        help="no stage starts that would end past this many seconds, as far as the stages before it "
                             "tell (default 450: the whole check must end within 8 minutes on the GPU machines)")
    parser.add_argument("--verbose", action="store_true", help="keep the libraries' own logs")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    try:
        device = pick_device(args.device)
        require_modules()
    except CheckError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    import torch

    bench.setup_logging(args.verbose)
    tiny = args.tiny
    if tiny:
        torch.set_num_threads(1)
    dtype = "bfloat16" if device == "cuda" else "float32"
    s = {"device": device, "tiny": tiny, "dtype": dtype, "use_cpu": device == "cpu",
         "threads": 1 if tiny else len(os.sched_getaffinity(0)),  # a tiny model gains nothing from threads
         "num_generations": args.num_generations or (2 if tiny else 8),
         "max_completion_length": args.completion_length or (4 if tiny else 64),
         "team_steps": args.team_steps or (2 if tiny else 3), "speed_steps": args.speed_steps or (2 if tiny else 5),
         "warmup_steps": 1, "lora_r": 8, "lora_alpha": 16, "dataset_rows": 64, "team_sizes": list(TEAM_SIZES),
         "budget_s": args.budget_s}
    if min(s["team_steps"], s["speed_steps"]) <= s["warmup_steps"]:
        print("gpu_check: error: --team-steps and --speed-steps must exceed the 1 warm-up step", file=sys.stderr)
        return 2
    argv_used = argv if argv is not None else sys.argv[1:]
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU: {bench.cpu_model()}"
    report = {
        "command": "python benchmarks/gpu_check.py " + shlex.join(argv_used),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": {"kind": device, "name": name, "platform": platform.platform(), "cpu_count": os.cpu_count(),
                   "memory_gib": (torch.cuda.get_device_properties(0).total_memory / 2**30 if device == "cuda"
                                  else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)},
        "versions": bench.versions(), "settings": s, "bases": {},
    }
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        tmp = Path(tmp)
        model_path = tmp / "model"
        report["model"] = build_checkpoint(model_path, TINY_MODEL if tiny else GPU_MODEL, getattr(torch, dtype),
                                           device)
        log.info("model: %.1fM parameters, built in %.1f s", report["model"]["parameters"] / 1e6,
                 report["model"]["build_s"])
        no_4bit = ("--skip-4bit" if args.skip_4bit else
                   "on CPU only with --cpu-4bit (bitsandbytes' CPU kernels are slow)" if device == "cpu"
                   and not args.cpu_4bit else four_bit_support(device))
        report["bases"]["full"] = {"dtype": dtype, "quantization": None}
        report["bases"]["4bit"] = ({"skipped": no_4bit} if no_4bit else
                                   {"dtype": f"nf4 (compute {dtype})", "quantization": "4bit"})
        write_outputs(report, out)
        for base in ("full", "4bit"):
            if "skipped" in report["bases"][base]:
                continue
            q = report["bases"][base]["quantization"]
            stages = {"team": lambda q=q: team_stage(str(model_path), q, s, tmp),
                      "speed": lambda q=q: speed_run(str(model_path), q, s)}
            for stage, fn in stages.items():
                # the 4-bit base's stage: as long as the full base's took, twice (dequantizing in every matmul)
                estimate = (2 * report["bases"]["full"].get(stage, {}).get("wall_s", 0.0) if base == "4bit"
                            else 0.0)
                run_stage(report, (base, stage), fn, started, args.budget_s, out, estimate)
    report["runtime_s"] = time.perf_counter() - started
    write_outputs(report, out)
    failed = [f"{b}/{k}" for b, slot in report["bases"].items() for k, v in slot.items()
              if isinstance(v, dict) and "error" in v]
    log.info("wrote %s and %s (%.0f s)%s", out / "gpu_check.json", out / "gpu_check.md", report["runtime_s"],
             f"; FAILED: {', '.join(failed)}" if failed else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
