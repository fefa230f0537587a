"""Print what a trained search team writes: greedy outputs of the Rewriter, Reranker and Answerer on the first
held-out questions of a seed, with what the retriever found and the answer's F1 (for reading a result, not for
scoring one).

    python experiments/training/search_qa_mhgpo/show_texts.py OUTPUT_DIR SEED [NUM]   # a run's output_dir (its adapters/)
    python experiments/training/search_qa_mhgpo/show_texts.py untrained SEED [NUM]    # the base model, a fresh adapter
"""

from __future__ import annotations

import json
import sys

from transformers import GenerationConfig

from trl_multiagent.environments.search_qa import ANSWERER, RERANKER, RETRIEVER, REWRITER, SearchQAEnv, extract_answer
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

#: The small recipe's environment settings (recipes/configs/search_qa_mhgpo_small.yaml).
ENV_KWARGS = {"top_k": 2, "max_queries": 4, "max_candidates": 3, "max_selected": 2, "max_answer_words": 10}


def main(argv: list[str]) -> int:
    run, seed = argv[0], int(argv[1])
    num = int(argv[2]) if len(argv) > 2 else 4
    env = SearchQAEnv(**ENV_KWARGS)
    if run == "untrained":
        pool = AgentPool([AgentSpec(a, model="smollm2-135m-instruct", lora_r=16, lora_alpha=32, policy="shared")
                          for a in env.agents])
    else:
        pool = AgentPool.from_pretrained(run)
    config = GenerationConfig(max_new_tokens=16, do_sample=False)
    for task in SearchQAEnv.make_dataset(num, seed=seed, split="eval"):
        outputs: dict[str, str] = {}
        for name in env.graph().order:
            inputs = {p: outputs[p] for p in env.graph().predecessors[name]}
            if name == RETRIEVER:
                outputs[name] = env.run_tool(name, task, inputs)
            else:
                request = GenerationRequest(name, env.prompt(name, task, inputs))
                outputs[name] = pool.generate_many([request], config)[0][0].text
        candidates = json.loads(outputs[RETRIEVER])
        titles = [task["passages"][p]["title"] for p in candidates]
        chosen = [task["passages"][p]["title"] for p in env.selected(outputs[RERANKER], candidates)]
        print(f"question: {task['question']!r} (gold: {task['answer']!r}; gold passages {task['gold_titles']})\n"
              f"rewriter: {outputs[REWRITER]!r}\nretrieved: {titles}\nreranker: {outputs[RERANKER]!r} -> {chosen}\n"
              f"answerer: {outputs[ANSWERER]!r} -> {extract_answer(outputs[ANSWERER])!r}, "
              f"F1 {env.final_reward(task, outputs):.3f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
