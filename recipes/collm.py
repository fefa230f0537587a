"""Train a team with CoLLM-CC / CoLLM-DC; greedy episodes on held-out tasks before and after training (final-state
metrics such as IoU, and the return).

    accelerate launch recipes/collm.py --config recipes/configs/strbuild_cc.yaml [--field value ...]

The same runner as `python -m trl_multiagent train` (see `--help`); this script insists on the collm trainer.
"""

import sys

from trl_multiagent.command.cli import run_recipe_script


def main(argv=None) -> int:
    return run_recipe_script(argv, __file__, expect={"trainer": "collm"})


if __name__ == "__main__":
    sys.exit(main())
