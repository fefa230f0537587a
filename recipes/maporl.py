"""Train a debating team with MAPoRL (maporl); majority vote per turn, transitions and each agent alone on
held-out tasks before and after training.

    accelerate launch recipes/maporl.py --config recipes/configs/math_debate.yaml [--field value ...]

The same runner as `python -m trl_multiagent train`; this script insists on the maporl trainer.
"""

import sys

from trl_multiagent.command.cli import run_recipe_script


def main(argv=None) -> int:
    return run_recipe_script(argv, __file__, expect={"trainer": "maporl"})


if __name__ == "__main__":
    sys.exit(main())
