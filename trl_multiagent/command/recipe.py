"""YAML recipes: one file of data -> trainer config, team, environment, dataset and held-out tasks.

A recipe is a flat YAML mapping. Its keys are the fields of the trainer's config (every ``GRPOConfig`` field and the
multi-agent ones) and of :class:`RecipeArguments` (what to train on, with whom, and how to evaluate). The command
line (:mod:`trl_multiagent.command.cli`, on TRL's ``TrlParser``) follows TRL's conventions: ``--config recipe.yaml`` loads
the file, ``--field value`` overrides any field (``--learning_rate 1e-5``, ``--bf16`` for a true flag, ``--agents
'[{"name": "a"}, ...]'`` as JSON for the structured fields), an ``env:`` block sets environment variables, and
``--help`` lists every field.

Every key and value is checked before any model loads: an unknown key, a value of the wrong type or out of range,
agents that do not match the environment's roles, environment arguments out of range, or a dataset file that is
empty, malformed or without the columns the environment needs each raise one :class:`RecipeError` that names the
field, the file or the line.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import logging
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trl_multiagent.errors import TASK_ID_FIELDS, RecipeError  # noqa: F401  (RecipeError re-exported)
from trl_multiagent.models import QUANTIZATIONS
from trl_multiagent.runtime.user_code import import_object

if TYPE_CHECKING:  # the command line reads this module without importing torch (trl_multiagent/command/recipe_fields.py)
    from trl_multiagent.team.pool import AgentSpec

logger = logging.getLogger(__name__)

#: The methods an evaluation can name (the team, the coding baselines of MAGRPO App. E, the math team's no_exchange)
#: and ``alone``: every ``<agent>_alone`` / ``<agent>_alone_turns`` baseline of the environment
#: (trl_multiagent/evaluation/alone.py), which a recipe may also name one by one.
EVAL_METHOD_NAMES = ("team", "single", "naive", "sequential", "discussion", "no_exchange", "alone")
#: The names of one agent alone (checked against the environment's agents when the evaluation is planned).
ALONE_METHOD = re.compile(r"\S+_alone(_turns)?")
#: ``evaluator:`` values besides ``"module:Class"``.
EVALUATOR_NAMES = ("auto", "none", "episodes", "coding", "debate", "pipeline", "writing")
EVAL_STAGES = ("before", "after")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class RecipeArguments:
    """What to train (environment, team, data) and how to evaluate it; the trainer config holds how to train."""

    _argument_group_name = "recipe: what to train, with whom, on what data, and how to evaluate it"

    trainer: str = field(default="magrpo", metadata=_help(
        "The trainer that runs the recipe, a name of trl_multiagent.trainers.TRAINERS (magrpo, mhgpo, collm, "
        "maporl, ...). Read before every other field: `--trainer X --help` lists X's config fields."))
    environment: str = field(default="matrix_game", metadata=_help(
        "A registered environment (trl_multiagent.environments.ENVIRONMENTS), an import path 'module:Class' or a "
        "class in a Python file, 'path/to/file.py:Class'."))
    env_kwargs: dict = field(default_factory=dict, metadata=_help(
        "Keyword arguments of the environment's constructor: a YAML mapping, or JSON on the command line. A "
        "function argument takes 'module:function' or 'path/to/file.py:function' (reward_fn: "
        "rewards/writing.py:tldr_reward); in a recipe file a relative path is looked up from the current "
        "directory, then the recipe's folder, then its repository root."))
    agents: list[dict] = field(default_factory=list, metadata=_help(
        "The team: one mapping of AgentSpec fields per agent (name, model, policy, quantization, lora_r, ...), a "
        "YAML list or JSON. Empty: one agent per role of the environment, each with its own policy."))
    policy_mapping: str = field(default="specialized", metadata=_help(
        "'specialized' (each agent its own policy) or 'shared' (every agent that names no policy acts with one "
        "policy, 'shared', trained on all roles' data: AT-GRPO's role sharing)."))
    model: str | None = field(default=None, metadata=_help(
        "Model of every agent that names none: a hub id, a local checkpoint directory or an embedded short name "
        "(empty: the embedded SmolLM2-135M-Instruct)."))
    quantization: str | None = field(default=None, metadata=_help(
        "Quantization of every agent that names none: '4bit' for QLoRA, empty for a full-precision base."))
    lora_r: int = field(default=16, metadata=_help("LoRA rank of every agent that names none."))
    lora_alpha: int = field(default=32, metadata=_help("LoRA alpha of every agent that names none."))
    dataset: str = field(default="generated", metadata=_help(
        "'generated' (the environment generates num_tasks tasks), a local .json/.jsonl/.csv/.parquet file, or a hub "
        "dataset id (needs a reachable hub)."))
    dataset_split: str = field(default="train", metadata=_help(
        "Split to train on: of a hub dataset, or of a generated one (an environment whose make_dataset has splits, "
        "e.g. math_tool_generalisation's 'train_balanced')."))
    eval_dataset_split: str | None = field(default=None, metadata=_help(
        "Held-out tasks of the evaluation: a split of the hub dataset ('test', 'validation'), a data file, or "
        "'generated' for the environment's generated held-out split. With dataset 'generated', empty means the "
        "environment's held-out split and another name one of its generated splits (e.g. 'validation', to choose a "
        "configuration on training data)."))
    dataset_config: str | None = field(default=None, metadata=_help("Configuration (subset) of a hub dataset."))
    dataset_transform: str | None = field(default=None, metadata=_help(
        "Optional 'module:function' or 'path/to/file.py:function' mapped over the dataset's rows (e.g. to give "
        "MBPP the columns of HumanEval)."))
    num_tasks: int = field(default=256, metadata=_help("Number of generated training tasks (dataset: generated)."))
    init_adapters: str | None = field(default=None, metadata=_help(
        "Warm start: the output_dir (or a checkpoint-N folder) of a saved team whose adapters are loaded before "
        "training, with a new optimizer and schedule from global step 0. resume_from_checkpoint instead continues a "
        "run exactly (its optimizer, schedule, step and random state); give one or the other."))
    evaluator: str = field(default="auto", metadata=_help(
        "How the team is evaluated on held-out tasks: 'auto' (by environment: coding, writing, debate, pipeline, "
        "or episodes; greedy episodes for collm, as CoLLM evaluates), one of those names, 'none', or "
        "'module:Class' (or 'path/to/file.py:Class') of an Evaluator subclass. With 'auto', an environment without "
        "held-out tasks is not evaluated."))
    eval_stages: list[str] = field(default_factory=lambda: list(EVAL_STAGES), metadata=_help(
        "When to evaluate: 'before' and/or 'after' training; an empty list evaluates nothing."))
    eval_methods: list[str] = field(default_factory=lambda: list(EVAL_METHOD_NAMES), metadata=_help(
        "The trained team and the baselines to evaluate (the baselines exist for the coding and writing "
        "evaluations: single, naive, sequential, discussion; for environments that name episode_baselines, e.g. "
        "the math tool team's no_exchange, both agents answering once; and, for environments that score one agent "
        "alone, <agent>_alone, e.g. reasoner_alone (also called single) and tool_alone, and <agent>_alone_turns; "
        "'alone' names all of those). The default lists every name above, 'alone' included, so that each "
        "evaluation plays all of its baselines; the best baseline is the highest of them before training, whatever "
        "agent's answer it scores."))
    eval_metric: str | None = field(default=None, metadata=_help(
        "The headline metric of the summary and the report (empty: the evaluator's own, e.g. 'reward' for coding, "
        "'success' or 'return' for episodes, 'majority_accuracy' for debates, 'f1' for the search pipeline)."))
    eval_num_problems: int = field(default=0, metadata=_help(
        "Held-out tasks to evaluate on; 0: every row of a held-out data file (eval_dataset_split: a file), else the "
        "evaluator's default (every problem for coding, 32 episodes or debates, 64 pipeline questions)."))
    eval_num_samples: int = field(default=10, metadata=_help(
        "Samples per held-out task and method with sampled decoding (the largest k of pass@k is at most this); "
        "greedy decoding takes one."))
    eval_baseline_num_samples: int = field(default=0, metadata=_help(
        "Samples per held-out task for the baselines, when fewer than eval_num_samples are enough for them; 0: "
        "eval_num_samples. The team, and the naive baseline when it stands for the untrained team "
        "(eval_team_before_is_naive), keep eval_num_samples; a baseline that revises the naive drafts revises the "
        "first of them."))
    eval_max_new_tokens: int = field(default=128, metadata=_help("Response length during evaluation."))
    eval_temperature: float | None = field(default=None, metadata=_help(
        "Sampling temperature of the evaluation; 0: greedy. Empty: the training temperature for the coding and debate "
        "evaluations (and every maporl run, as MAPoRL evaluates), greedy otherwise."))
    eval_team_before_is_naive: bool = field(default=False, metadata=_help(
        "Report the naive-concatenation baseline as the team's before-training result instead of sampling it again "
        "(exact in distribution for a fresh single-turn team: LoRA's B = 0 makes the adapted model the base)."))
    eval_bootstrap_resamples: int = field(default=10_000, metadata=_help(
        "Resamples of the bootstrap intervals (tasks resampled with replacement; gains paired by task)."))
    eval_max_batch_sequences: int = field(default=48, metadata=_help(
        "The most sequences one generation batch of the evaluation may hold (bounds the KV-cache memory); 0: no "
        "bound."))

    def __post_init__(self):
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        def whole(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        need(isinstance(self.trainer, str) and bool(self.trainer), "trainer", "a trainer name")
        need(isinstance(self.environment, str) and bool(self.environment), "environment",
             "a registered environment, 'module:Class' or 'path/to/file.py:Class'")
        need(isinstance(self.env_kwargs, dict) and all(isinstance(k, str) for k in self.env_kwargs), "env_kwargs",
             "a mapping of the environment's constructor arguments")
        need(isinstance(self.agents, list) and all(isinstance(a, dict) for a in self.agents), "agents",
             "a list of mappings of AgentSpec fields")
        need(self.policy_mapping in ("specialized", "shared"), "policy_mapping", "'specialized' or 'shared'")
        need(self.quantization in QUANTIZATIONS, "quantization", f"one of {list(QUANTIZATIONS)}")
        need(whole(self.lora_r) and self.lora_r >= 1, "lora_r", "an integer >= 1")
        need(whole(self.lora_alpha) and self.lora_alpha >= 1, "lora_alpha", "an integer >= 1")
        need(isinstance(self.dataset, str) and bool(self.dataset), "dataset",
             "'generated', a data file or a hub dataset id")
        need(whole(self.num_tasks) and self.num_tasks >= 1, "num_tasks", "an integer >= 1")
        need(self.evaluator in EVALUATOR_NAMES or ":" in str(self.evaluator), "evaluator",
             f"one of {list(EVALUATOR_NAMES)} or 'module:Class'")
        need(all(s in EVAL_STAGES for s in self.eval_stages) and len(set(self.eval_stages)) == len(self.eval_stages),
             "eval_stages", f"a list of distinct stages among {list(EVAL_STAGES)}")
        unknown = [m for m in self.eval_methods
                   if m not in EVAL_METHOD_NAMES and not (isinstance(m, str) and ALONE_METHOD.fullmatch(m))]
        if unknown:
            close = difflib.get_close_matches(unknown[0], EVAL_METHOD_NAMES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"eval_methods: unknown method {unknown[0]!r}; choose from {list(EVAL_METHOD_NAMES)} "
                             f"or <agent>_alone / <agent>_alone_turns{hint}")
        need(bool(self.eval_methods) and len(set(self.eval_methods)) == len(self.eval_methods), "eval_methods",
             "a non-empty list of distinct methods")
        need(whole(self.eval_num_problems) and self.eval_num_problems >= 0, "eval_num_problems",
             "an integer >= 0 (0: all of a held-out file, else the evaluator's default)")
        need(whole(self.eval_num_samples) and self.eval_num_samples >= 1, "eval_num_samples", "an integer >= 1")
        need(whole(self.eval_baseline_num_samples) and 0 <= self.eval_baseline_num_samples <= self.eval_num_samples,
             "eval_baseline_num_samples", f"an integer from 0 to eval_num_samples ({self.eval_num_samples})")
        need(whole(self.eval_max_new_tokens) and self.eval_max_new_tokens >= 1, "eval_max_new_tokens",
             "an integer >= 1")
        need(self.eval_temperature is None or self.eval_temperature >= 0, "eval_temperature", ">= 0 (0: greedy)")
        need(whole(self.eval_bootstrap_resamples) and self.eval_bootstrap_resamples >= 100,
             "eval_bootstrap_resamples", "an integer >= 100")
        need(whole(self.eval_max_batch_sequences) and self.eval_max_batch_sequences >= 0, "eval_max_batch_sequences",
             "an integer >= 0 (0: no bound)")


# ------------------------------------------------------------------------------------------------------ values
def _trainer_registry() -> dict[str, tuple[type, type]]:
    from trl_multiagent.trainers import TRAINERS

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


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def coerce_value(key: str, value: Any, hint: Any, source: str) -> Any:
    """Check ``value`` against the type ``hint`` of field ``key``; convert strings where the type says so.

    ``source`` (the recipe file or ``"command line"``) starts every error message."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if isinstance(value, str) and value.lower() in ("none", "null", "") and type(None) in args \
                and str not in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce_value(key, value, arg, source)
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
            raise RecipeError(f"{source}: '{key}' expects a string, got {_type_name(value)} {value!r}")
        return str(value)
    if origin in (list, Sequence) or hint is list:
        if isinstance(value, str) or (isinstance(value, list) and len(value) == 1 and isinstance(value[0], str)
                                      and value[0].strip().startswith("[")):
            text = value if isinstance(value, str) else value[0]
            value = _parse_json(key, text, source) if text.strip().startswith("[") else [text]
        if not isinstance(value, (list, tuple)):
            value = [value]
        inner = args[0] if args else typing.Any
        return [coerce_value(key, v, inner, source) for v in value]
    if origin is dict or hint is dict:
        if isinstance(value, str):
            value = _parse_json(key, value, source)
        if not isinstance(value, dict):
            raise RecipeError(f"{source}: '{key}' expects a mapping, got {_type_name(value)} {value!r}")
        return value
    if isinstance(hint, type) and issubclass(hint, str) and isinstance(value, str):  # str enums
        try:
            return hint(value)
        except ValueError as exc:
            raise RecipeError(f"{source}: '{key}' got {value!r}: {exc}") from exc
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


