"""Train a debating team with MAPoRL (debate_ppo); majority vote per turn, transitions and each agent alone on
held-out tasks before and after training.

    accelerate launch recipes/debate.py --config recipes/configs/math_debate.yaml [--field value ...]

The same runner as `python -m trl_multiagent train`; this script insists on the debate_ppo trainer.
"""

import sys

from trl_multiagent.command.cli import run_recipe_script


def main(argv=None) -> int:
    return run_recipe_script(argv, __file__, expect={"trainer": "debate_ppo"})


if __name__ == "__main__":
    sys.exit(main())
