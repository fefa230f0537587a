"""The runner's path from a parsed recipe to a trainer, for tests that build trainers from recipes."""

from __future__ import annotations

from trl_multiagent.command.runner import Run


def build_trainer(recipe, config, callbacks=None):
    """As ``python -m trl_multiagent train`` does: every check that needs no model (:meth:`Run.prepare`), then the
    trainer, which loads the models."""
    run = Run(recipe, config)
    run.prepare()
    return run.build_trainer(callbacks)