def unknown_key_message(key: str, known, source: str) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"{source}: unknown key '{key}'{hint}"


# ------------------------------------------------------------------------------------------------------ building
def resolve_environment(name: str):
    """A registered environment name, ``"module:Class"`` or ``"path/to/file.py:Class"`` -> the environment class."""
    from trl_multiagent.environments import ENVIRONMENTS

    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    if ":" in name:
        try:
            return import_object(name, "environment")
        except (ImportError, ValueError) as exc:
            raise RecipeError(str(exc)) from exc
    close = difflib.get_close_matches(name, sorted(ENVIRONMENTS), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise RecipeError(f"Unknown environment {name!r}{hint}; registered: {sorted(ENVIRONMENTS)}, or use 'module:Class' "
                      "or 'path/to/file.py:Class'")


def pass_reward_weights(recipe: RecipeArguments, config) -> None:
    """The top-level ``reward_weights`` (TRL's ``GRPOConfig`` field: one weight per reward function) given to the
    environment as its ``reward_weights``, where it weighs reward functions of TRL's kind (it sets
    ``takes_reward_weights``: ``FunctionEnvironment``, ``TRLEnvironmentTeam``); refused with one line elsewhere, so
    that no weight is accepted and then ignored."""
    weights = getattr(config, "reward_weights", None)
    if weights is None:
        return
    env_cls = resolve_environment(recipe.environment)
    if not getattr(env_cls, "takes_reward_weights", False):
        raise RecipeError(f"reward_weights: {env_cls.__name__} has no list of reward functions to weigh (TRL's "
                          "reward_weights weighs reward functions, as FunctionEnvironment's reward_fns / reward_funcs "
                          "and TRLEnvironmentTeam's reward_fns are); set its own weights in env_kwargs, where it has "
                          "some, and leave reward_weights out")
    weights = [float(w) for w in weights]
    given = recipe.env_kwargs.get("reward_weights")
    if given is not None and [float(w) for w in given] != weights:
        raise RecipeError(f"reward_weights {weights} and env_kwargs.reward_weights {list(given)} differ; give one")
    recipe.env_kwargs = {**recipe.env_kwargs, "reward_weights": weights}


def environment_factory(recipe: RecipeArguments):
    """``(environment class, zero-argument factory, one probe instance)``; ``env_kwargs`` checked by constructing
    the probe (each environment checks its arguments in its constructor)."""
    env_cls = resolve_environment(recipe.environment)
    factory = functools.partial(env_cls, **recipe.env_kwargs)
    try:
        probe = factory()
    except TypeError as exc:
        raise RecipeError(f"env_kwargs do not fit {env_cls.__name__}: {exc}") from exc
    except (ValueError, ImportError) as exc:
        raise RecipeError(f"env_kwargs of {env_cls.__name__}: {exc}") from exc
    return env_cls, factory, probe


def build_team(recipe: RecipeArguments, roles: Sequence[str]) -> list[AgentSpec]:
    """AgentSpecs from the recipe (defaults: one agent per role), checked against the environment's roles."""
    from trl_multiagent.team.pool import AgentSpec, check_team

    if recipe.policy_mapping not in ("specialized", "shared"):
        raise RecipeError(f"policy_mapping must be 'specialized' or 'shared', got {recipe.policy_mapping!r}")
    entries = recipe.agents or [{"name": r} for r in roles]
    spec_fields = _fields(AgentSpec)
    spec_hints = _hints(AgentSpec)
    specs = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise RecipeError(f"agents[{i}] must be a mapping of AgentSpec fields, got {entry!r}")
        unknown = set(entry) - set(spec_fields)
        if unknown:
            raise RecipeError(unknown_key_message(sorted(unknown)[0], spec_fields, f"agents[{i}]"))
        checked = {k: coerce_value(k, v, spec_hints.get(k, typing.Any), f"agents[{i}]") for k, v in entry.items()}
        values = {"model": recipe.model, "quantization": recipe.quantization, "lora_r": recipe.lora_r,
                  "lora_alpha": recipe.lora_alpha, **checked}
        if recipe.policy_mapping == "shared":
            values.setdefault("policy", "shared")
        try:
            specs.append(AgentSpec(**values))
        except (TypeError, ValueError, ImportError, OSError) as exc:
            raise RecipeError(f"agents[{i}]: {exc}") from exc
    names = [s.name for s in specs]
    if sorted(names) != sorted(roles):
        raise RecipeError(f"The recipe's agents {names} do not match the environment's roles {list(roles)}")
    try:
        check_team(specs)
    except ValueError as exc:
        raise RecipeError(str(exc)) from exc
    return specs


def build_dataset(recipe: RecipeArguments, env_cls, config):
    from datasets import Dataset

    if recipe.dataset == "generated":
        make = getattr(env_cls, "make_dataset", None)
        named = recipe.dataset_split != "train"  # a generated split other than the environment's default one
        if named and (make is None or not _takes_keyword(make, "split")):
            raise RecipeError(f"dataset_split {recipe.dataset_split!r}: {env_cls.__name__} generates no splits (its "
                              f"make_dataset takes no split argument); leave dataset_split at 'train'")
        if make is not None:
            split = {"split": recipe.dataset_split} if named else {}
            try:
                return make(num_tasks=recipe.num_tasks, seed=config.seed, **split)
            except ValueError as exc:
                raise RecipeError(f"{env_cls.__name__}.make_dataset: {exc}") from exc
        return Dataset.from_dict({"task_id": list(range(recipe.num_tasks))})
    data = _load_data(recipe)
    if recipe.dataset_transform:
        try:
            transform = import_object(recipe.dataset_transform, "dataset_transform")
        except (ImportError, ValueError) as exc:
            raise RecipeError(str(exc)) from exc
        try:
            data = data.map(transform)
        except Exception as exc:  # noqa: BLE001 - a user's function on user data: report, do not trace back
            raise RecipeError(f"dataset_transform {recipe.dataset_transform!r} failed on dataset "
                              f"{recipe.dataset!r}: {type(exc).__name__}: {exc}") from exc
    return data


def _load_data(recipe: RecipeArguments):
    from datasets import load_dataset

    from trl_multiagent.command.datafiles import DATA_FILE_SUFFIXES, check_data_file

    path = Path(recipe.dataset)
    if path.suffix in DATA_FILE_SUFFIXES:
        check_data_file(path)
        kind = {"jsonl": "json"}.get(path.suffix[1:], path.suffix[1:])
        try:
            return load_dataset(kind, data_files=str(path), split="train")
        except Exception as exc:  # noqa: BLE001 - datasets raises many kinds for a file it cannot read
            raise RecipeError(f"dataset file {path} cannot be read as {kind}: {type(exc).__name__}: {exc}") from exc
    try:
        return load_dataset(recipe.dataset, recipe.dataset_config, split=recipe.dataset_split)
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; all mean "not available here"
        raise RecipeError(
            f"Could not load the dataset {recipe.dataset!r} ({type(exc).__name__}: {exc}). Hub datasets need a "
            "reachable Hugging Face Hub; offline, use dataset: generated or a local .jsonl/.csv/.parquet file."
        ) from exc


def check_rows_fit(probe, data, name: str, max_rows: int = 4) -> None:
    """The dataset has the columns the environment reads, and its first rows start an episode (values of the
    wrong type are reported here, before any model loads, naming the row)."""
    try:
        probe.validate_dataset_columns(list(data.column_names), name=name)
    except ValueError as exc:
        raise RecipeError(str(exc)) from exc
    if len(data) == 0:
        raise RecipeError(f"{name} has no rows")
    reset = getattr(probe, "reset", None)
    if reset is None:  # pipelines are stateless: nothing to start
        return
    for i in range(min(max_rows, len(data))):
        try:
            reset(data[i])
        except Exception as exc:  # noqa: BLE001 - any failure means this row does not fit the environment
            raise RecipeError(f"{name}, row {i}: {type(probe).__name__} cannot start an episode from it "
                              f"({type(exc).__name__}: {exc}); check the types of its values") from exc


#: The names the environments give their held-out split of generated tasks (each accepts exactly one of them), in
#: the order they are tried: ``make_dataset(split="eval")`` first, ``"test"`` when that raises ``ValueError``.
HELD_OUT_SPLITS = ("eval", "test")


def held_out_tasks(recipe: RecipeArguments, config, num_tasks: int | None, generated: bool = False):
    """The held-out tasks of a recipe's evaluation, at most ``num_tasks`` of them (``None``: all), as a ``Dataset``.

    For ``dataset: generated`` (or ``eval_dataset_split: generated``, or ``generated=True`` when the evaluation has
    its own held-out split and the recipe names none) they are the environment's generated held-out split:
    ``make_dataset(num_tasks=num_tasks, seed=config.seed, split="eval")``, or ``split="test"`` where ``"eval"`` raises
    ``ValueError``; each environment draws it from a seed stream that never yields a training task (tested per
    environment). A generated dataset's ``eval_dataset_split`` may name another of its generated splits (only that
    one is tried; ``"validation"`` of ``math_tool_generalisation`` chooses a configuration on training arithmetic) or
    a data file. For a hub or file dataset they are the rows of ``eval_dataset_split``, loaded and transformed like
    the training data; the field is required there, so that a hub-trained team is never silently scored on something
    else. Called before the trainer is built: a missing or unavailable held-out split is reported before any model
    loads.

    Fewer tasks than asked are never silent: a split with fewer rows than ``num_tasks`` is used whole (truncated) and
    a split whose rows repeat a task (rows equal but for their id fields, ``id``, ``task_id``, ...) is used as it is, each copy counting
    in the means; both log a warning that says so (:func:`warn_about_held_out_tasks`).
    """
    env_cls = resolve_environment(recipe.environment)
    from trl_multiagent.command.datafiles import DATA_FILE_SUFFIXES

    named = recipe.eval_dataset_split
    a_file = bool(named) and Path(named).suffix in DATA_FILE_SUFFIXES
    if (recipe.dataset == "generated" and not a_file) or named == "generated" or (generated and not named):
        make = getattr(env_cls, "make_dataset", None)
        if make is None:
            raise RecipeError(f"{env_cls.__name__} has no make_dataset, so it has no generated held-out tasks")
        if not _takes_keyword(make, "split"):
            raise RecipeError(f"{env_cls.__name__}.make_dataset takes no split argument, so it has no held-out split: "
                              f"give it one (make_dataset(cls, num_tasks, seed=0, split='train'), with 'eval' for the "
                              f"held-out tasks), or set --evaluator none")
        # a generated dataset's eval_dataset_split may name one of its generated splits (e.g. 'validation', to choose a
        # configuration without touching the held-out problems): that split and no other
        splits = (named,) if recipe.dataset == "generated" and named and named != "generated" else HELD_OUT_SPLITS
        refusals = {}
        for split in splits:
            try:
                data = make(num_tasks=num_tasks, seed=config.seed, split=split)
            except ValueError as exc:
                refusals[split] = exc
                continue
            logger.info("Held-out tasks: %s.make_dataset(num_tasks=%s, seed=%s, split=%r), %d rows", env_cls.__name__,
                        num_tasks, config.seed, split, len(data))
            warn_about_held_out_tasks(data, num_tasks, f"the generated split {split!r} of {env_cls.__name__}")
            return data
        if len(splits) == 1:
            raise RecipeError(f"eval_dataset_split {named!r}: {env_cls.__name__}.make_dataset refused it "
                              f"({refusals[named]})")
        raise RecipeError(f"{env_cls.__name__}.make_dataset accepts none of the held-out splits {HELD_OUT_SPLITS} "
                          f"({'; '.join(f'split={k!r}: {v}' for k, v in refusals.items())})")
    if not recipe.eval_dataset_split:
        raise RecipeError(f"dataset {recipe.dataset!r} needs eval_dataset_split: its held-out split (e.g. 'test' or "
                          "'validation'), or 'generated' for the environment's generated held-out tasks (or "
                          "--evaluator none to train without evaluating)")
    if Path(recipe.dataset).suffix in DATA_FILE_SUFFIXES or recipe.dataset == "generated":  # a file has no splits: the held-out tasks are another file
        if Path(recipe.eval_dataset_split).suffix not in DATA_FILE_SUFFIXES:
            raise RecipeError(f"dataset {recipe.dataset!r} is a file: eval_dataset_split must be another data file "
                              f"({', '.join(DATA_FILE_SUFFIXES)}) or 'generated', got {recipe.eval_dataset_split!r}")
        held_out = dataclasses.replace(recipe, dataset=recipe.eval_dataset_split)
        name = f"the file {recipe.eval_dataset_split}"
    else:
        held_out = dataclasses.replace(recipe, dataset_split=recipe.eval_dataset_split)
        name = f"the split {recipe.eval_dataset_split!r} of {recipe.dataset}"
    data = build_dataset(held_out, env_cls, config)
    warn_about_held_out_tasks(data, num_tasks, name)
    return data if num_tasks is None else data.select(range(min(num_tasks, len(data))))


def _takes_keyword(fn, name: str) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read: let the call tell
        return True
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def warn_about_held_out_tasks(data, num_tasks: int | None, name: str) -> None:
    """Log a warning when the held-out tasks are fewer than asked: fewer rows than ``num_tasks`` (the evaluation
    uses them all, no more), or rows that repeat a task (the evaluation keeps every copy; a repeated task then
    weighs more in the means and the intervals). Only the first ``num_tasks`` rows are looked at, as only they are
    evaluated."""
    rows = len(data)
    if num_tasks is not None and rows < num_tasks:
        logger.warning("%d held-out tasks were asked for (eval_num_problems, or the evaluator's default when it is "
                       "0), but %s has only %d: the evaluation uses those %d (truncated, nothing repeated)", num_tasks,
                       name, rows, rows)
    used = data if num_tasks is None or rows <= num_tasks else data.select(range(num_tasks))
    keys = [json.dumps({k: v for k, v in dict(row).items() if k not in TASK_ID_FIELDS}, sort_keys=True, default=str)
            for row in used]
    distinct = len(set(keys))
    if distinct < len(keys):
        logger.warning("%s has only %d distinct tasks among the %d held-out tasks evaluated (rows equal but for "
                       "their id): the repeats are evaluated as they are, each copy counting in the means and the "
                       "bootstrap intervals; lower eval_num_problems to %d, or make make_dataset draw distinct tasks",
                       name, distinct, len(keys), distinct)


def finish_distributed() -> None:
    """Wait for every process and tear the process group down before the interpreter exits.

    Without it, a process may exit while the communication backend's threads of another are still running, and
    the C++ runtime aborts it ("terminate called without an active exception").
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
