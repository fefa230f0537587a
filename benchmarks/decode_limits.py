"""What stops the decoding step at its bound: the step against a pure read of its weights, its frozen matmuls alone,
and the same step compiled whole by inductor, all in one run.

    python benchmarks/decode_limits.py [--rows 1,16] [--rounds 5] [--skip-compiled]
        [--out experiments/speed/generation/decode_limits.json]

The main job's base as in ``benchmarks/decode_step.py`` (4-bit SmolLM2-135M computing with its de-quantised copy,
two LoRA adapters r=16 with random B matrices, rows alternating between them), a 200-token prompt prefilled, then per
round, in turn:

* ``lean``: 8 one-token steps of :class:`~trl_multiagent.generation.LeanStep` with packed weights (what generation
  runs), milliseconds per step;
* ``lean_without_lora``: the same step made with the adapters disabled (PEFT's ``disable_adapter``), so without its
  LoRA groups: ``lean`` minus this is what the rows' LoRA deltas cost (``lora_ms``);
* ``lean_rows_by_adapter``: the lean step with the rows sorted by adapter, as the decoding loop lays out a batch
  with as many rows of each adapter: its LoRA deltas in the block form (one batched matmul per group on the rows
  viewed as blocks) instead of the masked form of the alternating rows;
* ``frozen``: the same step's frozen matmuls alone (its own packed q/k/v, o, gate/up, down and LM-head copies, on
  inputs of the step's shapes): what the step's weights cost through oneDNN;
* ``attention``: the step's attention alone (``LeanStep.attention``, the same calls on the same threads) over the
  30 layers' caches of the run, at the timed steps' mean length: the caches are read from memory as in the step
  (``attention_kv_read_gb_s``: the keys and values read per second);
* ``read``: ``sum()`` of every float32 weight the step reads (frozen linears, LM head, LoRA matrices; the same bytes
  the bound counts), the fastest way torch reads those bytes once;
* ``compiled``: the step written as one function of static shapes (the cache at its full capacity, the new key and
  value written at a column given as a tensor, attention over every column with the padding masked) and compiled by
  ``torch.compile`` (inductor) with ``freezing`` on, so that its frozen weights are constants inductor packs for its
  own matmuls (MKL) and its small operations (norms, rotary, residuals, activation, softmax) fuse into generated C++
  kernels; the LoRA matrices and their per-row scales are inputs. Compiled once per row count before the rounds (its
  seconds reported); its logits are checked against the lean step's;
* the copy bandwidth and the 2048^3 matmul rate (``decode_step.copy_bandwidth``, ``measure.matmul_flops``), from
  which the step's bound ``max(weight bytes / bandwidth, FLOPs / matmul rate)`` is made as in ``decode_step.py``.

Reported per row count: medians over rounds of each time and of each over the round's bound, the lean step's time
outside its frozen matmuls, the step split into its parts (``parts_ms``: frozen matmuls, attention, LoRA, and the
rest, ``lean_without_lora - frozen - attention``: norms, rotary, cache writes, residuals, activation, the LM head's
input and every operation's dispatch and Python), and where the compiled step's time goes (its profile's shares of
self CPU time). ``--skip-compiled`` leaves the two compiled paths out (no compilation).
"""

# ruff: noqa: E402  (the inductor cache is switched off before torch is imported)
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

# every compilation from scratch: the compile times reported are those of a first run (no inductor cache on disk)
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import torch
import torch.nn.functional as F
from decode_step import copy_bandwidth, load, run_steps, step_counts, two_adapter_base
from measure import matmul_flops, write_result

from trl_multiagent.generation import LeanStep, MultiAdapterBatch, PackedFrozenLinears
from trl_multiagent.generation.kv_cache import preallocated_cache
from trl_multiagent.generation.lean_step import ONE_THREAD, PACKED_MIN_ROWS
from trl_multiagent.runtime.provenance import cpu_model, kernel_record

PROMPT, STEPS = 200, 8

#: The packed copies :func:`packed_frozen_op` computes with, by key: ``(_Frozen of the lean step, output size)``.
_PACKED: dict[int, tuple] = {}


