"""Print what a trained team writes: greedy texts of its agents on the first held-out TLDR posts of a seed, with
the joint reward of each pair (for reading a result, not for scoring one).

    python experiments/training/tldr_texts/show_team_texts.py OUTPUT_DIR SEED [NUM_POSTS]   # a run's output_dir (its adapters/)
    python experiments/training/tldr_texts/show_team_texts.py untrained SEED [NUM_POSTS]    # the base model with fresh adapters
"""

from __future__ import annotations

import sys

from transformers import GenerationConfig

from trl_multiagent.environments.writing import TLDREnv
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

AGENTS = ("summary", "elaboration")


def main(argv: list[str]) -> int:
    run, seed = argv[0], int(argv[1])
    num = int(argv[2]) if len(argv) > 2 else 3
    if run == "untrained":
        pool = AgentPool([AgentSpec(a, model="smollm2-135m-instruct", quantization="4bit", lora_r=16, lora_alpha=32)
                          for a in AGENTS])
    else:
        pool = AgentPool.from_pretrained(run)
    config = GenerationConfig(max_new_tokens=40, do_sample=False)
    for task in TLDREnv.make_rows(num, seed=seed, split="eval"):
        env = TLDREnv()
        prompts = env.reset(task)
        first, second = (g[0].text for g in pool.generate_many([GenerationRequest(a, prompts[a]) for a in AGENTS],
                                                                 config))
        reward = env.reward_fn(first, second, weights=env.reward_weights)
        print(f"post: {task['prompt'][:150]!r}...\nsummary: {first!r}\nelaboration: {second!r}\n"
              f"reward: {reward.total:.3f} {dict((k, round(v, 3)) for k, v in reward.levels.items())}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
