"""The prompt positions the update's teacher-forced passes run on one step of the math team, counted (no timing):
micro-batches ordered by total length (before issue 40), by prompt tokens, and by prompt tokens with the shared
prefixes stored once for all micro-batches (teacher_forcing.PrefixStore), against the positions needed at least.

    python benchmarks/loss_positions.py [--micro_batch 8] [--out experiments/speed/generation/loss_positions.json]

The step is built from the recipe's environment (math_tool_generalisation, 4 training problems): both agents' first
prompts with K = 4 samples each, and for 2 of the episodes both agents' second-turn prompts (after a wrong reasoner
answer and a program) with K = 4 samples; completion lengths drawn uniformly from 5 to 40 tokens (seeded), as the
recipe's 40-token budget gives. A micro-batch runs each distinct prefix of its
prompts once (its trie of prompt tokens: generation/prefixes.py:distinct_prefix_tokens), which is what
completion_outputs' shared prefixes come to; with the store, a prefix several prompts share is counted once per step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trl_multiagent.generation.prefixes import distinct_prefix_tokens, shared_prefixes  # noqa: E402


def step_prompts(tokenizer) -> list[list[int]]:
    from trl_multiagent.environments import MathToolGeneralisationEnv

    def encode(messages):
        return tokenizer(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"]

    env = MathToolGeneralisationEnv(max_turns=2, max_feedback_chars=300)
    rows = MathToolGeneralisationEnv.make_dataset(num_tasks=4, seed=0, split="train").to_list()
    prompts = []
    for i, row in enumerate(rows):
        first = env.reset(row)
        prompts += [encode(first[a]) for a in env.agents for _ in range(4)]
        if i < 2:
            nxt = env.step({"reasoner": "The answer is 3 + 4 = 8. \\boxed{8}", "tool": "```python\nprint(3 + 4)\n```"})
            prompts += [encode(nxt.next_prompts[a]) for a in env.agents for _ in range(4)]
    return prompts


def count(prompts: list[list[int]], lengths: list[int], micro_batch: int) -> dict:
    samples = list(zip(prompts, lengths))

    def run(order, stored: set[tuple[int, ...]] = frozenset()) -> int:
        total = 0
        for i in range(0, len(order), micro_batch):
            chunk = [samples[j] for j in order[i:i + micro_batch]]
            total += sum(c for _, c in chunk)
            # a stored prefix is not run again: count each prompt from the end of the longest stored prefix it has
            rests = []
            for p, _ in chunk:
                cut = max((len(s) for s in stored if len(s) < len(p) and tuple(p[:len(s)]) == s), default=0)
                rests.append(tuple(p[cut:]) if cut else tuple(p))
            total += distinct_prefix_tokens([list(r) if r != tuple(p) else p for r, (p, _) in zip(rests, chunk)])
        return total + sum(len(s) for s in stored)

    n = len(samples)
    by_length = sorted(range(n), key=lambda i: -(len(samples[i][0]) + samples[i][1]))
    by_prompt = sorted(range(n), key=lambda i: samples[i][0])
    distinct = [list(p) for p in dict.fromkeys(tuple(p) for p in prompts)]
    group_of, prefix_len = shared_prefixes(distinct, [None] * len(distinct))
    stored = {tuple(distinct[group_of.index(g)][:length]) for g, length in enumerate(prefix_len)
              if length and group_of.count(g) > 1}
    needed = distinct_prefix_tokens(prompts) + sum(lengths)
    out = {"samples": n, "distinct_prompts": len(distinct), "micro_batch": micro_batch, "completion_tokens": sum(lengths),
           "prompt_lengths": sorted({len(p) for p in prompts}), "stored_prefix_lengths": sorted(len(s) for s in stored),
           "needed": needed, "by_length": run(by_length), "by_prompt": run(by_prompt),
           "by_prompt_with_store": run(by_prompt, stored)}
    for key in ("by_length", "by_prompt", "by_prompt_with_store"):
        out[f"{key}_over_needed"] = round(out[key] / needed, 3)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro_batch", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--seed", type=int, default=0, help="of the completion lengths")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import random

    from trl_multiagent.models.loading import load_tokenizer, resolve_model

    prompts = step_prompts(load_tokenizer(resolve_model("smollm2-135m-instruct")))
    rng = random.Random(args.seed)
    lengths = [rng.randint(5, 40) for _ in prompts]
    result = {"command": "python benchmarks/loss_positions.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "counts": [count(prompts, lengths, m) for m in args.micro_batch]}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
