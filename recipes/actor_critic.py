"""Train a team with CoLLM-CC / CoLLM-DC (or any trainer of the registry, e.g. MAGRPO for a comparison) and measure
greedy single-path episodes on held-out tasks before and after training.

    accelerate launch recipes/actor_critic.py --config recipes/configs/strbuild_cc.yaml [--field value ...]

Writes ``summary.json`` to the ``output_dir``: the training summary plus ``evaluation.before`` / ``evaluation.after``
(the mean final-state metrics of the environment, e.g. IoU and same-texture adjacency for StrBuild, and the mean
return), the number of generated samples, the wall time and the command.
"""

import json
import logging
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # rewards/ lives at the repo root

from trl_multiagent.recipe import (  # noqa: E402
    RecipeError,
    build_trainer,
    finish_distributed,
    held_out_tasks,
    load_recipe,
)
from trl_multiagent.rollout import evaluate_episodes  # noqa: E402

logger = logging.getLogger("recipes.actor_critic")


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        recipe, config = load_recipe(argv)
        tasks = list(held_out_tasks(recipe, config, recipe.eval_num_problems or 8))
        trainer = build_trainer(recipe, config)
    except RecipeError as exc:
        logger.error("%s", exc)
        return 2

    def measure(stage):
        logger.info("Greedy episodes on %d held-out tasks (%s)", len(tasks), stage)
        return evaluate_episodes(trainer.pool, trainer.environment_factory, tasks, config.num_turns,
                                 recipe.eval_max_new_tokens)

    generated = []  # samples generated for training (this process), counted at every rollout
    rollout = trainer.sampler.rollout

    def counting_rollout(*args, **kwargs):
        experience = rollout(*args, **kwargs)
        generated.append(int(experience.stats["num_generations"]))
        return experience

    is_main = trainer.accelerator.is_main_process
    before = measure("before training") if is_main else {}
    trainer.sampler.rollout = counting_rollout
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    trainer.sampler.rollout = rollout
    after = measure("after training") if is_main else {}
    if is_main:
        path = Path(config.output_dir) / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        summary["generated_samples"] = {"total": sum(generated), "rollouts": len(generated),
                                        "processes": trainer.accelerator.num_processes}
        summary["evaluation"] = {"held_out_tasks": len(tasks), "before": before, "after": after}
        summary["command"] = "accelerate launch recipes/actor_critic.py " + " ".join(argv)
        summary["wall_time_s"] = time.perf_counter() - start
        path.write_text(json.dumps(summary, indent=2, default=str))
        logger.info("return before %.3f, after %.3f (%s)", before["return"], after["return"], path)
    finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
