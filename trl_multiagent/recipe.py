"""YAML recipes: one file of data -> trainer config, team, environment and dataset.

A recipe is a flat YAML mapping. Its keys are the fields of the trainer's config (every ``GRPOConfig`` field and the
multi-agent ones) and of :class:`RecipeArguments` (what to train on and with whom). The command line follows TRL's
conventions: ``--config recipe.yaml`` loads the file and ``--field value`` overrides any field
(``--learning_rate 1e-5``, ``--bf16`` for a true flag, ``--agents '[{"name": "a"}, ...]'`` as JSON for the
structured fields).

Every key and value is checked before any model loads: an unknown key, a value of the wrong type, agents that do
not match the environment's roles, or a dataset without the columns the environment needs each raise one
:class:`RecipeError` that names the problem.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .agents import AgentSpec, check_team
from .utils import import_object


class RecipeError(ValueError):
    """A recipe (YAML file or command line) that cannot be run as written."""


@dataclass
class RecipeArguments:
    """What to train: the environment, the team and the data.

    Attributes:
        trainer: which trainer runs the recipe (``"magrpo"``).
        environment: a registered environment name (see ``trl_multiagent.environments.ENVIRONMENTS``) or an import
            path ``"package.module:ClassName"``.
        env_kwargs: keyword arguments of the environment's constructor.
        agents: the team, one mapping of :class:`AgentSpec` fields per agent. Empty: one agent per role of the
            environment, each with its own policy.
        policy_mapping: ``"specialized"`` (each agent its own policy, trained on its own data only) or ``"shared"``
            (every agent that names no policy acts with one policy, ``shared``, trained on all roles' pooled data:
            AT-GRPO's role-sharing).
        model: model of every agent that names none (hub id, local path or embedded short name; empty = the
            embedded default).
        quantization: quantization of every agent that names none (``"4bit"`` for QLoRA).
        lora_r, lora_alpha: LoRA rank and alpha of every agent that names none.
        dataset: ``"generated"`` (the environment generates ``num_tasks`` tasks), a local ``.json``/``.jsonl``/
            ``.csv``/``.parquet`` file, or a hub dataset id (needs a reachable hub).
        dataset_split: split of a hub dataset.
        eval_dataset_split: held-out split of a hub dataset, used by the recipes' before/after evaluation (e.g.
            ``"test"``, ``"validation"``; for a file dataset: another data file), or ``"generated"`` to evaluate on
            the environment's generated held-out tasks. Generated datasets always use the environment's own
            held-out split.
        dataset_config: configuration (subset) name of a hub dataset.
        dataset_transform: optional ``"module:function"`` mapped over the dataset's rows (e.g. to give MBPP the
            columns of HumanEval).
        num_tasks: number of generated tasks.
        eval_num_problems: held-out problems evaluated by recipes that evaluate (0: all).
        eval_num_samples: M, samples per problem and method (the largest k of the @k metrics is at most M).
        eval_max_new_tokens: response length during evaluation.
        eval_methods: the trained team and the baselines to evaluate.
        eval_team_before_is_naive: report the naive-concatenation baseline as the team's before-training result
            instead of sampling it again. Exact in distribution for a fresh single-turn team: LoRA adapters start
            with B = 0 (the adapted model IS the base) and the team's prompts are the naive baseline's.
    """

    trainer: str = "magrpo"
    environment: str = "matrix_game"
    env_kwargs: dict = field(default_factory=dict)
    agents: list = field(default_factory=list)
    policy_mapping: str = "specialized"
    model: str | None = None
    quantization: str | None = None
    lora_r: int = 16
    lora_alpha: int = 32
    dataset: str = "generated"
    dataset_split: str = "train"
    eval_dataset_split: str | None = None
    dataset_config: str | None = None
    dataset_transform: str | None = None
    num_tasks: int = 256
    eval_num_problems: int = 0
    eval_num_samples: int = 10
    eval_max_new_tokens: int = 128
    eval_methods: list[str] = field(default_factory=lambda: ["team", "single", "naive", "sequential", "discussion"])
    eval_team_before_is_naive: bool = False


_STRUCTURED = {"env_kwargs", "agents", "generation_kwargs", "model_init_kwargs", "chat_template_kwargs"}


def _trainer_registry() -> dict[str, tuple[type, type]]:
    from .trainers import TRAINERS

    return TRAINERS


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _hints(cls) -> dict[str, Any]:
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            try:
                hints.update(typing.get_type_hints(klass))
            except Exception:  # noqa: BLE001 - some upstream annotations do not resolve; fall back to raw ones
                hints.update({f.name: f.type for f in dataclasses.fields(klass)})
    return hints


def _coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    """Check ``value`` against the type ``hint`` of field ``key``; convert strings where the type says so."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null") and type(None) in args and str not in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, arg, source)
            except RecipeError as exc:
                errors.append(exc)
        raise errors[0] if len(errors) == 1 else RecipeError(
            f"{source}: '{key}' expects one of {[getattr(a, '__name__', str(a)) for a in args]}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise RecipeError(f"{source}: '{key}' must be one of {list(args)}, got {value!r}")
        return value
    if hint is typing.Any or isinstance(hint, str):
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise RecipeError(f"{source}: '{key}' expects true/false, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise RecipeError(f"{source}: '{key}' expects an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise RecipeError(f"{source}: '{key}' expects an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads 1e-5 (no dot) as a string
            except ValueError:
                pass
        raise RecipeError(f"{source}: '{key}' expects a number, got {value!r}")
    if hint is str:
        if isinstance(value, (dict, list)):
            raise RecipeError(f"{source}: '{key}' expects a string, got {type(value).__name__} {value!r}")
        return str(value)
    if origin in (list, Sequence) or hint is list:
        if isinstance(value, str):
            value = _parse_json(key, value, source) if value.strip().startswith("[") else [value]
        if not isinstance(value, (list, tuple)):
            value = [value]
        inner = args[0] if args else typing.Any
        return [_coerce(key, v, inner, source) for v in value]
    if origin is dict or hint is dict:
        if isinstance(value, str):
            value = _parse_json(key, value, source)
        if not isinstance(value, dict):
            raise RecipeError(f"{source}: '{key}' expects a mapping, got {value!r}")
        return value
    if isinstance(hint, type) and issubclass(hint, str) and isinstance(value, str):  # str enums
        return hint(value)
    if isinstance(hint, type) and isinstance(value, hint):
        return value
    if isinstance(hint, type) and isinstance(value, str):
        try:
            return hint(value)
        except Exception as exc:  # noqa: BLE001
            raise RecipeError(f"{source}: '{key}' got {value!r}: {exc}") from exc
    return value


def _parse_json(key: str, text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecipeError(f"{source}: '{key}' expects JSON, got {text!r} ({exc.msg})") from exc


def _cli_to_mapping(argv: Sequence[str], known: set[str], bool_keys: set[str]) -> tuple[str | None, dict[str, Any]]:
    """``--config path --key value --flag --key=value ...`` -> (config path, {key: raw value})."""
    argv, config_path, values, i = list(argv), None, {}, 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("--"):
            raise RecipeError(f"command line: unexpected argument {token!r} (options look like --key value)")
        key, _, inline = token[2:].partition("=")
        key = key.replace("-", "_")
        if key == "config":
            config_path = inline or (argv[i + 1] if i + 1 < len(argv) else None)
            if config_path is None:
                raise RecipeError("command line: --config needs a path")
            i += 1 if inline else 2
            continue
        if key not in known:
            raise RecipeError(_unknown_message(key, known, "command line"))
        if inline:
            values[key], i = inline, i + 1
            continue
        following = []
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            following.append(argv[j])
            j += 1
        if not following:
            if key not in bool_keys:
                raise RecipeError(f"command line: --{key} needs a value")
            values[key] = True
        else:
            values[key] = following[0] if len(following) == 1 else following
        i = j
    return config_path, values


def _unknown_message(key: str, known: set[str], source: str) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"{source}: unknown key '{key}'{hint}"


def load_recipe(argv: Sequence[str] | None = None, yaml_text: str | None = None):
    """Parse a recipe into ``(RecipeArguments, trainer config)``; nothing is loaded.

    Args:
        argv: command-line arguments (``--config file.yaml --key value ...``); ``None`` reads ``sys.argv``.
        yaml_text: recipe given as a YAML string instead of ``--config``.
    """
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    registry = _trainer_registry()
    recipe_fields = _fields(RecipeArguments)
    # The trainer decides the config class; read it from the command line or the file first.
    config_path, cli = _cli_to_mapping(argv, known=_all_known_keys(registry), bool_keys=_bool_keys(registry))
    file_values: dict[str, Any] = {}
    source = "recipe"
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise RecipeError(f"Recipe file {config_path} does not exist")
        yaml_text, source = path.read_text(), str(path)
    if yaml_text is not None:
        try:
            loaded = yaml.safe_load(yaml_text)
        except yaml.YAMLError as exc:
            raise RecipeError(f"{source}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise RecipeError(f"{source}: a recipe is a YAML mapping of keys to values")
        file_values = loaded
    trainer_name = cli.get("trainer", file_values.get("trainer", "magrpo"))
    if trainer_name not in registry:
        raise RecipeError(f"{source}: unknown trainer {trainer_name!r}; choose from {sorted(registry)}")
    config_cls, _ = registry[trainer_name]
    config_fields = _fields(config_cls)
    known = set(config_fields) | set(recipe_fields)
    hints = {**_hints(config_cls), **_hints(RecipeArguments)}

    merged: dict[str, Any] = {}
    for origin, values in ((source, file_values), ("command line", cli)):
        for key, value in values.items():
            if key not in known:
                raise RecipeError(_unknown_message(key, known, origin))
            merged[key] = _coerce(key, value, hints.get(key, typing.Any), origin)

    recipe = RecipeArguments(**{k: v for k, v in merged.items() if k in recipe_fields})
    config_kwargs = {k: v for k, v in merged.items() if k in config_fields and k not in recipe_fields}
    config_kwargs.setdefault("output_dir", f"outputs/{recipe.environment}")
    try:
        config = config_cls(**config_kwargs)
    except (ValueError, TypeError) as exc:
        raise RecipeError(f"{source}: {exc}") from exc
    return recipe, config


def _all_known_keys(registry) -> set[str]:
    keys = set(_fields(RecipeArguments))
    for config_cls, _ in registry.values():
        keys |= set(_fields(config_cls))
    return keys


def _bool_keys(registry) -> set[str]:
    keys = set()
    for config_cls, _ in registry.values():
        keys |= {k for k, h in _hints(config_cls).items() if h is bool or h == (bool | None)}
    return keys


def resolve_environment(name: str):
    """A registered environment name or ``"module:Class"`` -> the environment class."""
    from .environments import ENVIRONMENTS

    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    if ":" in name:
        try:
            return import_object(name, "environment")
        except (ImportError, ValueError) as exc:
            raise RecipeError(str(exc)) from exc
    raise RecipeError(f"Unknown environment {name!r}; registered: {sorted(ENVIRONMENTS)}, or use 'module:Class'")


def build_team(recipe: RecipeArguments, roles: Sequence[str]) -> list[AgentSpec]:
    """AgentSpecs from the recipe (defaults: one agent per role), checked against the environment's roles."""
    if recipe.policy_mapping not in ("specialized", "shared"):
        raise RecipeError(f"policy_mapping must be 'specialized' or 'shared', got {recipe.policy_mapping!r}")
    entries = recipe.agents or [{"name": r} for r in roles]
    spec_fields = {f.name for f in dataclasses.fields(AgentSpec)}
    specs = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise RecipeError(f"agents[{i}] must be a mapping of AgentSpec fields, got {entry!r}")
        unknown = set(entry) - spec_fields
        if unknown:
            key = sorted(unknown)[0]
            raise RecipeError(_unknown_message(key, spec_fields, f"agents[{i}]"))
        values = {"model": recipe.model, "quantization": recipe.quantization, "lora_r": recipe.lora_r,
                  "lora_alpha": recipe.lora_alpha, **entry}
        if recipe.policy_mapping == "shared":
            values.setdefault("policy", "shared")
        try:
            specs.append(AgentSpec(**values))
        except (TypeError, ValueError) as exc:
            raise RecipeError(f"agents[{i}]: {exc}") from exc
    names = [s.name for s in specs]
    if sorted(names) != sorted(roles):
        raise RecipeError(f"The recipe's agents {names} do not match the environment's roles {list(roles)}")
    try:
        check_team(specs)
    except ValueError as exc:
        raise RecipeError(str(exc)) from exc
    return specs


#: Suffixes of the local data files a recipe's ``dataset`` may name.
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")


def build_dataset(recipe: RecipeArguments, env_cls, config):
    from datasets import Dataset

    if recipe.dataset == "generated":
        make = getattr(env_cls, "make_dataset", None)
        if make is not None:
            return make(num_tasks=recipe.num_tasks, seed=config.seed)
        return Dataset.from_dict({"task_id": list(range(recipe.num_tasks))})
    data = _load_data(recipe)
    if recipe.dataset_transform:
        try:
            transform = import_object(recipe.dataset_transform, "dataset_transform")
        except (ImportError, ValueError) as exc:
            raise RecipeError(str(exc)) from exc
        data = data.map(transform)
    return data


def _load_data(recipe: RecipeArguments):
    from datasets import load_dataset

    path = Path(recipe.dataset)
    if path.suffix in DATA_FILE_SUFFIXES:
        if not path.is_file():
            raise RecipeError(f"Dataset file {path} does not exist")
        kind = {"jsonl": "json"}.get(path.suffix[1:], path.suffix[1:])
        return load_dataset(kind, data_files=str(path), split="train")
    try:
        return load_dataset(recipe.dataset, recipe.dataset_config, split=recipe.dataset_split)
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; all mean "not available here"
        raise RecipeError(
            f"Could not load the dataset {recipe.dataset!r} ({type(exc).__name__}: {exc}). Hub datasets need a "
            "reachable Hugging Face Hub; offline, use dataset: generated or a local .jsonl/.csv/.parquet file."
        ) from exc


#: The names the environments give their held-out split of generated tasks (each accepts exactly one of them).
HELD_OUT_SPLITS = ("eval", "test")


def held_out_tasks(recipe: RecipeArguments, config, num_tasks: int):
    """The held-out tasks of a recipe's before/after evaluation, at most ``num_tasks`` of them, as a ``Dataset``.

    For ``dataset: generated`` (or ``eval_dataset_split: generated``) they are the environment's generated held-out
    split: ``eval`` or ``test``, whichever its ``make_dataset`` accepts; each environment draws it from a seed stream
    that never yields a training task (tested per environment). For a hub or file dataset they are the rows of
    ``eval_dataset_split``, loaded and transformed like the training data; the field is required there, so that a
    hub-trained team is never silently scored on something else. Call it before :func:`build_trainer`: a missing or
    unavailable held-out split is then reported before any model loads.
    """
    env_cls = resolve_environment(recipe.environment)
    if recipe.dataset == "generated" or recipe.eval_dataset_split == "generated":
        make = getattr(env_cls, "make_dataset", None)
        if make is None:
            raise RecipeError(f"{env_cls.__name__} has no make_dataset, so it has no generated held-out tasks")
        for split in HELD_OUT_SPLITS:
            try:
                return make(num_tasks=num_tasks, seed=config.seed, split=split)
            except ValueError:
                continue
        raise RecipeError(f"{env_cls.__name__}.make_dataset accepts none of the held-out splits {HELD_OUT_SPLITS}")
    if not recipe.eval_dataset_split:
        raise RecipeError(f"dataset {recipe.dataset!r} needs eval_dataset_split: its held-out split (e.g. 'test' or "
                          "'validation'), or 'generated' for the environment's generated held-out tasks")
    if Path(recipe.dataset).suffix in DATA_FILE_SUFFIXES:  # a file has no splits: the held-out tasks are another file
        if Path(recipe.eval_dataset_split).suffix not in DATA_FILE_SUFFIXES:
            raise RecipeError(f"dataset {recipe.dataset!r} is a file: eval_dataset_split must be another data file "
                              f"({', '.join(DATA_FILE_SUFFIXES)}) or 'generated', got {recipe.eval_dataset_split!r}")
        held_out = dataclasses.replace(recipe, dataset=recipe.eval_dataset_split)
    else:
        held_out = dataclasses.replace(recipe, dataset_split=recipe.eval_dataset_split)
    data = build_dataset(held_out, env_cls, config)
    return data.select(range(min(num_tasks, len(data))))


def build_trainer(recipe: RecipeArguments, config, callbacks=None):
    """Check everything that can be checked, then load the team and return the trainer."""
    env_cls = resolve_environment(recipe.environment)
    try:
        env_factory = functools.partial(env_cls, **recipe.env_kwargs)
        probe = env_factory()
    except TypeError as exc:
        raise RecipeError(f"env_kwargs do not fit {env_cls.__name__}: {exc}") from exc
    specs = build_team(recipe, probe.agents)
    dataset = build_dataset(recipe, env_cls, config)
    try:
        probe.validate_dataset_columns(list(dataset.column_names), name=f"dataset {recipe.dataset!r}")
    except ValueError as exc:
        raise RecipeError(str(exc)) from exc
    _, trainer_cls = _trainer_registry()[recipe.trainer]
    return trainer_cls(specs, env_factory, args=config, train_dataset=dataset, callbacks=callbacks)


def finish_distributed() -> None:
    """Wait for every process and tear the process group down before the interpreter exits.

    Without it, a process may exit while the communication backend's threads of another are still running, and
    the C++ runtime aborts it ("terminate called without an active exception").
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
