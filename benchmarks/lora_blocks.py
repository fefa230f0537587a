"""Team-level generation with the LoRA deltas in the block form against the masked form
(``trl_multiagent/generation/lora_batch.py``: ``AdapterBlocks``, ``BLOCK_FORM``).

    python benchmarks/lora_blocks.py [--out docs/results/generation/lora_blocks.json]

The workload of ``make bench``'s ``per_token_4_agents_vs_1`` (``benchmarks/targets.py agents``): 8 TL;DR prompts x 4
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

from trl_multiagent.provenance import cpu_model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/results/generation/lora_blocks.json")
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args(argv)
    from transformers import GenerationConfig

    import trl_multiagent.generation.lora_batch as lora_batch
    from trl_multiagent.agents import AgentPool, AgentSpec, GenerationRequest
    from trl_multiagent.environments.writing import TLDREnv

    torch.manual_seed(0)
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
                            "cpu": cpu_model(), "threads": torch.get_num_threads(), "teams": teams,
                            "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
