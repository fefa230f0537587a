"""Benchmarks of trl-multiagent against TRL, on the embedded SmolLM2-135M-Instruct, CPU.

    python benchmarks/bench.py            # full run (~15 min on a 2-core CPU), writes experiments/speed/bench/bench.{json,md}
    python benchmarks/bench.py --quick    # smoke version (fewer steps, fewer memory configurations)

(a) Speed: one agent, one turn. Seconds per optimizer step of ``MAGRPOTrainer`` against TRL's own
    ``GRPOTrainer`` on the same model (LoRA r=8 on a float32 base), same prompts, same reward, same K, same forced
    completion length, same batch, measured side by side in one process in alternating blocks
    (TRL, ours, TRL, ours, ...).
(b) Memory: peak resident memory of a fresh subprocess per configuration (``VmHWM``, checked against ``ru_maxrss``)
    for 1, 2 and 4 agents on ONE shared 4-bit base against the same agents each with its own base copy; then
    ``--memory-rounds`` - 1 more rounds of the target's pair (1 agent and 4 agents on one base, alternately in order),
    the target being the median of the rounds' ratios.
(c) Targets (issues 16 and 40; the values in ``benchmarks/targets.py:TARGETS``), written to ``bench.json`` under
    ``"targets"`` as ``{name: {value, target, met}}``: the two ratios above (``step_vs_trl``,
    ``memory_4_agents_vs_1``) and the main job's measurements of ``benchmarks/targets.py`` (rollout against plain
    generate and the compute limit, 4 agents against 1 per token, the main job's step time and its loss passes
    against the matmul rate, a decoding step against its bound at 1, 16 and 64 rows, the evaluation's speed-up).

Options: ``--threads N`` (torch threads, default: every core), ``--steps``, ``--block-steps``, ``--memory-steps``,
``--memory-rounds``, ``--skip-speed``, ``--skip-memory``, ``--skip-targets``, ``--profile`` (cProfile of a few steps
of each trainer, stored in the JSON), ``--strict`` (exit 1 when a target is missed), ``--out-dir``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from measure import keep_cpu_record  # noqa: E402 - benchmarks/ is the script's own folder
from targets import TARGETS  # noqa: E402

from trl_multiagent.runtime.provenance import cpu_generation, cpu_model, kernel_record, versions  # noqa: E402 - after the environment above

log = logging.getLogger("bench")

SPEED_TARGET = TARGETS["step_vs_trl"][0]
MEMORY_TARGET = 1.05  # issue 16: memory_4_agents_vs_1
MEMORY_RESULT_TAG = "BENCH_MEMORY_RESULT "

PROMPTS = [
    "Name three colours of the rainbow.",
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "Give a synonym of 'happy'.",
    "How many legs does a spider have?",
    "Describe a cat in five words.",
    "What is two plus three?",
    "Name a fruit that is yellow.",
    "Say hello in Spanish.",
    "What do bees make?",
    "Name a planet of the solar system.",
    "Give an example of a prime number.",
    "What is the opposite of 'cold'?",
    "Write a short greeting.",
    "Which animal says 'moo'?",
    "Name a musical instrument.",
]


# ------------------------------------------------------------------------------------------------------ helpers
def setup_logging(verbose: bool = False) -> None:
    try:
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, log_time_format="%H:%M:%S")
        fmt = "%(message)s"
    except ImportError:  # pragma: no cover - rich is a dependency of the library
        handler, fmt = logging.StreamHandler(), "%(asctime)s %(levelname)s %(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt, handlers=[handler], force=True)
    # The libraries are chatty (one warning per trainer about missing columns, etc.); keep the benchmark's own log.
    for name in ("transformers", "trl", "peft", "accelerate", "datasets", "trl_multiagent", "bitsandbytes"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass


def rss_mib() -> float:
    """Current resident set size of this process, MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_breakdown_mib() -> dict[str, float]:
    """Current RSS split into anonymous memory and file-backed pages (e.g. an mmap-ed checkpoint), MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0]) / 1024
    return out


def maxrss_mib() -> float:
    """``ru_maxrss`` of this process (KiB on Linux), MiB.

    Caveat: Linux carries ``ru_maxrss`` across ``execve``, and ``subprocess`` spawns with vfork, so a child starts
    with its parent's peak. Children are therefore spawned from the small parent (memory runs go first) and the
    peak is also read from ``VmHWM`` (:func:`hwm_mib`), the high-water mark of the child's own address space.
    """
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def hwm_mib() -> float:
    """Peak RSS of this process image (``VmHWM``: not inherited from the parent), MiB."""
    return rss_breakdown_mib()["VmHWM"]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def score_text(text: str) -> float:
    """A cheap deterministic reward with spread across samples (so advantages are not all zero)."""
    return float(sum(map(ord, text)) % 7) / 6.0


def bench_reward(completions=None, **kwargs):
    """The same reward on both sides: TRL passes a list (of strings or of chat messages), ours a {agent: text} dict."""
    if isinstance(completions, dict):
        return sum(score_text(t) for t in completions.values()) / len(completions)
    out = []
    for c in completions:
        if isinstance(c, list):  # conversational: [{"role": "assistant", "content": ...}]
            c = c[-1]["content"]
        out.append(score_text(c))
    return out


def chat_dataset(n_rows: int):
    """The prompts as one-message conversations: TRL and our pool both apply the same chat template to them."""
    from datasets import Dataset

    rows = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(n_rows)]
    return Dataset.from_dict({"prompt": rows})


class _GenerateTimer:
    """Wraps a model's ``generate`` (instance attribute) to time it and record the shapes it sees."""

    def __init__(self, model):
        self.calls: list[dict] = []
        self._orig = model.generate
        model.generate = self

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        out = self._orig(*args, **kwargs)
        elapsed = time.perf_counter() - start
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls.append({"seconds": elapsed, "input_shape": list(ids.shape) if ids is not None else None,
                           "output_shape": list(out.shape) if hasattr(out, "shape") else None})
        return out


