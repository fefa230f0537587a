"""Cooperative coding on HumanEval (aux + main) with MAGRPO, evaluated on held-out problems before and after.

    accelerate launch recipes/coding.py --config recipes/configs/demo.yaml          (the main job: make demo)
    accelerate launch recipes/coding.py --config recipes/configs/demo.yaml --max_steps 0   (evaluation only)

Writes to the config's ``output_dir``: ``summary.json`` (training summary plus before/after metrics of the trained
pair and the four baselines, with 95% bootstrap intervals), ``reward_curve.png``, ``report.md`` and the adapters.
"""

import json
import logging
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # rewards/ lives at the repo root

from trl_multiagent.environments.coding import humaneval_problems  # noqa: E402
from trl_multiagent.evaluation import EvalSettings, evaluate_coding  # noqa: E402
from trl_multiagent.recipe import RecipeError, build_trainer, finish_distributed, load_recipe  # noqa: E402
from trl_multiagent.reporting import plot_reward_curve, write_coding_report  # noqa: E402
from trl_multiagent.utils import import_object  # noqa: E402

logger = logging.getLogger("recipes.coding")


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    try:
        recipe, config = load_recipe(argv)
        if recipe.environment != "humaneval_aux_main":
            raise RecipeError(f"recipes/coding.py runs environment humaneval_aux_main, not {recipe.environment!r}")
        trainer = build_trainer(recipe, config)
    except RecipeError as exc:
        logger.error("%s", exc)
        return 2
    env = trainer.environment_factory()
    problems = humaneval_problems("test", cooperative=True)
    if recipe.eval_num_problems:
        problems = problems[: recipe.eval_num_problems]
    settings = EvalSettings(num_samples=recipe.eval_num_samples, max_new_tokens=recipe.eval_max_new_tokens,
                            temperature=config.temperature, top_p=config.top_p, seed=config.seed,
                            methods=tuple(recipe.eval_methods))
    reward_fn = import_object(env.reward_fn, "reward_fn")
    is_main = trainer.accelerator.is_main_process

    def progress(stage):
        return lambda method: logger.info("Evaluating %s (%s) on %d held-out problems", method, stage, len(problems))

    reuse = (recipe.eval_team_before_is_naive and env.max_turns == 1 and not config.resume_from_checkpoint
             and {"team", "naive"} <= set(settings.methods))
    before_methods = tuple(m for m in settings.methods if not (reuse and m == "team"))
    before = evaluate_coding(trainer.pool, problems, EvalSettings(**{**settings.__dict__, "methods": before_methods}),
                             reward_fn, env.sandbox, env.max_turns, progress(stage="before training")) if is_main else {}
    if reuse and is_main:
        before = {"team": before["naive"], **before}
    if config.max_steps != 0:
        trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    after = {}
    if is_main and "team" in settings.methods and config.max_steps != 0:
        after = evaluate_coding(trainer.pool, problems, EvalSettings(**{**settings.__dict__, "methods": ("team",)}),
                                reward_fn, env.sandbox, env.max_turns, progress(stage="after training"))
    if not is_main:
        finish_distributed()
        return 0
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() and config.max_steps != 0 else {}
    summary["evaluation"] = {
        "held_out_problems": [p["task_id"] for p in problems],
        "num_samples": settings.num_samples,
        "max_new_tokens": settings.max_new_tokens,
        "team_before_is_naive": bool(reuse),
        "before": {m: {"metrics": r.metrics, "ci95": r.intervals} for m, r in before.items()},
        "after": {m: {"metrics": r.metrics, "ci95": r.intervals} for m, r in after.items()},
    }
    summary["command"] = "accelerate launch recipes/coding.py " + " ".join(sys.argv[1:] if argv is None else argv)
    summary["wall_time_s"] = time.perf_counter() - start
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    plot_reward_curve(out / "metrics.jsonl", out / "reward_curve.png")
    write_coding_report(summary, out / "report.md")
    logger.info("Wrote %s, %s and %s", summary_path, out / "reward_curve.png", out / "report.md")
    finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
