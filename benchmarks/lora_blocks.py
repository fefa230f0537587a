"""The LoRA deltas of a mixed-adapter batch in the block form against the masked form
(``trl_multiagent/generation/lora_batch.py``: ``AdapterBlocks``, ``add_block_lora``, ``BLOCK_FORM``).

    python benchmarks/lora_blocks.py [--out experiments/speed/generation/lora_blocks.json]

Three parts, each form alternating with the other:

* ``decode_layer``: one layer's LoRA deltas in a decoding step, through the lean step's own ``_Lora`` groups (q/k/v,
  o, gate/up, down of SmolLM2-135M's widths, PEFT LoRA layers with r=16 per adapter), microseconds per layer (mean of
  200 calls), for 1, 2 and 4 adapters on 16-64 rows, in mixed order (gathered into blocks) and already in blocks;
* ``prefill_layer``: the same for a prefill (8 rows of 110 positions, the 7 projections through
  ``MultiAdapterBatch``'s patched LoRA layers);
* ``team``: team-level generation on the workload of ``make bench``'s ``per_token_4_agents_vs_1`` (``benchmarks/targets.py agents``): 8 TL;DR prompts x 4
samples on SmolLM2-135M (4-bit base, its de-quantised copy), LoRA r=16 with random B, 1 agent or 4 agents (agent i
takes every 4th prompt), every row forced to ``L`` new tokens. For each team and ``L`` (1: the prefill and one step;
16), the two forms alternate call by call (``--repeats`` each, after a warm-up); the medians give the prefill, the
seconds per decoding step ((t_16 - t_1) / 15) and the seconds per generated token of 4 agents over 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from measure import write_result

from trl_multiagent.runtime.provenance import cpu_model

WIDTHS = {"q_proj": (576, 576), "k_proj": (576, 192), "v_proj": (576, 192), "o_proj": (576, 576),
          "gate_proj": (576, 1536), "up_proj": (576, 1536), "down_proj": (1536, 576)}


def _lora_layers(adapters: int):
    """SmolLM2-135M's seven projections of one layer as PEFT LoRA layers with ``adapters`` adapters (r=16, random B)."""
    from peft import LoraConfig, inject_adapter_in_model

    layer = torch.nn.Module()
    for name, (n_in, n_out) in WIDTHS.items():
        setattr(layer, name, torch.nn.Linear(n_in, n_out, bias=False))
    names = [f"a{i}" for i in range(adapters)]
    for name in names:
        layer = inject_adapter_in_model(LoraConfig(r=16, lora_alpha=32, target_modules=list(WIDTHS)), layer,
                                        adapter_name=name)
    with torch.no_grad():
        for n, p in layer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)
    return layer, names


