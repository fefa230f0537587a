"""``python -m trl_multiagent train --config recipe.yaml [--field value ...]`` (also under ``accelerate launch -m``);
``python -m trl_multiagent train-verifier --config recipe.yaml``: MAPoRL's learned verifier;
``python -m trl_multiagent evaluate --team <output_dir>``: a saved team on held-out tasks. The console script
``trl-multiagent`` runs the same commands."""

import sys

from trl_multiagent.command.cli import main

if __name__ == "__main__":
    sys.exit(main())
