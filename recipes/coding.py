"""Cooperative coding on HumanEval (aux + main) with MAGRPO, evaluated against the four baselines.

    accelerate launch recipes/coding.py --config recipes/configs/coding_demo.yaml   (cooperative HumanEval, demo size)
    accelerate launch recipes/coding.py --config recipes/configs/coding_demo.yaml --max_steps 0   (evaluation only)

The same runner as `python -m trl_multiagent train`; this script insists on the environment humaneval_aux_main.
Writes summary.json (before/after means with 95% intervals, paired gains, the gain over the best baseline),
report.md, reward_curve.png and the adapters to output_dir.
"""

import sys

from trl_multiagent.command.cli import run_recipe_script


def main(argv=None) -> int:
    return run_recipe_script(argv, __file__, expect={"environment": "humaneval_aux_main"})


if __name__ == "__main__":
    sys.exit(main())