def _time(fn, calls: int) -> float:
    for _ in range(max(3, calls // 10)):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def decode_layer(calls: int = 200) -> list[dict]:
    from trl_multiagent.generation.lean_step import _Lora
    from trl_multiagent.generation.lora_batch import AdapterBlocks

    threads = torch.get_num_threads()
    out = []
    for adapters, rows, order in ((1, 16, "blocks"), (1, 64, "blocks"), (2, 16, "mixed"), (2, 64, "mixed"),
                                  (4, 32, "mixed"), (4, 32, "blocks"), (4, 64, "mixed")):
        layer, names = _lora_layers(adapters)
        groups = [_Lora([getattr(layer, n) for n in g], names) for g in (("q_proj", "k_proj", "v_proj"),
                                                                          ("o_proj",), ("gate_proj", "up_proj"),
                                                                          ("down_proj",))]
        index = torch.arange(rows) % adapters if order == "mixed" else torch.arange(rows) * adapters // rows
        blocks = AdapterBlocks.of(index, adapters)
        inputs = [(torch.zeros(rows, g.width), torch.randn(rows, g.a.size(1))) for g in groups]
        scales = [g.scales(index) for g in groups]

        def masked(groups=groups, inputs=inputs, scales=scales):
            for g, (y, x), s in zip(groups, inputs, scales):
                g.add(y, x, s, threads)

        def block_form(groups=groups, inputs=inputs, blocks=blocks):
            for g, (y, x) in zip(groups, inputs):
                g.add(y, x, None, threads, blocks)

        times = {"masked": [], "blocks": []}
        for _ in range(3):
            times["masked"].append(_time(masked, calls))
            times["blocks"].append(_time(block_form, calls))
        entry = {"adapters": adapters, "rows": rows, "order": order, "in_place": blocks.in_place,
                 "masked_us": min(times["masked"]), "blocks_us": min(times["blocks"])}
        entry["blocks_over_masked"] = entry["blocks_us"] / entry["masked_us"]
        out.append(entry)
        print("decode layer", {k: round(v, 3) if isinstance(v, float) else v for k, v in entry.items()}, flush=True)
    return out


def prefill_layer(calls: int = 20) -> list[dict]:
    import trl_multiagent.generation.lora_batch as lora_batch

    out = []
    for adapters in (1, 2, 4):
        layer, names = _lora_layers(adapters)
        rows = [names[i % adapters] for i in range(8)]
        xs = {n: torch.randn(8, 110, WIDTHS[n][0]) for n in WIDTHS}
        times = {"masked": [], "blocks": []}
        for _ in range(3):
            for form, on in (("masked", False), ("blocks", True)):
                lora_batch.BLOCK_FORM = on
                with torch.no_grad(), lora_batch.MultiAdapterBatch(layer, rows):
                    times[form].append(_time(lambda layer=layer, xs=xs: [getattr(layer, n)(x) for n, x in xs.items()],
                                             calls))
        lora_batch.BLOCK_FORM = True
        entry = {"adapters": adapters, "rows": 8, "positions": 110, "masked_us": min(times["masked"]),
                 "blocks_us": min(times["blocks"])}
        entry["blocks_over_masked"] = entry["blocks_us"] / entry["masked_us"]
        out.append(entry)
        print("prefill layer", {k: round(v, 3) if isinstance(v, float) else v for k, v in entry.items()}, flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/generation/lora_blocks.json")
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args(argv)
    from transformers import GenerationConfig

    import trl_multiagent.generation.lora_batch as lora_batch
    from trl_multiagent.environments.writing import TLDREnv
    from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

    torch.manual_seed(0)
    layers = {"decode_layer": decode_layer(), "prefill_layer": prefill_layer()}
    env = TLDREnv()
    texts = [env.reset(task)["summary"] for task in TLDREnv.make_rows(8)]
    lengths = (1, 16)
    forms = {"masked": False, "blocks": True}
    teams = {}
    for n in (1, 4):
        names = [f"agent{i}" for i in range(n)]
        pool = AgentPool([AgentSpec(a, model="smollm2-135m-instruct", quantization="4bit", lora_r=16, lora_alpha=32)
                          for a in names])
        with torch.no_grad():
            for name, p in pool.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.01)
        requests = [GenerationRequest(names[i % n], t, num_samples=4) for i, t in enumerate(texts)]
        team = {"agents": n}
        for length in lengths:
            config = GenerationConfig(max_new_tokens=length, min_new_tokens=length, do_sample=True, temperature=0.8,
                                      top_p=0.95)
            pool.generate_many(requests[:n], config)  # warm-up
            times = {form: [] for form in forms}
            answers = {}
            for _ in range(args.repeats):
                for form, on in forms.items():
                    lora_batch.BLOCK_FORM = on
                    torch.manual_seed(1)
                    start = time.perf_counter()
                    out = pool.generate_many(requests, config)
                    times[form].append(time.perf_counter() - start)
                    answers[form] = [g.completion_ids for gens in out for g in gens]
            lora_batch.BLOCK_FORM = True
            team[f"L{length}"] = {form: {"median_s": statistics.median(t), "min_s": min(t), "all_s": t}
                                  for form, t in times.items()}
            team[f"L{length}"]["same_samples_rows"] = sum(a == b for a, b in zip(answers["masked"],
                                                                                 answers["blocks"]))
            team[f"L{length}"]["rows"] = len(answers["masked"])
            print(n, "agents", length, "tokens", {f: round(v["median_s"], 3) for f, v in
                                                  team[f"L{length}"].items() if isinstance(v, dict)}, flush=True)
        for form in forms:
            t1, t16 = (team[f"L{length}"][form]["median_s"] for length in lengths)
            team[form] = {"prefill_s": t1, "decode_step_s": (t16 - t1) / (lengths[1] - lengths[0]),
                          "seconds_per_token_16": t16 / (len(requests) * 4 * lengths[1])}
        teams[n] = team
        del pool
    summary = {form: {
        "per_token_4_agents_vs_1": teams[4][form]["seconds_per_token_16"] / teams[1][form]["seconds_per_token_16"],
        "decode_step_4_agents_vs_1": teams[4][form]["decode_step_s"] / teams[1][form]["decode_step_s"],
        "prefill_4_agents_vs_1": teams[4][form]["prefill_s"] / teams[1][form]["prefill_s"]} for form in forms}
    summary["blocks_over_masked"] = {f"{n}_agents_{k}": teams[n]["blocks"][k] / teams[n]["masked"][k]
                                     for n in teams for k in ("prefill_s", "decode_step_s")}
    write_result(args.out, {"command": "python benchmarks/lora_blocks.py " +
                            " ".join(argv if argv is not None else sys.argv[1:]),
                            "cpu": cpu_model(), "threads": torch.get_num_threads(), **layers, "teams": teams,
                            "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
