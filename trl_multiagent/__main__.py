"""``python -m trl_multiagent train --config recipe.yaml [--field value ...]`` (also under ``accelerate launch -m``);
``python -m trl_multiagent train-verifier --config recipe.yaml``: MAPoRL's learned verifier."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
