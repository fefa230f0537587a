"""The loss's log-prob pass of one step of the main job, forward and backward, three ways in the same run: what
reducing each call's logits to per-token values before assembling them saves, and what the blocked head saves.

    python benchmarks/loss_pass.py [--out experiments/speed/teacher_forcing/loss_pass.json]

The step's 48 samples are those of ``benchmarks/loss_positions.py`` (the math team's environment, 4 training
problems: both agents' first prompts and, for 2 episodes, their second-turn prompts, K = 4 each; completion lengths
drawn from 5 to 40 tokens, seeded; random completion tokens). They run as the trainer's update runs them: sorted by
prompt, micro-batches of 16 (the recipe's ``per_device_train_batch_size``), the prefixes they share stored once
(``teacher_forcing.PrefixStore``), each micro-batch's ``sum(logps x mask)`` sent backward, then the store's. The
model is the embedded SmolLM2-135M-Instruct, float32, one LoRA adapter (r 16, B made non-zero) on every linear.

- ``before``: the head as it was before 2026-11-28 (on today's stages, so not that day's library exactly):
  ``completion_outputs`` assembles the ``(B, T, V)`` logits of its calls (padded, joined, reordered), then one
  ``log_softmax`` over the whole tensor (``loss_head.whole_tensor``);
- ``assembled_blocked``: the same assembled logits, normalised by ``token_logps_and_entropies`` (blocks of rows);
- ``library``: ``completion_logps``: each call's logits reduced by the blocked head, only ``(B, T)`` values joined.

The three alternate for ``--repeats`` rounds (after one warm-up round each); the result keeps each way's median and
the medians of the paired ratios. The log-probs and LoRA gradients of the three are compared first.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import time

import torch
from loss_head import whole_tensor
from loss_positions import step_prompts
from measure import matmul_flops, paired_medians, write_result

from trl_multiagent.generation.logprobs import completion_logps, token_logps_and_entropies
from trl_multiagent.generation.teacher_forcing import PrefixStore, completion_outputs, lm_forward
from trl_multiagent.runtime.provenance import cpu_flags, cpu_model
from trl_multiagent.team.pool import AgentPool, AgentSpec

TEMPERATURE = 0.7


def micro_batches(prompts, lengths, size: int, vocab: int):
    """``(prompt_ids, prompt_mask, completion_ids, completion_mask)`` of each micro-batch, in prompt order."""
    rng = torch.Generator().manual_seed(0)
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    out = []
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        width, t = max(len(prompts[i]) for i in rows), max(lengths[i] for i in rows)
        prompt_ids = torch.tensor([[0] * (width - len(prompts[i])) + prompts[i] for i in rows])
        prompt_mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in rows])
        completion_ids = torch.randint(100, vocab, (len(rows), t), generator=rng)
        completion_mask = torch.tensor([[1] * lengths[i] + [0] * (t - lengths[i]) for i in rows])
        out.append((prompt_ids, prompt_mask, completion_ids * completion_mask, completion_mask))
    return out


def step_workload():
    """``(pool, prompts, lengths)``: the embedded SmolLM2-135M-Instruct in float32 with one LoRA adapter "solver" (r 16,
    alpha 32, B drawn non-zero, seeded) in training mode; the step's 48 prompts (:func:`loss_positions.step_prompts`)
    and their completion lengths, drawn from 5 to 40 tokens (seeded)."""
    torch.manual_seed(0)
    pool = AgentPool([AgentSpec("solver", model="smollm2-135m-instruct", lora_r=16, lora_alpha=32)])
    with torch.no_grad():
        for name, p in pool.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    pool.train()
    prompts = step_prompts(pool.tokenizer_of("solver"))
    rng = random.Random(0)
    return pool, prompts, [rng.randint(5, 40) for _ in prompts]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/teacher_forcing/loss_pass.json")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--micro_batch", type=int, default=16)
    args = parser.parse_args(argv)
    pool, prompts, lengths = step_workload()
    model = functools.partial(pool, "solver")
    params = pool.policy_parameters("solver")
    batches = micro_batches(prompts, lengths, args.micro_batch, pool.tokenizer_of("solver").vocab_size)

    def before(batch, store):
        logits = completion_outputs(lm_forward(model), *batch, prefix_store=store)
        return whole_tensor(logits, batch[2], TEMPERATURE)[0]

    def assembled_blocked(batch, store):
        logits = completion_outputs(lm_forward(model), *batch, prefix_store=store)
        return token_logps_and_entropies(logits, batch[2], TEMPERATURE)[0]

    def library(batch, store):
        return completion_logps(model, *batch, TEMPERATURE, compute_entropy=True, prefix_store=store)[0]

    ways = {"before": before, "assembled_blocked": assembled_blocked, "library": library}

    def step(way):
        pool.zero_grad()
        store = PrefixStore.build(lm_forward(model), [p for p in prompts], torch.device("cpu"))
        logps = []
        for batch in batches:
            lp = way(batch, store)
            (lp * batch[3]).sum().backward()
            logps.append(lp[batch[3].bool()].detach())
        store.backward()
        return torch.cat(logps), [p.grad.clone() for p in params]

    reference = step(before)
    checks = {}
    for name in ("assembled_blocked", "library"):
        logps, grads = step(ways[name])
        checks[name] = {"logps_max_abs_diff": (logps - reference[0]).abs().max().item(),
                        "grad_max_abs_diff": max((a - b).abs().max().item() for a, b in zip(grads, reference[1])),
                        "grad_max_abs": max(g.abs().max().item() for g in reference[1])}
        if checks[name]["logps_max_abs_diff"] > 1e-3 or \
                checks[name]["grad_max_abs_diff"] > 1e-3 * checks[name]["grad_max_abs"]:
            raise SystemExit(f"{name} differs from before: {checks[name]}")
    rate_before = matmul_flops()
    times = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            start = time.perf_counter()
            step(way)
            times[name].append(time.perf_counter() - start)
    rate = (rate_before + matmul_flops()) / 2
    medians, ratios = paired_medians(times, "before")
    result = {
        "command": "python benchmarks/loss_pass.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "samples": len(prompts), "micro_batch": args.micro_batch, "micro_batches": len(batches),
        "completion_tokens": sum(lengths), "repeats": args.repeats, "matmul_gflops": rate / 1e9,
        "checks": checks,
        "seconds_median": medians,
        "seconds_all": times,
        "before_over_way": ratios,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