@torch.library.custom_op("trl_multiagent_bench::packed_frozen", mutates_args=())
def packed_frozen_op(x: torch.Tensor, key: int) -> torch.Tensor:
    """One of the lean step's packed frozen matmuls (oneDNN) as an operation inductor calls and does not look into
    (it cannot lower the packed op with its opaque weight itself); fewer rows than ``PACKED_MIN_ROWS`` are padded as
    the lean step pads them."""
    frozen, _ = _PACKED[key]
    rows = x.size(0)
    if rows < PACKED_MIN_ROWS:
        return frozen(torch.cat([x, x.new_zeros((PACKED_MIN_ROWS - rows, x.size(1)))]))[:rows].clone()
    return frozen(x.contiguous())


@packed_frozen_op.register_fake
def _(x: torch.Tensor, key: int) -> torch.Tensor:
    return x.new_empty((x.size(0), _PACKED[key][1]))


def frozen_param(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t.contiguous(), requires_grad=False)


class StaticStep(torch.nn.Module):
    """The lean step's arithmetic (masked LoRA form) as one function of static shapes, for ``torch.compile``. Built
    from an unpacked :class:`LeanStep` (its float32 weights, its LoRA groups); the frozen weights are this module's
    parameters, so that inductor's ``freezing`` treats them as constants."""

    def __init__(self, lean: LeanStep, packed: LeanStep | None = None):
        super().__init__()
        layers = lean.layers
        #: with ``packed`` (a packed lean step of the same model): its oneDNN matmuls through packed_frozen_op, by key
        self.keys = None
        if packed is not None:
            self.keys = []
            for layer in packed.layers:
                self.keys.append([])
                for frozen in (layer.qkv, layer.o, layer.gate_up, layer.down):
                    _PACKED[id(frozen)] = (frozen, sum(w.size(0) for w in frozen.weights))
                    self.keys[-1].append(id(frozen))
            _PACKED[id(packed.head)] = (packed.head, packed.head.weights[0].size(0))
            self.head_key = id(packed.head)
        self.heads, self.kv_heads, self.dim, self.scaling = lean.heads, lean.kv_heads, lean.head_dim, lean.scaling
        self.embed = frozen_param(lean.embed)
        self.qkv = torch.nn.ParameterList([frozen_param(torch.cat(layer.qkv.weights)) for layer in layers])
        self.o = torch.nn.ParameterList([frozen_param(layer.o.weights[0]) for layer in layers])
        self.gate_up = torch.nn.ParameterList([frozen_param(torch.cat(layer.gate_up.weights)) for layer in layers])
        self.down = torch.nn.ParameterList([frozen_param(layer.down.weights[0]) for layer in layers])
        self.norm1 = torch.nn.ParameterList([frozen_param(layer.norm1[0]) for layer in layers])
        self.norm2 = torch.nn.ParameterList([frozen_param(layer.norm2[0]) for layer in layers])
        self.final_norm = frozen_param(lean.norm[0])
        self.head = frozen_param(lean.head.weights[0])
        self.eps = lean.norm[1]
        self.intermediate = [layer.intermediate for layer in layers]

    @staticmethod
    def lora_inputs(lean: LeanStep) -> list:
        """Per layer, per group (qkv, o, gate/up, down): ``(A, S, [(first column, last column, B_p^T), ...])``, the
        masked form of :class:`~trl_multiagent.generation.lean_step._Lora` with the rows' scales ``S``."""
        return [[(lora.a, lean._scales_of(lora), [(c.start, c.stop, bt) for _, _, c, bt in lora.projections])
                 for lora in layer.loras] for layer in lean.layers]

    @staticmethod
    def _lora(h: torch.Tensor, group) -> torch.Tensor:
        a, scales, projections = group
        low = F.linear(h, a) * scales
        parts = [low[:, first:last] @ bt for first, last, bt in projections]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _frozen(self, x: torch.Tensor, layer: int, which: int, weights: torch.nn.ParameterList) -> torch.Tensor:
        if self.keys is None:
            return F.linear(x, weights[layer])
        return packed_frozen_op(x, self.keys[layer][which])

    def forward(self, tokens, cos, sin, attend, column, keys, values, loras):
        rows, heads, kv_heads, dim = tokens.size(0), self.heads, self.kv_heads, self.dim
        qk_width = (heads + kv_heads) * dim
        x = F.embedding(tokens, self.embed)
        for i in range(len(self.qkv)):
            h = F.rms_norm(x, (x.size(-1),), self.norm1[i], self.eps)
            y = self._frozen(h, i, 0, self.qkv) + self._lora(h, loras[i][0])
            qk = y[:, :qk_width].view(rows, heads + kv_heads, dim)
            qk = qk * cos + qk.roll(dim // 2, -1) * sin
            keys[i].index_copy_(2, column, qk[:, heads:].unsqueeze(2))
            values[i].index_copy_(2, column, y[:, qk_width:].view(rows, kv_heads, 1, dim))
            q = qk[:, :heads].view(rows, kv_heads, heads // kv_heads, dim)
            scores = torch.matmul(q, keys[i].transpose(-1, -2)) * self.scaling + attend
            a = torch.matmul(torch.softmax(scores, -1), values[i]).reshape(rows, heads * dim)
            x = x + self._frozen(a, i, 1, self.o) + self._lora(a, loras[i][1])
            h = F.rms_norm(x, (x.size(-1),), self.norm2[i], self.eps)
            gu = self._frozen(h, i, 2, self.gate_up) + self._lora(h, loras[i][2])
            m = F.silu(gu[:, :self.intermediate[i]]) * gu[:, self.intermediate[i]:]
            x = x + self._frozen(m, i, 3, self.down) + self._lora(m, loras[i][3])
        x = F.rms_norm(x, (x.size(-1),), self.final_norm, self.eps)
        return F.linear(x, self.head) if self.keys is None else packed_frozen_op(x, self.head_key)


def frozen_only(step: LeanStep, rows: int) -> Callable[[], None]:
    """The step's frozen matmuls alone, on inputs of its shapes (padded to ``PACKED_MIN_ROWS`` as the step pads)."""
    padded = max(rows, PACKED_MIN_ROWS)
    layer = step.layers[0]
    hidden = torch.randn(padded, step.hidden)
    attended = torch.randn(padded, step.heads * step.head_dim)
    inner = torch.randn(padded, layer.intermediate)

    def run():
        for layer in step.layers:
            layer.qkv(hidden)
            layer.o(attended)
            layer.gate_up(hidden)
            layer.down(inner)
        step.head(hidden)

    return run


def attention_only(step: LeanStep, cache, rows: int, length: int) -> Callable[[], None]:
    """The step's attention alone over every layer's cache (its first ``length`` positions), with a random query of
    the step's shape and no padding, on the threads the step would use."""
    group = step.heads // step.kv_heads
    q = torch.randn(rows, step.kv_heads, group, step.head_dim)
    attend = torch.zeros(rows, 1, 1, length)
    threads = torch.get_num_threads()
    small = threads > 1 and 2 * rows * step.heads * length * step.head_dim < ONE_THREAD

    def run():
        for kv in cache.layers:
            step.attention(q, kv._k[:, :, :length], kv._v[:, :, :length], attend, threads if small else 0)

    return run


def step_weights(step: LeanStep) -> list[torch.Tensor]:
    """Every float32 weight the step reads: frozen linears, LM head, LoRA matrices."""
    out = list(step.head.weights)
    for layer in step.layers:
        for frozen in (layer.qkv, layer.o, layer.gate_up, layer.down):
            out.extend(frozen.weights)
        for lora in layer.loras:
            if lora is not None:
                out.append(lora.a)
                out.extend(bt for *_, bt in lora.projections)
    return out


def timed(fn, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def measure_rows(peft_model, rows: int, rounds: int, compiled_paths: bool = True) -> dict:
    model = peft_model.get_base_model()
    adapters = [("first", "second")[i % 2] for i in range(rows)]
    capacity = PROMPT + STEPS + 1
    ids = torch.randint(100, 1000, (rows, PROMPT))
    cache = preallocated_cache(model, capacity)
    mask = torch.ones(rows, capacity, dtype=torch.long)
    tokens = torch.randint(100, 1000, (rows,))
    clock = time.perf_counter
    with torch.no_grad(), MultiAdapterBatch(model, adapters) as batch:
        with PackedFrozenLinears(model, skip=LeanStep.concatenated_modules(model)):
            model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        for kv in cache.layers:  # the compiled step attends over every column (masked): no uninitialised memory
            kv._k[:, :, PROMPT:] = 0
            kv._v[:, :, PROMPT:] = 0
        lean = LeanStep(model, batch, packed=True)
        with peft_model.disable_adapter():  # the LoRA layers are read when the step is made: none then
            bare = LeanStep(model, batch, packed=True)
        assert all(lora is None for layer in bare.layers for lora in layer.loras)
        # the same rows sorted by adapter (the step reads only the batch's row layout; the cache's rows are the same)
        by_adapter = MultiAdapterBatch(model, sorted(adapters))
        assert rows < 2 or by_adapter.blocks.in_place
        sorted_step = LeanStep(model, by_adapter, packed=True)
        unpacked = LeanStep(model, batch, packed=False)
        unpacked._check_rows(rows)
        lean._rotary_table(capacity)
        loras = StaticStep.lora_inputs(unpacked)
        keys, values = [kv._k for kv in cache.layers], [kv._v for kv in cache.layers]

        def static_inputs(position: int):
            where = torch.full((rows,), position)
            attend = torch.zeros(rows, capacity).masked_fill_(torch.arange(capacity)[None] > position, -torch.inf)
            return (tokens, lean._cos[where][:, None], lean._sin[where][:, None], attend[:, None, None, :],
                    torch.tensor([position]))

        cache.set_length(PROMPT)
        reference = lean(tokens, mask[:, :PROMPT + 1], torch.full((rows,), PROMPT), cache)
        compiled, compile_s, checks = {}, {}, {}
        for name, static in (("compiled", StaticStep(unpacked)), ("compiled_onednn", StaticStep(unpacked, lean))) \
                if compiled_paths else ():
            torch._dynamo.reset()
            compiled[name] = torch.compile(static, dynamic=False)
            start = time.perf_counter()
            logits = compiled[name](*static_inputs(PROMPT), keys, values, loras)
            compile_s[name] = time.perf_counter() - start
            checks[name] = {"max_logit_difference": (logits - reference).abs().max().item(),
                            "same_argmax": bool((logits.argmax(-1) == reference.argmax(-1)).all())}

        def compiled_steps(name: str) -> float:
            total = 0.0
            for i in range(STEPS):
                inputs = static_inputs(PROMPT + i)
                start = clock()
                compiled[name](*inputs, keys, values, loras)
                total += clock() - start
            return total / STEPS

        frozen = frozen_only(lean, rows)
        weights = step_weights(lean)

        def read():
            for w in weights:
                w.sum()

        attention = attention_only(lean, cache, rows, PROMPT + STEPS // 2)
        paths = {"lean": lambda: run_steps(model, cache, batch, "lean", lean, tokens, mask, PROMPT, STEPS, clock),
                 "lean_without_lora": lambda: run_steps(model, cache, batch, "lean", bare, tokens, mask, PROMPT,
                                                        STEPS, clock),
                 "lean_rows_by_adapter": lambda: run_steps(model, cache, by_adapter, "lean", sorted_step, tokens,
                                                           mask, PROMPT, STEPS, clock),
                 "frozen": lambda: timed(frozen, STEPS), "attention": lambda: timed(attention, STEPS),
                 "read": lambda: timed(read, STEPS)}
        if compiled_paths:
            paths.update(compiled=lambda: compiled_steps("compiled"),
                         compiled_onednn=lambda: compiled_steps("compiled_onednn"))
        for path in paths.values():  # warm-up
            path()
        times = {name: [] for name in paths}
        rates = []
        for r in range(rounds):
            for name in list(paths) if r % 2 == 0 else reversed(list(paths)):
                times[name].append(paths[name]())
            rates.append((copy_bandwidth(clock, repeats=2), matmul_flops(repeats=2, clock=clock)))
        shares = {}
        for name in compiled:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for i in range(3):
                    compiled[name](*static_inputs(PROMPT + i), keys, values, loras)
            total = sum(e.self_cpu_time_total for e in prof.key_averages())
            shares[name] = dict(sorted(((e.key, round(e.self_cpu_time_total / total, 4))
                                        for e in prof.key_averages()), key=lambda kv: -kv[1])[:8])
    counts = step_counts(model, rows, PROMPT + STEPS // 2)
    bounds = [max(counts["weight_bytes"] / bw, counts["flops"] / rate) for bw, rate in rates]
    frozen_flops = 2 * max(rows, PACKED_MIN_ROWS) * counts["frozen_weights"]
    entry = {"rows": rows, "bound_is": "memory" if bounds and counts["weight_bytes"] / rates[0][0]
             >= counts["flops"] / rates[0][1] else "compute",
             "bound_ms": 1000 * statistics.median(bounds),
             "copy_bandwidth_gb_s": statistics.median(bw for bw, _ in rates) / 1e9,
             "matmul_gflops": statistics.median(rate for _, rate in rates) / 1e9,
             "compile_s": compile_s, "compiled_against_lean": checks}
    for name, values_ in times.items():
        entry[f"{name}_ms"] = [round(1000 * t, 2) for t in values_]
        entry[f"{name}_ms_median"] = 1000 * statistics.median(values_)
        entry[f"{name}_over_bound"] = statistics.median(t / b for t, b in zip(values_, bounds))
    entry["lean_outside_frozen_ms_median"] = statistics.median(
        1000 * (t - f) for t, f in zip(times["lean"], times["frozen"]))
    # the step in parts, per round (the paths of one round ran back to back)
    per_round = {"frozen": times["frozen"], "attention": times["attention"],
                 "lora": [t - b for t, b in zip(times["lean"], times["lean_without_lora"])],
                 "rest": [b - f - a for b, f, a in zip(times["lean_without_lora"], times["frozen"],
                                                       times["attention"])]}
    per_round["lora_rows_by_adapter"] = [t - b for t, b in zip(times["lean_rows_by_adapter"],
                                                               times["lean_without_lora"])]
    entry["parts_ms"] = {name: round(1000 * statistics.median(v), 2) for name, v in per_round.items()}
    entry["parts_over_bound"] = {name: round(statistics.median(t / b for t, b in zip(v, bounds)), 3)
                                 for name, v in per_round.items()}
    entry["attention_kv_read_gb_s"] = counts["kv_cache_bytes"] / statistics.median(times["attention"]) / 1e9
    entry["read_gb_s"] = counts["weight_bytes"] / statistics.median(times["read"]) / 1e9
    entry["frozen_gflops"] = frozen_flops / statistics.median(times["frozen"]) / 1e9
    entry["compiled_profile_share"] = shares
    entry.update(counts)
    return entry


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/generation/decode_limits.json")
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-compiled", action="store_true", help="leave out the compiled paths")
    args = parser.parse_args(argv)
    import torch._inductor.config as inductor_config

    # for every compilation of this process (a recompilation included): the frozen weights are constants
    inductor_config.freezing = True
    torch.manual_seed(0)
    load_before = load()
    pool, key, _ = two_adapter_base()
    steps, summary = [], {}
    for rows in [int(r) for r in args.rows.split(",")]:
        entry = measure_rows(pool.bases[key], rows, args.rounds, compiled_paths=not args.skip_compiled)
        steps.append(entry)
        summary[str(rows)] = {k: round(entry[k], 2) for k in (
            "bound_ms", "read_ms_median", "frozen_ms_median", "attention_ms_median", "lean_without_lora_ms_median",
            "lean_ms_median", "lean_rows_by_adapter_ms_median", "compiled_ms_median", "compiled_onednn_ms_median", "lean_outside_frozen_ms_median",
            "read_over_bound", "frozen_over_bound", "lean_over_bound", "compiled_over_bound",
            "compiled_onednn_over_bound", "attention_kv_read_gb_s", "copy_bandwidth_gb_s") if k in entry}
        summary[str(rows)]["parts_ms"] = entry["parts_ms"]
        summary[str(rows)]["parts_over_bound"] = entry["parts_over_bound"]
        summary[str(rows)]["compile_s"] = {k: round(v, 1) for k, v in entry["compile_s"].items()}
        print(rows, summary[str(rows)], flush=True)
    result = {"command": "python benchmarks/decode_limits.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "cpu": cpu_model(), "threads": torch.get_num_threads(), "clock": "wall clock",
              "torch": torch.__version__, "kernels": kernel_record(), "load_before": load_before, "load_after": load(),
              "summary": summary, "steps": steps}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
