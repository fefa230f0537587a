"""Team rollout generation against plain HF generate and the CPU's compute limit, in one process.

    python benchmarks/generation_throughput.py [--tasks 4] [--samples 4] [--new-tokens 48]
        [--out experiments/speed/generation/throughput.json]

One team step of the main job (TLDR, summary + elaboration, QLoRA adapters on one shared 4-bit SmolLM2-135M, K
samples per agent and task) is generated twice with the pool's team-level generation (the second is timed), then
the same prompts x samples with plain transformers ``generate`` of the base model (no adapters, fp32, same batch,
``min_new_tokens`` = the new tokens, so it never generates fewer tokens than the team does), and a 2048^3 matmul is
timed for the compute limit: ``matmul FLOP/s / (2 x parameters)`` tokens per second. Ratios, not absolute times,
are what carry over between machines.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from measure import matmul_flops, write_result
from transformers import GenerationConfig

from trl_multiagent.environments.writing import TLDREnv
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4, help="training tasks of the step (prompts per agent)")
    parser.add_argument("--samples", type=int, default=4, help="samples per agent and task (K)")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--out", default="experiments/speed/generation/throughput.json")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    specs = [AgentSpec(name=n, model="smollm2-135m-instruct", quantization="4bit", lora_r=16, lora_alpha=32)
             for n in ("summary", "elaboration")]
    pool = AgentPool(specs)
    env = TLDREnv()
    requests = []
    for task in TLDREnv.make_rows(args.tasks):
        prompts = env.reset(task)
        requests += [GenerationRequest(a, prompts[a], num_samples=args.samples) for a in env.agents]
    config = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=True, temperature=0.8, top_p=0.95)
    pool.generate_many(requests, config)  # warm-up
    start = time.perf_counter()
    out = pool.generate_many(requests, config)
    team_s = time.perf_counter() - start
    team_tokens = sum(len(g.completion_ids) for gens in out for g in gens)

    key = pool.policies[pool.policy_of("summary")].base_key
    model, tok = pool.bases[key].get_base_model(), pool.tokenizers[key]
    rows = [pool.encode_prompt(r.agent, r.prompt) for r in requests for _ in range(r.num_samples)]
    width = max(map(len, rows))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad(), pool.bases[key].disable_adapter():
        start = time.perf_counter()
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=args.new_tokens,
                       min_new_tokens=args.new_tokens, do_sample=True, temperature=0.8, top_p=0.95,
                       pad_token_id=pad)
        plain_s = time.perf_counter() - start
    plain_tokens = len(rows) * args.new_tokens

    flops = matmul_flops()
    # parameters of the base (a 4-bit weight counts by its unpacked shape; the tied embedding once, as the LM head)
    params = sum(p.quant_state.shape.numel() if getattr(p, "quant_state", None) is not None else p.numel()
                 for n, p in model.named_parameters() if "lora_" not in n)
    roofline = flops / (2 * params)
    result = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "threads": torch.get_num_threads(), "sequences": len(rows), "prompt_tokens_max": width,
        "new_tokens_max": args.new_tokens,
        "team_rollout": {"seconds": team_s, "tokens": team_tokens, "tokens_per_s": team_tokens / team_s},
        "plain_generate": {"seconds": plain_s, "tokens": plain_tokens, "tokens_per_s": plain_tokens / plain_s},
        "matmul_gflops": flops / 1e9, "parameters": params, "roofline_tokens_per_s": roofline,
        "rollout_vs_plain_generate": (team_tokens / team_s) / (plain_tokens / plain_s),
        "rollout_vs_roofline": (team_tokens / team_s) / roofline,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
