"""Train the multi-agent search system (Rewriter -> retriever -> Reranker -> Answerer) with MHGPO, and measure
accuracy, exact match and token F1 of its answers on held-out questions before and after training.

    accelerate launch recipes/mhgpo.py --config recipes/configs/search_qa_mhgpo_fof.yaml [--field value ...]

Held-out questions: for ``dataset: generated``, the environment's ``eval`` split (a separate random stream); for a
hub dataset, its ``eval_dataset_split`` (``validation`` in the hub configs) through the same ``dataset_transform``. ``eval_num_problems`` of them (64 when
0), answered with greedy decoding, ``eval_max_new_tokens`` tokens per agent. Writes ``summary.json`` (training summary
plus ``evaluation.before`` / ``evaluation.after`` and the command) to the ``output_dir``.
"""

import json
import logging
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # rewards/ lives at the repo root

from transformers import GenerationConfig  # noqa: E402

from trl_multiagent.recipe import (  # noqa: E402
    RecipeError,
    build_trainer,
    finish_distributed,
    held_out_tasks,
    load_recipe,
)
from trl_multiagent.rollout.pipeline import evaluate_pipeline  # noqa: E402

logger = logging.getLogger("recipes.mhgpo")

DEFAULT_EVAL_QUESTIONS = 64


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        recipe, config = load_recipe(argv)
        if recipe.trainer != "mhgpo":
            raise RecipeError(f"recipes/mhgpo.py runs trainer 'mhgpo', the recipe names {recipe.trainer!r}")
        tasks = list(held_out_tasks(recipe, config, recipe.eval_num_problems or DEFAULT_EVAL_QUESTIONS))
        trainer = build_trainer(recipe, config)
    except RecipeError as exc:
        logger.error("%s", exc)
        return 2
    greedy = GenerationConfig(max_new_tokens=recipe.eval_max_new_tokens, do_sample=False)
    env = trainer.environment_factory()

    def measure(stage):
        logger.info("Greedy pipeline on %d held-out questions (%s)", len(tasks), stage)
        trainer.pool.eval()
        result = evaluate_pipeline(trainer.pool, env, tasks, greedy)
        trainer.pool.train()
        return result

    is_main = trainer.accelerator.is_main_process
    before = measure("before training") if is_main else {}
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    after = measure("after training") if is_main else {}
    if is_main:
        path = Path(config.output_dir) / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        summary["config"].update({k: getattr(config, k) for k in ("sampling", "fork_probabilities",
                                                                  "reward_aggregation", "agent_loss_weighting")})
        summary["evaluation"] = {"held_out_questions": len(tasks), "decoding": "greedy",
                                 "max_new_tokens": recipe.eval_max_new_tokens, "before": before, "after": after}
        summary["command"] = "accelerate launch recipes/mhgpo.py " + " ".join(argv)
        summary["wall_time_s"] = time.perf_counter() - start
        path.write_text(json.dumps(summary, indent=2, default=str))
        logger.info("EM %.3f -> %.3f, F1 %.3f -> %.3f (%s)", before["em"], after["em"], before["f1"], after["f1"],
                    path)
    finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
