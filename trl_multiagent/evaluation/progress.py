"""A rich progress bar for evaluations: generated sequences of the stage, elapsed time and time left.

The bar's total is an upper bound of the stage's sequences (every episode playing every turn); when the stage ends
earlier (episodes that finish early), the bar is completed. Where the pool's ``generate_many`` reports progress
inside one call, the bar moves with it; otherwise it moves after each round's call.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from trl_multiagent.runtime.process import progress_bar

logger = logging.getLogger(__name__)


class EvalProgress:
    """Progress of an evaluation's stages; ``enabled=False`` logs one line per stage instead of drawing a bar."""

    def __init__(self, enabled: bool = True, description: str = "evaluation"):
        self.enabled, self.description = enabled, description

    @contextlib.contextmanager
    def stage(self, name: str, total: int) -> Iterator[Callable[[int], None]]:
        """A bar for one stage; yields ``advance(num_sequences)``."""
        start = time.perf_counter()
        logger.info("%s (%s): up to %d sequences to generate", self.description, name, total)
        if not self.enabled:
            yield lambda n: None
            logger.info("%s (%s) done in %.0f s", self.description, name, time.perf_counter() - start)
            return
        with progress_bar("{task.description}", "seqs", transient=False) as bar:
            task = bar.add_task(f"{self.description} {name}", total=max(1, total))
            yield lambda n: bar.advance(task, n)
            bar.update(task, completed=max(1, total))
        logger.info("%s (%s) done in %.0f s", self.description, name, time.perf_counter() - start)
