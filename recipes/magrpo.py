"""Train a team with MAGRPO (`trainer: magrpo`; any trainer of the registry works) from a YAML recipe.

    accelerate launch recipes/magrpo.py --config recipes/configs/matrix_game.yaml [--field value ...]

The same runner as `python -m trl_multiagent train` (see `--help`); this script insists on the magrpo trainer (a
recipe of another trainer is refused before anything loads: run it with its own script or the module command).
Evaluation before and after training where the environment has held-out tasks, then summary.json, report.md and
reward_curve.png in output_dir.
`--resume_from_checkpoint <output_dir>/checkpoint-N` resumes a run from one of its checkpoints.
"""

import sys

from trl_multiagent.command.cli import run_recipe_script


def main(argv=None) -> int:
    return run_recipe_script(argv, __file__, expect={"trainer": "magrpo"})


if __name__ == "__main__":
    sys.exit(main())
