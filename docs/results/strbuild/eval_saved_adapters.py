"""Greedy held-out evaluation of the MAGRPO StrBuild run's saved adapters, before (fresh adapters = the base model)
and after training: the same 4 held-out tasks, settings and function (`evaluate_episodes`) as
recipes/actor_critic.py, whose own process was stopped during its after-training evaluation.

    .venv/bin/python docs/results/strbuild/eval_saved_adapters.py   # reads outputs/strbuild_magrpo/adapters
"""

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from trl_multiagent.agents import AgentPool, AgentSpec  # noqa: E402
from trl_multiagent.environments.minecraft import StrBuildEnv  # noqa: E402
from trl_multiagent.rollout import evaluate_episodes  # noqa: E402

KEYS = ("iou", "adjacency", "coverage", "return", "rejected", "accepted")


def factory():
    return StrBuildEnv(max_turns=4, prompt_style="compact", max_commands=16)


def main():
    torch.set_num_threads(2)
    tasks = list(StrBuildEnv.make_dataset(num_tasks=4, seed=0, split="eval"))
    pool = AgentPool([AgentSpec(a, model="smollm2-135m-instruct", lora_r=16, lora_alpha=32)
                      for a in ("player1", "player2")])
    out = {"tasks": [t["text"] for t in tasks]}
    for stage in ("before", "after"):
        if stage == "after":
            pool.load_adapters("outputs/strbuild_magrpo")
        start = time.perf_counter()
        out[stage] = evaluate_episodes(pool, factory, tasks, 4, 32)
        out[f"{stage}_s"] = time.perf_counter() - start
        print(stage, {k: out[stage][k] for k in KEYS}, flush=True)
    Path("docs/results/strbuild/magrpo_eval.json").write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
