"""Train a team with MAGRPO from a YAML recipe.

    accelerate launch recipes/magrpo.py --config recipes/configs/matrix_game.yaml [--field value ...]

Any field of the recipe (trainer config or recipe arguments) can be overridden on the command line.
``--resume_from_checkpoint <output_dir>/checkpoint-N`` resumes a run from one of its checkpoints.
"""

import logging
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # rewards/ lives at the repo root

from trl_multiagent.recipe import RecipeError, build_trainer, finish_distributed, load_recipe  # noqa: E402


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        recipe, config = load_recipe(argv)
        trainer = build_trainer(recipe, config)
    except RecipeError as exc:
        logging.getLogger("recipe").error("%s", exc)
        return 2
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    finish_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
