"""Train the multi-agent search system (Rewriter -> retriever -> Reranker -> Answerer) with MHGPO; accuracy, exact
match and token F1 on held-out questions before and after training.

    accelerate launch recipes/mhgpo.py --config recipes/configs/search_qa_mhgpo_fof.yaml [--field value ...]

The same runner as `python -m trl_multiagent train`; this script insists on the mhgpo trainer.
"""

import sys

from trl_multiagent.command.cli import run_recipe_script


def main(argv=None) -> int:
    return run_recipe_script(argv, __file__, expect={"trainer": "mhgpo"})


if __name__ == "__main__":
    sys.exit(main())
