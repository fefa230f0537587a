"""Train a debating team with MAPoRL (DebatePPOTrainer) and measure it on held-out tasks before and after training.

    accelerate launch recipes/debate.py --config recipes/configs/math_debate.yaml [--field value ...]

For a debate environment (``math_debate``, ``nli_debate``) the measurements are those of MAPoRL Sec. 4
(:func:`trl_multiagent.debate_evaluation.evaluate_debate`): the majority-vote accuracy at every turn (ties scored by
the expected accuracy of a uniform pick among the tied answers), the transition fractions between turns (right ->
wrong, wrong -> right, ...), and every agent's accuracy answering alone (turn 1). For any other environment (the
collaborate-or-act-alone game) they are the means of the environment's per-turn ``info`` values and rewards.

The held-out tasks (:func:`trl_multiagent.recipe.held_out_tasks`): the environment's generated ``test`` split for
``dataset: generated``; for a hub dataset, its ``eval_dataset_split`` (GSM8K ``test``, ANLI ``test_r1``).

Writes ``summary.json`` to the ``output_dir``: the training summary plus ``evaluation.before`` /
``evaluation.after``, the command and the wall time.
"""

import json
import logging
import math
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # rewards/ lives at the repo root

from transformers import GenerationConfig  # noqa: E402

from trl_multiagent.debate_evaluation import evaluate_debate  # noqa: E402
from trl_multiagent.environments import DebateEnv  # noqa: E402
from trl_multiagent.recipe import (  # noqa: E402
    RecipeError,
    build_trainer,
    finish_distributed,
    held_out_tasks,
    load_recipe,
)
from trl_multiagent.rollout import DebateSampler  # noqa: E402

logger = logging.getLogger("recipes.debate")


def game_metrics(trainer, tasks, num_turns: int, max_new_tokens: int, temperature: float) -> dict:
    """Means of the environment's per-turn rewards and ``info`` values over one episode per task."""
    generation = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                                  temperature=temperature if temperature > 0 else None,
                                  **(trainer.args.generation_kwargs or {}))
    debates = DebateSampler(num_turns=num_turns).run(trainer.pool, trainer.environment_factory, tasks, generation)
    out = {"num_episodes": len(debates)}
    for t in range(num_turns):
        played = [d for d in debates if d.turns_played > t]
        if not played:
            continue
        out[f"turn{t + 1}/team_reward"] = sum(d.team_rewards[t] for d in played) / len(played)
        for key in played[0].infos[t]:
            values = [d.infos[t][key] for d in played if key in d.infos[t]]
            out[f"turn{t + 1}/{key}"] = sum(values) / len(values) if values else math.nan
    return out


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        recipe, config = load_recipe(argv)
        if recipe.trainer != "debate_ppo":
            raise RecipeError(f"recipes/debate.py runs the debate_ppo trainer, got trainer: {recipe.trainer}")
        tasks = list(held_out_tasks(recipe, config, recipe.eval_num_problems or 32))
        trainer = build_trainer(recipe, config)
    except RecipeError as exc:
        logger.error("%s", exc)
        return 2
    is_debate = isinstance(trainer.environment_factory(), DebateEnv)

    def measure(stage):
        logger.info("Evaluating on %d held-out tasks (%s)", len(tasks), stage)
        if is_debate:
            return evaluate_debate(trainer.pool, trainer.environment_factory, tasks, config.num_turns,
                                   recipe.eval_max_new_tokens, temperature=config.temperature, top_p=config.top_p,
                                   num_debates=max(1, recipe.eval_num_samples))
        return game_metrics(trainer, tasks, config.num_turns, recipe.eval_max_new_tokens, config.temperature)

    is_main = trainer.accelerator.is_main_process
    before = measure("before training") if is_main else {}
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    after = measure("after training") if is_main else {}
    if is_main:
        path = Path(config.output_dir) / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else {}
        summary["debate"] = {k: getattr(config, k) for k in (
            "num_turns", "reward_mode", "gamma", "alpha0", "alpha1", "beta0", "beta1", "verifier", "kl_coef",
            "vf_coef", "cliprange_value", "gae_gamma", "gae_lambda", "num_iterations", "value_head_per_turn")}
        summary["evaluation"] = {"held_out_tasks": len(tasks), "before": before, "after": after}
        summary["command"] = "accelerate launch recipes/debate.py " + " ".join(argv)
        summary["wall_time_s"] = time.perf_counter() - start
        path.write_text(json.dumps(summary, indent=2, default=str))
        if is_debate:
            logger.info("majority accuracy per turn before %s, after %s (%s)", before["majority_accuracy"],
                        after["majority_accuracy"], path)
        else:
            logger.info("evaluation before %s, after %s (%s)", before, after, path)
    finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
