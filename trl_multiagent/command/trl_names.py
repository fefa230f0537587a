"""TRL's names in a recipe and on the command line: taken as this library's fields where they mean the same, refused
with this library's name in one line where they do not.

A recipe ported from a TRL script (``trl grpo --config ...``: TRL's ``ScriptArguments`` and ``ModelConfig`` beside the
``GRPOConfig``) names the model, the data and the reward functions as TRL does. The config fields are this library's
already (every trainer config extends ``GRPOConfig``); the others are translated here before the recipe is checked:

* :data:`ALIASES`, the same meaning under another name: ``model_name_or_path`` is ``model``, ``dataset_name`` is
  ``dataset``, ``dataset_train_split`` is ``dataset_split``, ``dataset_test_split`` is ``eval_dataset_split`` and
  ``dtype`` is ``model_dtype``. Giving both names is an error.
* ``reward_funcs`` (``GRPOTrainer``'s argument, ``trl grpo``'s field): the environment's TRL reward functions, moved
  into ``env_kwargs`` under the name the environment gives them (:func:`move_reward_funcs`: ``FunctionEnvironment``'s
  ``reward_funcs``, ``TRLEnvironmentTeam``'s ``reward_fns``, declared by the class attribute
  ``trl_reward_funcs_argument``); an environment with rewards of its own refuses them in one line.
* ``use_peft: true`` and ``load_in_4bit`` (:data:`FLAGS`): true is what a team does anyway (every agent trains a LoRA
  adapter) or ``quantization: 4bit``; ``use_peft: false`` is refused.
* :data:`REFUSED`: TRL names with no field of that meaning here, each refused with the library's way to say it.

The module imports neither torch nor TRL, so that the command line answers from the recipe fields' file
(:mod:`~trl_multiagent.command.recipe_fields`) with the translation applied.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from trl_multiagent.errors import RecipeError

logger = logging.getLogger(__name__)
_said: set[tuple[str, str]] = set()  # (source, TRL name) already logged: the command line parses a recipe twice

#: Trainers' earlier names, before each trainer got one name for its module, config, docs page and recipes: a recipe,
#: a command line or a saved team's recorded recipe that uses one gets the current name, with a warning.
RENAMED_TRAINERS = {"debate_ppo": "maporl", "actor_critic": "collm"}


#: TRL's name -> this library's field of the same meaning.
ALIASES = {
    "model_name_or_path": "model",
    "dataset_name": "dataset",
    "dataset_train_split": "dataset_split",
    "dataset_test_split": "eval_dataset_split",
    "dtype": "model_dtype",
}
#: TRL's boolean fields whose true value this library has a way to say (``None``: true is what it does anyway).
FLAGS = {"use_peft": None, "load_in_4bit": ("quantization", "4bit")}
#: TRL's names with no field of that meaning here -> what to write instead.
REFUSED = {
    "load_in_8bit": "the bases load in full precision or in 4 bits (quantization: 4bit)",
    "lora_dropout": "it is set per agent: agents: [{name: ..., lora_dropout: 0.05}, ...]",
    "lora_target_modules": "it is set per agent: agents: [{name: ..., lora_target_modules: [q_proj, v_proj]}, ...]",
    "torch_dtype": "model_dtype (the bases' dtype)",
    "model_revision": "model takes a hub id or a local checkpoint directory (download the revision and name its "
                      "directory)",
}
#: Every TRL name this module translates or refuses.
TRL_NAMES = frozenset({*ALIASES, *FLAGS, *REFUSED, "reward_funcs"})


def _flag(key: str, value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise RecipeError(f"{source}: '{key}' expects true/false, got {value!r}")


def translate(values: Mapping[str, Any], source: str) -> tuple[dict[str, Any], Any]:
    """``(values with TRL's names translated, the reward_funcs given or None)``; a refused name, or a TRL name given
    beside this library's, is one :class:`~trl_multiagent.errors.RecipeError` naming ``source``."""
    out = {k: v for k, v in values.items() if k not in TRL_NAMES}
    for key, value in values.items():
        if key in ALIASES:
            ours = ALIASES[key]
            if ours in values:
                raise RecipeError(f"{source}: '{key}' is TRL's name of '{ours}'; give one of them, not both")
            out[ours] = value
            if (source, key) not in _said:
                _said.add((source, key))
                logger.info("%s: %s (TRL's name) taken as %s", source, key, ours)
        elif key in FLAGS:
            on = _flag(key, value, source)
            if key == "use_peft" and not on:
                raise RecipeError(f"{source}: use_peft: false asks for full fine-tuning, which this library does not "
                                  "do: every agent trains its own LoRA adapter (lora_r, lora_alpha); leave use_peft "
                                  "out")
            if on and FLAGS[key] is not None:
                ours, meant = FLAGS[key]
                if values.get(ours, meant) != meant:
                    raise RecipeError(f"{source}: {key}: true is {ours}: {meant}, but {ours} is {values[ours]!r}; "
                                      "give one")
                out[ours] = meant
        elif key in REFUSED:
            raise RecipeError(f"{source}: '{key}' is TRL's field; here {REFUSED[key]}")
    return out, values.get("reward_funcs")


def split_argv(argv: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """``(argv without TRL's names, {TRL name: raw value})``: ``--name value``, ``--name=value``, ``--name`` alone
    (true, for a flag) or several values (``--reward_funcs accuracy_reward my.py:short``, a list)."""
    rest: list[str] = []
    found: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        key = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else None
        if key not in TRL_NAMES:
            rest.append(token)
            i += 1
            continue
        if "=" in token:
            found[key] = token.split("=", 1)[1]
            i += 1
            continue
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        given = list(argv[i + 1:j])
        found[key] = "true" if not given else given[0] if len(given) == 1 else given
        i = j
    return rest, found


def check_reward_funcs(funcs: Any, source: str) -> Any:
    """``reward_funcs`` as given: a list of specs (a bare ``trl.rewards`` name, ``"module:function"`` or
    ``"path/to/file.py:function"``), or ``{agent: [specs]}``; JSON text (the command line) is read first."""
    import json

    if isinstance(funcs, str):
        text = funcs.strip()
        if text.startswith(("[", "{")):
            try:
                funcs = json.loads(text)
            except json.JSONDecodeError as exc:
                raise RecipeError(f"{source}: 'reward_funcs' expects JSON, got {funcs!r} ({exc.msg})") from exc
        else:
            funcs = [funcs]
    def specs(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(s, str) and s for s in x)

    if not (specs(funcs) or (isinstance(funcs, dict) and funcs and all(
            isinstance(a, str) and specs(v if isinstance(v, list) else [v]) for a, v in funcs.items()))):
        raise RecipeError(f"{source}: 'reward_funcs' expects a list of reward functions (accuracy_reward, "
                          f"'module:function', 'path/to/file.py:function') or {{agent: [functions]}}, got {funcs!r}")
    return funcs


def move_reward_funcs(recipe, funcs: Any, source: str) -> None:
    """Put TRL's ``reward_funcs`` into ``recipe.env_kwargs`` under the environment's own argument for TRL reward
    functions (its ``trl_reward_funcs_argument``); refused in one line for an environment without one, or when
    ``env_kwargs`` names them too."""
    from trl_multiagent.command.recipe import resolve_environment

    env_cls = resolve_environment(recipe.environment)
    argument = getattr(env_cls, "trl_reward_funcs_argument", None)
    if argument is None:
        raise RecipeError(f"{source}: reward_funcs: {env_cls.__name__} scores with rewards of its own and takes "
                          "no TRL reward functions; TRL reward functions score agents in environment: "
                          "trl_multiagent.environments:FunctionEnvironment (env_kwargs.reward_funcs) or "
                          "trl_multiagent.environments:TRLEnvironmentTeam (env_kwargs.reward_fns)")
    if argument in recipe.env_kwargs:
        raise RecipeError(f"{source}: reward_funcs and env_kwargs.{argument} both name {env_cls.__name__}'s TRL "
                          "reward functions; give one")
    recipe.env_kwargs = {**recipe.env_kwargs, argument: funcs}
    logger.info("%s: reward_funcs (TRL's name) given to %s as env_kwargs.%s", source, env_cls.__name__, argument)


__all__ = ["ALIASES", "FLAGS", "REFUSED", "TRL_NAMES", "check_reward_funcs", "move_reward_funcs", "split_argv",
           "translate"]