class _GenerateManyTimer:
    """Wraps a pool's team-level ``generate_many`` (our trainers' only generation call) like :class:`_GenerateTimer`;
    the shapes are those ``generate`` would return: rows x (longest prompt + longest completion)."""

    def __init__(self, pool):
        self.calls: list[dict] = []
        self._orig = pool.generate_many
        pool.generate_many = self

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        out = self._orig(*args, **kwargs)
        elapsed = time.perf_counter() - start
        gens = [g for group in out for g in group]
        prompt = max(len(g.prompt_ids) for g in gens)
        self.calls.append({"seconds": elapsed, "input_shape": [len(gens), prompt],
                           "output_shape": [len(gens), prompt + max(len(g.completion_ids) for g in gens)]})
        return out


def _step_timer_callback():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time of every optimizer step: on_step_begin -> on_step_end (rollout + update + optimizer step)."""

        def __init__(self):
            self.times: list[float] = []
            self.cpu_times: list[float] = []  # process CPU time (all threads) of the step
            self.loadavg: list[float] = []  # 1-minute load average at the step's end (other processes' activity)
            self._start = self._cpu_start = None
            self.gen_timer: _GenerateTimer | _GenerateManyTimer | None = None

        def on_step_begin(self, args, state, control, **kwargs):
            self._start, self._cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._start)
            self.cpu_times.append(time.process_time() - self._cpu_start)
            self.loadavg.append(os.getloadavg()[0])

    return StepTimer()


# ------------------------------------------------------------------------------------------------------ (a) speed
def build_speed_trainers(model_path: str, settings: dict, workdir: Path):
    import torch
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from trl_multiagent.environments import FunctionEnvironment
    from trl_multiagent.models.loading import load_base_model, load_tokenizer
    from trl_multiagent.team.pool import AgentSpec
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    K, L = settings["num_generations"], settings["max_completion_length"]
    # the CPU float32 setting unless the settings say otherwise (benchmarks/gpu_check.py: CUDA, bfloat16, 4-bit)
    dtype, quantization = settings.get("dtype", "float32"), settings.get("quantization")
    common = dict(
        num_generations=K, max_completion_length=L, per_device_train_batch_size=K, gradient_accumulation_steps=1,
        generation_kwargs={"min_new_tokens": L}, learning_rate=1e-5, beta=0.0, temperature=1.0,
        gradient_checkpointing=False, bf16=dtype == "bfloat16", fp16=False, report_to=[], disable_tqdm=True, seed=0,
        logging_steps=1, save_strategy="no", use_cpu=settings.get("use_cpu", True), dataloader_num_workers=0,
    )
    data = chat_dataset(settings["dataset_rows"])
    r, alpha = settings["lora_r"], settings["lora_alpha"]

    log.info("Building TRL GRPOTrainer (%s base + LoRA r=%d)", quantization or dtype, r)
    t0 = time.perf_counter()
    trl_model = load_base_model(model_path, dtype=dtype, quantization=quantization)
    # TRL's side as a TRL user gets it: transformers' own attention (the library's loader switches a CPU model to its
    # grouped_sdpa, which the teacher-forced pass gains from: trl_multiagent/models/grouped_attention.py)
    trl_model.set_attn_implementation(settings.get("trl_attention", "sdpa"))
    trl_trainer = GRPOTrainer(
        model=trl_model, reward_funcs=bench_reward,
        args=GRPOConfig(output_dir=str(workdir / "trl"), **common), train_dataset=data,
        processing_class=load_tokenizer(model_path),
        peft_config=LoraConfig(task_type="CAUSAL_LM", r=r, lora_alpha=alpha, lora_dropout=0.0,
                               target_modules="all-linear", bias="none"),
    )
    trl_build = time.perf_counter() - t0

    log.info("Building MAGRPOTrainer (one agent, one turn, same base and LoRA)")
    t0 = time.perf_counter()
    env = lambda: FunctionEnvironment(["solo"], {"solo": lambda task: task["prompt"]}, bench_reward)  # noqa: E731
    ours = MAGRPOTrainer(
        [AgentSpec("solo", model=model_path, quantization=quantization, lora_r=r, lora_alpha=alpha,
                   lora_dropout=0.0)], env,
        MAGRPOConfig(output_dir=str(workdir / "ours"), episodes_per_step=1, model_dtype=dtype, **common),
        data,
    )
    ours_build = time.perf_counter() - t0

    n_trl = sum(p.numel() for p in trl_trainer.model.parameters() if p.requires_grad)
    n_ours = sum(p.numel() for p in ours.pool.policy_parameters("solo"))
    if n_trl != n_ours:
        raise RuntimeError(f"trainable parameter counts differ: TRL {n_trl} vs ours {n_ours}")
    info = {"trl_build_s": trl_build, "ours_build_s": ours_build, "trainable_params": n_trl,
            "torch_threads": torch.get_num_threads()}
    return trl_trainer, ours, info


def run_speed(settings: dict) -> dict:
    import torch
    from transformers import PrinterCallback, ProgressCallback

    from trl_multiagent.models.loading import resolve_model

    torch.set_num_threads(settings["threads"])
    model_path = resolve_model(settings["model"])
    warm = settings["warmup_steps"]
    with tempfile.TemporaryDirectory(prefix="bench-speed-") as tmp:
        trl_trainer, ours, info = build_speed_trainers(model_path, settings, Path(tmp))
        trainers = {"trl": trl_trainer, "ours": ours}
        timers = {name: _step_timer_callback() for name in trainers}
        timers["trl"].gen_timer = _GenerateTimer(trl_trainer.model)
        timers["ours"].gen_timer = _GenerateManyTimer(ours.pool)
        for name, t in trainers.items():
            t.remove_callback(PrinterCallback)  # the per-step metric dicts would drown the benchmark's own log
            t.remove_callback(ProgressCallback)
            t.add_callback(timers[name])

        # rollout / update split, the same definition on both sides: ours = rollout(), TRL =
        # _generate_and_score_completions() (generation, rewards, advantages); the rest of the step is the update.
        rollout_times: dict[str, list[float]] = {"trl": [], "ours": []}
        ours.rollout = _timed(ours.rollout, rollout_times["ours"])
        trl_trainer._generate_and_score_completions = _timed(trl_trainer._generate_and_score_completions,
                                                             rollout_times["trl"])

        blocks = []
        ours_history: list[dict] = []  # Trainer.train() starts a fresh state (and log history) on every call
        block, n_blocks = settings["block_steps"], settings["steps"] // settings["block_steps"]
        order = ["trl", "ours"]
        for b in range(n_blocks):
            for name in order:
                t = trainers[name]
                t.args.max_steps = block
                start_idx = len(timers[name].times)
                load_before = os.getloadavg()[0]
                wall = time.perf_counter()
                t.train()
                wall = time.perf_counter() - wall
                if name == "ours":
                    ours_history.extend(h for h in t.state.log_history if "rollout_time" in h)
                new = timers[name].times[start_idx:]
                blocks.append({"block": b, "trainer": name, "step_s": new,
                               "cpu_s": timers[name].cpu_times[start_idx:], "train_call_wall_s": wall,
                               "loadavg_before": load_before, "loadavg_after": os.getloadavg()[0]})
                log.info("block %d/%d %-4s: %s s/step (cpu %s s, load %.2f)", b + 1, n_blocks, name,
                         ", ".join(f"{x:.2f}" for x in new),
                         ", ".join(f"{x:.2f}" for x in timers[name].cpu_times[start_idx:]), os.getloadavg()[0])

        result = {"model_path": model_path, **info, "blocks": blocks}
        for name in order:
            tm = timers[name]
            steps, cpu = tm.times, tm.cpu_times
            gen = [c["seconds"] for c in tm.gen_timer.calls]
            roll = rollout_times[name]
            if not (len(gen) == len(roll) == len(steps)):
                log.warning("%s: %d steps but %d generate calls and %d rollouts", name, len(steps), len(gen), len(roll))
            kept = steps[warm:]
            result[name] = {
                "step_s": steps,
                "cpu_s": cpu,
                "loadavg_at_step_end": tm.loadavg,
                "generate_s": gen,
                "rollout_s": roll,
                "update_s": [s - r for s, r in zip(steps, roll)],
                "median_step_s": median(kept),
                "mean_step_s": statistics.fmean(kept) if kept else float("nan"),
                "min_step_s": min(kept) if kept else float("nan"),
                "max_step_s": max(kept) if kept else float("nan"),
                "median_cpu_s": median(cpu[warm:]),
                "median_generate_s": median(gen[warm:]),
                "median_rollout_s": median(roll[warm:]),
                "median_update_s": median([s - r for s, r in zip(steps, roll)][warm:]),
                "median_non_generate_s": median([s - g for s, g in zip(steps, gen)][warm:]),
                "generate_shapes": [{"input": c["input_shape"], "output": c["output_shape"]} for c in tm.gen_timer.calls],
            }
        result["ours"]["rollout_time_metric"] = [h["rollout_time"] for h in ours_history]
        result["ours"]["step_time_metric"] = [h.get("step_time") for h in ours_history]

        def ratio(key):
            return result["ours"][key] / result["trl"][key]

        result["ratio_ours_over_trl"] = ratio("median_step_s")
        result["ratio_min_ours_over_trl"] = ratio("min_step_s")
        result["ratio_cpu_ours_over_trl"] = ratio("median_cpu_s")
        result["ratio_generate_ours_over_trl"] = ratio("median_generate_s")
        result["ratio_rollout_ours_over_trl"] = ratio("median_rollout_s")
        result["ratio_update_ours_over_trl"] = ratio("median_update_s")
        # paired ratios: each of our blocks against the TRL block right before it (drift between blocks cancels)
        paired = []
        for b in range(n_blocks):
            tb, ob = ([x for x in blocks if x["block"] == b and x["trainer"] == n][0]["step_s"] for n in order)
            skip = warm if b == 0 else 0
            if tb[skip:] and ob[skip:]:
                paired.append(median(ob[skip:]) / median(tb[skip:]))
        result["paired_block_ratios"] = paired
        result["median_paired_block_ratio"] = median(paired)
        outs = {n: [c["output"] for c in result[n]["generate_shapes"]] for n in order}
        result["identical_generate_output_shapes"] = outs["trl"] == outs["ours"]
        if not result["identical_generate_output_shapes"]:
            log.warning("generate() returned different shapes on the two sides: TRL %s vs ours %s",
                        outs["trl"][:3], outs["ours"][:3])
        result["target"] = SPEED_TARGET
        result["pass"] = result["ratio_ours_over_trl"] <= SPEED_TARGET
        if settings.get("profile"):
            result["profile"] = profile_steps(trainers, settings)
        del trainers, trl_trainer, ours
    return result


def _timed(fn, sink: list):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - start)

    return wrapper


def profile_steps(trainers: dict, settings: dict) -> dict:
    """cProfile a few steps of each trainer; keep the top functions by cumulative and by own time."""
    import cProfile
    import io
    import pstats

    out = {}
    for name, t in trainers.items():
        t.args.max_steps = settings["profile_steps"]
        prof = cProfile.Profile()
        prof.enable()
        t.train()
        prof.disable()
        texts = {}
        for key in ("cumulative", "tottime"):
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(35)
            texts[key] = buf.getvalue()
        out[name] = texts
        log.info("profile of %s:\n%s", name, "\n".join(texts["tottime"].splitlines()[:45]))
    return out


# ------------------------------------------------------------------------------------------------------ (b) memory
def memory_child(cfg: dict) -> dict:
    """Run in a fresh process: build an n-agent trainer on shared or separate 4-bit bases, train a few steps."""
    base_rss_before_imports = rss_mib()
    t0 = time.perf_counter()
    import torch
    from datasets import Dataset

    from trl_multiagent.environments import FunctionEnvironment
    from trl_multiagent.team.pool import AgentSpec
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    setup_logging(verbose=False)
    torch.set_num_threads(cfg["threads"])
    import_s = time.perf_counter() - t0
    after_imports = {"rss_mib": rss_mib(), **rss_breakdown_mib()}

    n, paths = cfg["n_agents"], cfg["model_paths"]
    names = [f"agent{i}" for i in range(n)]
    specs = [AgentSpec(name, model=paths[i], quantization="4bit", lora_r=cfg["lora_r"], lora_alpha=cfg["lora_alpha"])
             for i, name in enumerate(names)]
    env = lambda: FunctionEnvironment(names, {a: (lambda task: task["prompt"]) for a in names}, bench_reward)  # noqa: E731
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS]})
    K, L = cfg["num_generations"], cfg["max_completion_length"]
    args = MAGRPOConfig(
        output_dir=cfg["output_dir"], num_generations=K, max_completion_length=L, per_device_train_batch_size=K,
        generation_kwargs={"min_new_tokens": L}, episodes_per_step=1, max_steps=cfg["steps"], beta=0.0,
        learning_rate=1e-5, gradient_checkpointing=False, bf16=False, report_to=[], disable_tqdm=True, seed=0,
        logging_steps=1, save_strategy="no", use_cpu=True, **cfg.get("config_overrides", {}),
    )
    t1 = time.perf_counter()
    trainer = MAGRPOTrainer(specs, env, args, data)
    build_s = time.perf_counter() - t1
    after_build = {"rss_mib": rss_mib(), **rss_breakdown_mib()}
    n_bases = len(trainer.pool.bases)
    base_bytes = sum(p.numel() * p.element_size() for b in trainer.pool.bases.values() for p in b.parameters())
    trainable = sum(p.numel() for pol in trainer.pool.policies for p in trainer.pool.policy_parameters(pol))

    timer = _step_timer_callback()
    trainer.add_callback(timer)
    t2 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t2
    return {
        "n_agents": n, "layout": cfg["layout"], "n_bases": n_bases, "steps": cfg["steps"],
        "torch_threads": torch.get_num_threads(),
        "rss_before_imports_mib": base_rss_before_imports,
        "after_imports": after_imports, "after_build": after_build,
        "final_rss_mib": rss_mib(), "final": rss_breakdown_mib(), "ru_maxrss_mib": maxrss_mib(),
        "peak_rss_mib": hwm_mib(),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "model_param_bytes_mib": base_bytes / 2**20, "trainable_params": trainable,
        "import_s": import_s, "build_s": build_s, "train_s": train_s, "step_s": timer.times,
    }


def make_model_copies(model_path: str, n: int, root: Path) -> list[str]:
    """n distinct checkpoint directories with the same files (symlinks), so the pool loads n separate bases."""
    paths = []
    for i in range(n):
        d = root / f"copy{i}"
        d.mkdir(parents=True, exist_ok=True)
        for f in Path(model_path).iterdir():
            link = d / f.name
            if not link.exists():
                link.symlink_to(f.resolve())
        paths.append(str(d))
    return paths


def run_memory(settings: dict) -> dict:
    from trl_multiagent.models.loading import resolve_model

    model_path = resolve_model(settings["model"])
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-mem-") as tmp:
        tmp = Path(tmp)
        copies = make_model_copies(model_path, max(settings["memory_agents"]), tmp / "models")
        configs = []
        common = settings.get("memory_config_overrides", {})
        run_variant = "kept freed memory" if common.get("cpu_keep_freed_memory") else "default"
        for n in settings["memory_agents"]:
            configs.append(("shared", n, [model_path] * n, common))
            if n > 1 or settings["memory_repeat_single"]:
                configs.append(("separate", n, copies[:n], common))
        # the target's pair (1 agent, n_max agents on one base) again in further rounds, alternately in order
        n_max = max(settings["memory_agents"])
        for r in range(2, settings["memory_rounds"] + 1):
            pair = [("shared", 1, [model_path], common), ("shared", n_max, [model_path] * n_max, common)]
            configs.extend([(*c, r) for c in (pair[::-1] if r % 2 == 0 else pair)])
        configs = [c if len(c) == 5 else (*c, 1) for c in configs]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # the trainer's setting decides
        for layout, n, paths, overrides, round_ in configs:
            cfg = {"n_agents": n, "layout": layout, "model_paths": paths, "steps": settings["memory_steps"],
                   "num_generations": settings["num_generations"],
                   "max_completion_length": settings["max_completion_length"],
                   "lora_r": settings["lora_r"], "lora_alpha": settings["lora_alpha"],
                   "threads": settings["threads"],
                   "output_dir": str(tmp / f"out-{layout}-{n}-{len(overrides)}-{round_}"),
                   "config_overrides": overrides}
            variant = run_variant
            log.info("memory: %d agent(s), %s base(s), allocator %s, round %d (fresh subprocess)", n, layout, variant,
                     round_)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--memory-child", json.dumps(cfg)],
                                  capture_output=True, text=True, env=env)
            wall = time.perf_counter() - t0
            line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith(MEMORY_RESULT_TAG)), None)
            if proc.returncode != 0 or line is None:
                log.error("memory child failed (rc=%s):\n%s", proc.returncode, proc.stderr[-4000:])
                results.append({"n_agents": n, "layout": layout, "allocator": variant, "error": proc.stderr[-4000:],
                                "wall_s": wall, "round": round_})
                continue
            res = json.loads(line[len(MEMORY_RESULT_TAG):])
            res["wall_s"], res["allocator"], res["round"] = wall, variant, round_
            if abs(res["ru_maxrss_mib"] - res["peak_rss_mib"]) > 0.02 * res["peak_rss_mib"]:
                log.warning("  ru_maxrss %.0f MiB differs from VmHWM %.0f MiB (ru_maxrss inherited from the parent?)",
                            res["ru_maxrss_mib"], res["peak_rss_mib"])
            results.append(res)
            log.info("  peak %.0f MiB (after imports %.0f, after build %.0f of which file-backed %.0f), %d base(s), "
                     "%.0f s", res["peak_rss_mib"], res["after_imports"]["rss_mib"], res["after_build"]["rss_mib"],
                     res["after_build"].get("RssFile", float("nan")), res["n_bases"], wall)

    def peak(layout, n, allocator=run_variant):
        hits = [r["peak_rss_mib"] for r in results if r.get("layout") == layout and r["n_agents"] == n
                and r.get("allocator") == allocator and "peak_rss_mib" in r and r.get("round", 1) == 1]
        if not hits and n == 1:  # one agent: shared and separate are the same configuration
            hits = [r["peak_rss_mib"] for r in results if r["n_agents"] == 1 and r.get("allocator") == allocator
                    and "peak_rss_mib" in r]
        return hits[0] if hits else float("nan")

    one = peak("shared", 1)
    summary = {}
    for n in settings["memory_agents"]:
        summary[n] = {"shared_peak_mib": peak("shared", n), "separate_peak_mib": peak("separate", n),
                      "shared_over_one_agent": peak("shared", n) / one,
                      "separate_over_one_agent": peak("separate", n) / one}
    each_round = paired_memory_ratios(results, n_max)
    ratio = statistics.median(each_round) if each_round else float("nan")
    out = {"runs": results, "summary": {str(k): v for k, v in summary.items()}, "n_max": n_max,
           "ratio_each_round": each_round, "ratio_shared_nmax_over_one": ratio, "target": MEMORY_TARGET,
           "pass": ratio <= MEMORY_TARGET}
    return out


def paired_memory_ratios(results: list[dict], n_max: int) -> list[float]:
    """``memory_4_agents_vs_1`` of each round of :func:`run_memory`: the peak RSS of ``n_max`` agents on one base over
    one agent's, both of that round (a round without both runs counts for nothing). The target takes their median:
    identical runs' peaks spread by tens of MiB, about the target's margin (``experiments/speed/memory_ab/README.md``)."""
    peaks: dict[int, dict[int, float]] = {}
    for r in results:
        if r.get("layout") == "shared" and "peak_rss_mib" in r and r["n_agents"] in (1, n_max):
            peaks.setdefault(r.get("round", 1), {})[r["n_agents"]] = r["peak_rss_mib"]
    return [p[n_max] / p[1] for _, p in sorted(peaks.items()) if 1 in p and n_max in p]


# ------------------------------------------------------------------------------------------------------ report
TARGET_MEANING = {
    "rollout_vs_plain_generate": "tokens/s of a team step's rollout (2 agents, QLoRA adapters, one 4-bit base) over "
                                 "plain HF generate of the base, same rows and length",
    "rollout_vs_roofline": "rollout tokens/s over the compute limit (matmul FLOP/s of the same run / 2 x parameters)",
    "step_vs_trl": "one agent's optimizer step over TRL GRPOTrainer's, same model, data, tokens, threads",
    "per_token_4_agents_vs_1": "seconds per generated token, 4 agents (4 adapters) on one base over 1 agent, same "
                               "rows; median of 3 paired, alternating calls",
    "memory_4_agents_vs_1": "peak RSS of a 4-agent team step on one shared 4-bit base over a 1-agent step; median of "
                            "3 paired rounds",
    "demo_step_s": "mean seconds of a training step of the main job's configuration (steps after the first)",
    "train_pass_vs_matmul": "the main job's loss forward + backward seconds over their FLOPs (frozen linears, LoRA "
                            "and attention's products; needed positions: each distinct prompt prefix once, every "
                            "completion) at the matmul rate of the same run",
    "decode_vs_bound_1": "one decoding step at 1 row over max(weight bytes / bandwidth, FLOPs / matmul rate)",
    "decode_vs_bound_16": "one decoding step at 16 rows over its bound (as above)",
    "decode_vs_bound_64": "one decoding step at 64 rows over its bound (as above)",
    "eval_speedup": "the main job's before-training evaluation (10 posts): the code before the speed work over "
                    "today's, each in matmul-seconds of its own run",
}


def _targets_markdown(report: dict) -> list[str]:
    m = report["target_measurements"]
    lines = ["## Targets (issue 16)", "", "| target | measured | goal | met | what |", "|---|---|---|---|---|"]
    for name, t in report["targets"].items():
        way = ">=" if name in ("rollout_vs_plain_generate", "rollout_vs_roofline", "eval_speedup") else "<="
        lines.append(f"| `{name}` | {t['value']:.3f} | {way} {t['target']} | {'yes' if t['met'] else 'no'} | "
                     f"{TARGET_MEANING[name]} |")
    g, a, d, e = (m.get(k) for k in ("generation", "agents", "demo_step", "evaluation"))
    lines += ["", "Measurements behind them (`benchmarks/targets.py`; raw numbers in `bench.json`):", ""]
    if g:
        lines.append(f"- generation: team rollout {g['team_rollout']['tokens_per_s']:.1f} tokens/s, plain generate "
                     f"{g['plain_generate']['tokens_per_s']:.1f} tokens/s, compute limit "
                     f"{g['roofline_tokens_per_s']:.1f} tokens/s (matmul {g['matmul_gflops']:.1f} GFLOP/s, "
                     f"{g['threads']} threads, {g['sequences']} rows).")
    if a:
        lines.append(f"- agents: {a['prompts']} prompts x {a['samples']} samples x {a['new_tokens']} tokens: 1 agent "
                     f"{a['1_agents']['seconds']:.1f} s, 4 agents {a['4_agents']['seconds']:.1f} s.")
    if d:
        parts = ", ".join(f"{k.split('/')[1]} {v:.1f} s" for k, v in d["mean_parts_after_first_s"].items())
        lines.append(f"- main job's step: {', '.join(f'{x:.1f}' for x in d['step_time_s'])} s ({parts}).")
        tp = d["train_pass"]
        shares = ", ".join(f"{k} {v:.1%}" for k, v in tp["flops_share_after_first"].items())
        lines.append(f"- `train_pass_vs_matmul`'s FLOPs (steps after the first): {shares}; against the frozen "
                     f"linears' FLOPs alone (the bound until stop 57) the ratio would be "
                     f"{tp['mean_after_first_frozen_linears_only']:.3f}.")
    k = m.get("decode")
    fast = d and d.get("train_pass_fastest_matmul")
    if fast and k:
        decode = " / ".join(f"{s['lean_over_fastest_matmul_bound']:.2f}" for s in k["steps"])
        rows = " / ".join(str(s["rows"]) for s in k["steps"])
        lines.append(f"- not targets: against the faster of MKL's sgemm ({d['train_pass']['matmul_gflops']:.0f} GFLOP/s) "
                     f"and oneDNN's packed matmul ({fast['matmul_gflops']:.0f} GFLOP/s, the kernel of the frozen "
                     f"matmuls) around the main job's run, `train_pass_vs_matmul` would be "
                     f"{fast['mean_after_first']:.3f}; the decoding step at {rows} rows over its bound with the faster "
                     f"kernel's rate {decode}.")
    if e:
        lines.append(f"- evaluation: {e['new']['seconds']:.0f} s today (matmul {e['new']['matmul_gflops']:.0f} "
                     f"GFLOP/s, {e['new']['generated_sequences']} sequences generated, {e['new']['prompt_tokens']} "
                     f"prompt tokens prefilled) against {e['reference']['seconds']:.0f} s before (matmul "
                     f"{e['reference']['matmul_gflops']:.0f} GFLOP/s, {e['reference']['generated_sequences']} "
                     f"sequences, {e['reference']['prompt_tokens']} prompt tokens); raw ratio {e['speedup_raw']:.2f}.")
    return lines + [""]


def write_markdown(report: dict, path: Path) -> None:
    s, sp, mem = report["settings"], report.get("speed"), report.get("memory")
    v = report["environment"]["versions"]
    lines = [
        "# Benchmarks",
        "",
        f"Command: `{report['command']}` ({'quick' if s['quick'] else 'full'} run, {report['date']}, "
        f"{report['runtime_s']:.0f} s in all).",
        "",
        f"Machine: {report['environment']['cpu_model']} "
        f"({report['environment'].get('cpu_generation') or 'generation not recorded'}), "
        f"{report['environment']['cpu_count']} CPUs "
        f"(affinity {report['environment']['cpu_affinity']}), torch {v['torch']}, trl {v['trl']}, "
        f"transformers {v['transformers']}, peft {v['peft']}, bitsandbytes {v['bitsandbytes']}."
        + _kernels_line(report["environment"].get("kernels")),
        "Raw measurements: `experiments/speed/bench/bench.json`.",
        "",
        "| Benchmark | Measured | Ratio | Target | Result |",
        "|---|---|---|---|---|",
    ]
    if sp:
        lines.append(
            f"| (a) speed, 1 agent 1 turn: median s/step, ours vs TRL GRPOTrainer | "
            f"{sp['ours']['median_step_s']:.3f} vs {sp['trl']['median_step_s']:.3f} | "
            f"{sp['ratio_ours_over_trl']:.3f} | <= {sp['target']} | {'PASS' if sp['pass'] else 'FAIL'} |")
    if mem:
        n = str(mem["n_max"])
        one = mem["summary"]["1"]["shared_peak_mib"]
        lines.append(
            f"| (b) memory: peak RSS, {n} agents on one shared 4-bit base vs 1 agent (round 1; ratio: median of "
            f"{len(mem.get('ratio_each_round', [])) or 1} rounds) | "
            f"{mem['summary'][n]['shared_peak_mib']:.0f} MiB vs {one:.0f} MiB | "
            f"{mem['ratio_shared_nmax_over_one']:.3f} | <= {mem['target']} | {'PASS' if mem['pass'] else 'FAIL'} |")
    lines.append("")
    if report.get("targets"):
        lines += _targets_markdown(report)
    if sp:
        t, o = sp["trl"], sp["ours"]
        lines += [
            "## (a) Speed",
            "",
            f"SmolLM2-135M-Instruct (float32) + LoRA r={s['lora_r']} (all linear layers), K={s['num_generations']}, "
            f"{s['max_completion_length']} completion tokens forced on both sides (min_new_tokens = "
            f"max_completion_length), one prompt per step, beta=0, no gradient checkpointing, bf16 off, "
            f"attention: TRL's model {s.get('trl_attention', 'grouped_sdpa (as ours)')} (as transformers loads it), "
            f"ours the library's grouped_sdpa, {sp['torch_threads']} torch thread(s). {s['steps']} steps per trainer, alternating TRL / ours in blocks "
            f"of {s['block_steps']} step(s) in one process; the first {s['warmup_steps']} step(s) of each dropped as "
            "warm-up. A step is timed from `on_step_begin` to `on_step_end` (rollout + update + optimizer step).",
            "",
            "| median seconds | TRL GRPOTrainer | MAGRPOTrainer | ours / TRL |",
            "|---|---|---|---|",
            f"| optimizer step (wall) | {t['median_step_s']:.3f} | {o['median_step_s']:.3f} | "
            f"{sp['ratio_ours_over_trl']:.3f} |",
            f"| optimizer step (fastest) | {t['min_step_s']:.3f} | {o['min_step_s']:.3f} | "
            f"{sp['ratio_min_ours_over_trl']:.3f} |",
            f"| optimizer step (process CPU time) | {t['median_cpu_s']:.3f} | {o['median_cpu_s']:.3f} | "
            f"{sp['ratio_cpu_ours_over_trl']:.3f} |",
            f"| rollout (TRL `_generate_and_score_completions`, ours `rollout`) | {t['median_rollout_s']:.3f} | "
            f"{o['median_rollout_s']:.3f} | {sp['ratio_rollout_ours_over_trl']:.3f} |",
            f"| of which generation (TRL `model.generate()`, ours `pool.generate_many()`) | {t['median_generate_s']:.3f} | {o['median_generate_s']:.3f} | "
            f"{sp['ratio_generate_ours_over_trl']:.3f} |",
            f"| update (step minus rollout: loss, backward, optimizer) | {t['median_update_s']:.3f} | "
            f"{o['median_update_s']:.3f} | {sp['ratio_update_ours_over_trl']:.3f} |",
            "",
            "Paired block ratios (each block of ours / the TRL block just before it): "
            + ", ".join(f"{r:.3f}" for r in sp["paired_block_ratios"])
            + f" (median {sp['median_paired_block_ratio']:.3f}). Same `generate()` output shapes on both sides: "
            f"{sp['identical_generate_output_shapes']}. 1-min load average during the run: "
            f"{min(x['loadavg_before'] for x in sp['blocks']):.2f}-{max(x['loadavg_after'] for x in sp['blocks']):.2f}.",
            "",
        ]
    if mem:
        lines += [
            "## (b) Memory",
            "",
            "Peak RSS of a fresh subprocess per row (`VmHWM` of the child, which equals its `ru_maxrss` when the "
            "parent is small; the memory runs go first because Linux carries `ru_maxrss` across exec, so a child of "
            "a big parent would report the parent's peak). Each child builds a `MAGRPOTrainer` with a single-turn "
            f"`FunctionEnvironment` of n agents (4-bit NF4 SmolLM2-135M, LoRA r={s['lora_r']}, K="
            f"{s['num_generations']}, {s['max_completion_length']} tokens) and runs {s['memory_steps']} optimizer "
            "step(s) (generation + backward). 'shared': every agent names the same model (one base, one adapter per agent); 'separate': "
            "each agent names its own (symlinked) copy of the checkpoint, so the pool loads n bases. "
            "'file-backed' is the part of the RSS after build that is file-backed pages (RssFile: shared libraries, "
            "~140 MiB, plus the mmap-ed checkpoint).",
            "",
            "Round 1 runs every configuration; further rounds run the target's pair again (1 agent, "
            f"{mem['n_max']} agents on one base), alternately in order; the target is the median of the rounds' "
            "ratios (4 agents / 1 of each round: "
            + ", ".join(f"{x:.4f}" for x in mem.get("ratio_each_round", [])) + "). 'peak / 1 agent' divides by "
            "round 1's one-agent peak.",
            "",
            "| round | agents | layout | allocator | bases | RSS after imports (MiB) | RSS after build (MiB) | "
            "of which file-backed | peak RSS (MiB) | ru_maxrss (MiB) | peak / 1 agent |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in mem["runs"]:
            if "error" in r:
                lines.append(f"| {r.get('round', 1)} | {r['n_agents']} | {r['layout']} | {r.get('allocator')} | - | - "
                             "| - | - | failed | - | - |")
                continue
            one = mem["summary"]["1"]["shared_peak_mib"]
            lines.append(f"| {r.get('round', 1)} | {r['n_agents']} | {r['layout']} | {r.get('allocator')} | {r['n_bases']} | "
                         f"{r['after_imports']['rss_mib']:.0f} | {r['after_build']['rss_mib']:.0f} | "
                         f"{r['after_build'].get('RssFile', float('nan')):.0f} | {r['peak_rss_mib']:.0f} | "
                         f"{r['ru_maxrss_mib']:.0f} | "
                         f"{r['peak_rss_mib'] / one:.3f} |")
        lines.append("")
    path.write_text("\n".join(lines))


def _kernels_line(kernels: dict | None) -> str:
    """The instruction set of a bench record, for bench.md (records before it was kept have none)."""
    if not kernels:
        return ""
    caps = ", ".join(f"{k}={v}" for k, v in kernels.get("env", {}).items())
    return (f" Instruction set: ATen kernels {kernels['aten_cpu_capability']}, CPU flags "
            f"{' '.join(kernels.get('cpu_flags', [])) or 'unknown'}" + (f", capped by {caps}" if caps else "") + ".")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke version: fewer steps and memory configurations")
    parser.add_argument("--steps", type=int, default=None, help="speed: optimizer steps per trainer (default 8; 4 quick)")
    parser.add_argument("--block-steps", type=int, default=None, help="speed: steps per alternating block (default 1)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                        help="torch intra-op threads of both trainers (default: every core this process may use)")
    parser.add_argument("--skip-targets", action="store_true",
                        help="skip the main job's measurements (benchmarks/targets.py)")
    parser.add_argument("--memory-steps", type=int, default=None, help="memory: optimizer steps per subprocess")
    parser.add_argument("--memory-rounds", type=int, default=None,
                        help="memory: rounds of the target's pair (1 agent, 4 agents on one base), alternating; the "
                             "target is the median of the rounds' ratios (default 3; 1 quick)")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--profile", action="store_true", help="speed: also cProfile a few steps of each trainer")
    parser.add_argument("--out-dir", default=str(ROOT / "experiments" / "speed" / "bench"))
    parser.add_argument("--verbose", action="store_true", help="keep the libraries' own logs")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    parser.add_argument("--memory-keep-freed", action="store_true",
                        help="memory: run every configuration with cpu_keep_freed_memory on (benchmarks/allocator.py)")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_child:
        result = memory_child(json.loads(args.memory_child))
        print(MEMORY_RESULT_TAG + json.dumps(result), flush=True)
        return 0

    setup_logging(args.verbose)
    started = time.perf_counter()
    settings = {
        "quick": args.quick,
        "model": "smollm2-135m-instruct",
        "num_generations": 4,
        "max_completion_length": 32,
        "lora_r": 8,
        "lora_alpha": 16,
        "steps": args.steps or (4 if args.quick else 8),
        "block_steps": args.block_steps or 1,
        "threads": args.threads,
        "warmup_steps": 1,
        "dataset_rows": 64,
        "memory_agents": [1, 2, 4] if not args.quick else [1, 4],
        "memory_steps": args.memory_steps or (1 if args.quick else 2),
        "memory_repeat_single": False,
        "memory_rounds": args.memory_rounds or (1 if args.quick else 3),
        "memory_config_overrides": {"cpu_keep_freed_memory": True} if args.memory_keep_freed else {},
        "profile": args.profile,
        "profile_steps": 2,
        "trl_attention": "sdpa",
    }
    if settings["steps"] % settings["block_steps"]:
        parser.error("--steps must be a multiple of --block-steps")
    import torch

    report = {
        "command": "python benchmarks/bench.py" + (" " + shlex.join(argv if argv is not None else sys.argv[1:])
                                                   if (argv if argv is not None else sys.argv[1:]) else ""),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "settings": settings,
        "environment": {"versions": versions(), "cpu_count": os.cpu_count(),
                        "cpu_affinity": len(os.sched_getaffinity(0)), "cpu_model": cpu_model(),
                        "cpu_generation": cpu_generation(), "torch_default_threads": torch.get_num_threads(), "platform": platform.platform(),
                        "total_memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
                        # the instruction set the kernels use (CPU flags, ATen's capability, variables that cap it)
                        "kernels": kernel_record()},
    }
    log.info("settings: %s", settings)
    if not args.skip_memory:  # first, while this process is small (children inherit its ru_maxrss)
        t0 = time.perf_counter()
        report["memory"] = run_memory(settings)
        report["memory"]["wall_s"] = time.perf_counter() - t0
        m = report["memory"]
        log.info("memory: %s agents shared / 1 agent = %.3f (target <= %.2f: %s)", m["n_max"],
                 m["ratio_shared_nmax_over_one"], MEMORY_TARGET, "PASS" if m["pass"] else "FAIL")
    if not args.skip_speed:
        t0 = time.perf_counter()
        report["speed"] = run_speed(settings)
        report["speed"]["wall_s"] = time.perf_counter() - t0
        sp = report["speed"]
        log.info("speed: ours %.3f s/step vs TRL %.3f s/step -> ratio %.3f (target <= %.2f: %s)",
                 sp["ours"]["median_step_s"], sp["trl"]["median_step_s"], sp["ratio_ours_over_trl"], SPEED_TARGET,
                 "PASS" if sp["pass"] else "FAIL")
    if not args.skip_targets and not args.quick:
        from targets import collect

        t0 = time.perf_counter()
        measured = collect(report.get("speed"), report.get("memory"), log)
        report["targets"], report["target_measurements"] = measured["targets"], measured["measurements"]
        report["target_measurements"]["wall_s"] = time.perf_counter() - t0
        for name, t in report["targets"].items():
            log.info("target %s: %.3f (target %s): %s", name, t["value"], t["target"], "met" if t["met"] else "MISSED")
    report["runtime_s"] = time.perf_counter() - started
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    write_markdown(report, out / "bench.md")
    kept = keep_cpu_record(out, " ".join(filter(None, (report["environment"]["cpu_model"],
                                                       report["environment"].get("cpu_generation")))))
    log.info("wrote %s and %s (%.0f s); this CPU's record: %s", out / "bench.json", out / "bench.md",
             report["runtime_s"], kept)
    ok = all(report[k]["pass"] for k in ("speed", "memory") if k in report) and \
        all(t["met"] for t in report.get("targets", {}).values())
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())
