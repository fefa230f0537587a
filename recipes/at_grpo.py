"""Train a team with AT-GRPO on a task with a success checker; greedy success rate on held-out instances
before and after training.

    accelerate launch recipes/at_grpo.py --config recipes/configs/plan_path_demo.yaml

The same runner as `python -m trl_multiagent train` (see `--help`); this script insists on the at_grpo trainer.
"""

import sys

from trl_multiagent.command.cli import run_recipe_script


def main(argv=None) -> int:
    return run_recipe_script(argv, __file__, expect={"trainer": "at_grpo"})


if __name__ == "__main__":
    sys.exit(main())
