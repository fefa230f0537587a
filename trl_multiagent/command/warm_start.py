"""``init_adapters``: a new run that starts from a saved team's adapters (a warm start).

Two ways continue from a saved team, and they differ in what they carry over:

* ``resume_from_checkpoint: <output_dir>/checkpoint-N`` (or ``true``): the SAME run, exactly: adapters, optimizer
  state, learning-rate schedule, global step, random state and data order; ``max_steps`` counts from the run's start.
  It needs a checkpoint (a run writes them with ``save_strategy: steps``; the main job writes one when it ends).
* ``init_adapters: <output_dir or checkpoint-N>``: a NEW run whose team starts from the saved adapters: a new
  optimizer and schedule, global step 0, ``max_steps`` more steps, the held-out evaluation "before" scoring the
  loaded team. It needs only ``adapters/`` (every finished run's output_dir has it, and every checkpoint).

:func:`check_init_adapters` checks, before any model loads, that the saved team fits the recipe's (the same agents,
policies, base models and LoRA shapes; every adapter file there) and that the two ways are not both asked for;
:func:`load_init_adapters` loads the adapters into the trainer's freshly built team and logs the warm start.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from trl_multiagent.errors import RecipeError

logger = logging.getLogger(__name__)

#: The fields of an agent that decide whether a saved adapter fits it.
FITTING_FIELDS = ("policy", "model_name", "lora_r", "lora_alpha", "lora_target_modules")


def check_init_adapters(path: str, specs: Sequence, resume_from_checkpoint=None) -> Path:
    """The folder of the saved team named by ``init_adapters``, checked against the team ``specs`` (see the module
    docstring); every problem is one :class:`~trl_multiagent.errors.RecipeError` that names the way on."""
    from trl_multiagent.command.saved_team import TEAM_FILE
    from trl_multiagent.team.pool import AgentSpec

    if resume_from_checkpoint:
        raise RecipeError(f"init_adapters {path!r} and resume_from_checkpoint {resume_from_checkpoint!r} are two ways "
                          "to continue a saved team; give one: resume_from_checkpoint continues that run exactly "
                          "(optimizer, schedule, step), init_adapters starts a new run from its adapters")
    folder = Path(path)
    if not folder.is_dir():
        raise RecipeError(f"init_adapters {path!r} does not exist (or is not a directory): give the output_dir of a "
                          "finished run or one of its checkpoint-N folders")
    team_file = folder / TEAM_FILE
    if not team_file.is_file():
        checkpoints = sorted(p.name for p in folder.glob("checkpoint-*") if (p / TEAM_FILE).is_file())
        hint = f"; its checkpoints {checkpoints} have one" if checkpoints else ""
        raise RecipeError(f"init_adapters {path!r} holds no saved team (no {TEAM_FILE}){hint}")
    try:
        saved = [AgentSpec(**a) for a in json.loads(team_file.read_text())["agents"]]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise RecipeError(f"init_adapters: {team_file} does not describe a team ({type(exc).__name__}: {exc})") from exc
    mine = {s.name: s for s in specs}
    theirs = {s.name: s for s in saved}
    if sorted(mine) != sorted(theirs):
        raise RecipeError(f"init_adapters {path!r} holds the agents {sorted(theirs)}, the recipe's team is "
                          f"{sorted(mine)}")
    for name, spec in mine.items():
        for key in FITTING_FIELDS:
            want, have = getattr(spec, key), getattr(theirs[name], key)
            if want != have:
                raise RecipeError(f"init_adapters {path!r}: agent {name!r} was saved with {key} {have!r}, the recipe "
                                  f"gives it {want!r}; the adapters fit only the same {key} (set it as saved)")
    for policy in sorted({s.policy for s in specs}):
        if not (folder / "adapters" / policy / "adapter_model.safetensors").is_file():
            raise RecipeError(f"init_adapters {path!r} has no adapter of the policy {policy!r} "
                              f"(adapters/{policy}/adapter_model.safetensors is missing)")
    return folder


def load_init_adapters(trainer, path: str) -> None:
    """Load the saved adapters (and critics) of ``path`` into ``trainer``'s team before it trains, and say so."""
    try:
        trainer.pool.load_adapters(path)
    except (FileNotFoundError, RuntimeError) as exc:
        raise RecipeError(f"init_adapters {path!r}: {exc}") from exc
    logger.info("init_adapters: a warm start from %s: the adapters of %s are loaded; the optimizer and learning-rate "
                "schedule are new and the global step starts at 0 (resume_from_checkpoint would continue that run "
                "exactly instead)", path, ", ".join(sorted(trainer.pool.policies)))
