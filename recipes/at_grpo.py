"""Train a team with AT-GRPO (or MAGRPO) on a task with a success checker, and measure the greedy success rate on
held-out instances before and after training.

    accelerate launch recipes/at_grpo.py --config recipes/configs/plan_path_at_grpo_specialized.yaml

Writes ``summary.json`` (training summary plus ``evaluation.before`` / ``evaluation.after``) to the ``output_dir``.
"""

import json
import logging
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # rewards/ lives at the repo root

from trl_multiagent.evaluation import success_rate  # noqa: E402
from trl_multiagent.recipe import (  # noqa: E402
    RecipeError,
    build_trainer,
    finish_distributed,
    held_out_tasks,
    load_recipe,
)

logger = logging.getLogger("recipes.at_grpo")


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    try:
        recipe, config = load_recipe(argv)
        tasks = list(held_out_tasks(recipe, config, recipe.eval_num_problems or 32))
        trainer = build_trainer(recipe, config)
    except RecipeError as exc:
        logger.error("%s", exc)
        return 2
    order = config.agent_order if getattr(trainer.environment_factory(), "supports_partial_actions", False) \
        else "parallel"

    def measure(stage):
        logger.info("Greedy success rate on %d held-out instances (%s)", len(tasks), stage)
        return success_rate(trainer.pool, trainer.environment_factory, tasks, config.num_turns,
                            recipe.eval_max_new_tokens, agent_order=order)

    is_main = trainer.accelerator.is_main_process
    before = measure("before training") if is_main else {}
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    after = measure("after training") if is_main else {}
    if is_main:
        path = Path(config.output_dir) / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        summary["evaluation"] = {"held_out_instances": len(tasks), "before": before, "after": after}
        summary["command"] = "accelerate launch recipes/at_grpo.py " + " ".join(sys.argv[1:] if argv is None else argv)
        summary["wall_time_s"] = time.perf_counter() - start
        path.write_text(json.dumps(summary, indent=2, default=str))
        logger.info("success rate before %.3f, after %.3f (%s)", before["success_rate"], after["success_rate"], path)
    finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
