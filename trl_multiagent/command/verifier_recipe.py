"""The ``train-verifier`` command's configuration (:class:`VerifierTrainingConfig`), its command-line parser and the
checks that need no model (:func:`parse_config`, :func:`check_output_dir`); the run itself is
:mod:`trl_multiagent.command.train_verifier`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl_multiagent.command.recipe_files import apply_env_block, read_recipe_file
from trl_multiagent.errors import RecipeError
from trl_multiagent.models.loading import MODEL_DTYPES
from trl_multiagent.team.pool import QUANTIZATIONS

PROG = "python -m trl_multiagent train-verifier"
#: What a run writes to ``output_dir`` (``overwrite`` removes exactly these before a new run).
OUTPUT_FILES = ("summary.json", "report.md", "solutions.jsonl", "held_out_scores.jsonl", "verifier.json", "adapters")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class VerifierTrainingConfig:
    """The recipe of ``train-verifier``: what samples the solutions, how they are balanced, how the verifier is
    trained and evaluated, and where it goes. Every field can be set in the YAML file and overridden on the command
    line (``--field value``)."""

    # ---- sampling
    environment: str = field(default="math_debate_easy", metadata=_help(
        "The debate environment whose questions are answered and whose gold check labels the solutions: a "
        "registered name (math_debate, math_debate_easy, nli_debate, ...) or 'module:Class' of a DebateEnv."))
    env_kwargs: dict = field(default_factory=dict, metadata=_help(
        "Keyword arguments of the environment's constructor (as in the debate recipe)."))
    agent: str | None = field(default=None, metadata=_help(
        "The role whose first-turn prompt the sampling model answers (empty: the environment's first agent)."))
    model: str | None = field(default=None, metadata=_help(
        "The model that samples the solutions: the debaters' base (App. E.3). Hub id, local checkpoint or embedded "
        "short name (empty: the embedded SmolLM2-135M-Instruct)."))
    quantization: str | None = field(default=None, metadata=_help(
        "Quantization of the sampling model: empty for full precision, '4bit' for NF4."))
    dataset: str = field(default="generated", metadata=_help(
        "'generated' (the environment generates the training questions), a local .json/.jsonl/.csv/.parquet file or a "
        "hub dataset id."))
    dataset_split: str = field(default="train", metadata=_help(
        "The split of a hub dataset the training questions come from (only this split is used for training)."))
    dataset_config: str | None = field(default=None, metadata=_help("Configuration (subset) of a hub dataset."))
    dataset_transform: str | None = field(default=None, metadata=_help(
        "Optional 'module:function' mapped over the dataset's rows (e.g. trl_multiagent.environments.math_problems:"
        "gsm8k_to_task)."))
    num_questions: int = field(default=64, metadata=_help(
        "Training questions: the first num_questions rows of the training split (generated: that many)."))
    num_samples: int = field(default=8, metadata=_help(
        "Solutions sampled per question, training and held-out (the paper: 100 per GSM8K question)."))
    temperature: float = field(default=0.7, metadata=_help("Sampling temperature (> 0; the debate's is 0.7)."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling threshold in (0, 1]."))
    max_new_tokens: int = field(default=128, metadata=_help(
        "Longest solution (tokens); use the debate recipe's max_completion_length."))
    max_batch_sequences: int = field(default=48, metadata=_help(
        "The most sequences one generation batch holds (bounds the KV-cache memory); 0: no bound."))
    require_answer: bool = field(default=True, metadata=_help(
        "Drop solutions from which the environment extracts no answer (App. E.1 excludes unformatted outputs), in "
        "training and held-out alike."))
    # ---- balancing
    per_class: int = field(default=4, metadata=_help(
        "Correct and incorrect training solutions kept per question (the paper: 20 for GSM8K)."))
    fill_missing: bool = field(default=False, metadata=_help(
        "Fill a class with fewer than per_class solutions with a reference solution (correct) or one whose numeric "
        "answer is off by a little (incorrect), as App. E.1; needs numeric gold answers. Off: a question keeps "
        "min(#correct, #incorrect) of each class."))
    # ---- held-out evaluation
    eval_split: str | None = field(default=None, metadata=_help(
        "Held-out questions: empty or 'generated' for the environment's generated held-out split (dataset: "
        "generated), a split of the hub dataset ('test'), or another data file for a file dataset. No held-out "
        "question may be a training question."))
    eval_num_questions: int = field(default=32, metadata=_help("Held-out questions to sample solutions for."))
    eval_per_class: int = field(default=4, metadata=_help(
        "At most this many correct and this many incorrect held-out solutions per question (balanced: "
        "min(#correct, #incorrect, eval_per_class) of each; never filled in)."))
    eval_threshold: float = field(default=0.5, metadata=_help(
        "A score at or above it counts as 'correct' in the accuracy."))
    eval_bootstrap_resamples: int = field(default=2000, metadata=_help(
        "Resamples of the 95% intervals (held-out questions resampled with replacement)."))
    # ---- the verifier
    verifier_model: str | None = field(default=None, metadata=_help(
        "The verifier's backbone (empty: the sampling model; App. E.3 found that another base does not learn)."))
    verifier_quantization: str | None = field(default=None, metadata=_help(
        "Quantization of the verifier's backbone: empty for full precision, '4bit' (the paper's)."))
    lora_r: int = field(default=16, metadata=_help("LoRA rank of the verifier's adapter."))
    lora_alpha: int = field(default=32, metadata=_help("LoRA alpha of the verifier's adapter."))
    epochs: int = field(default=2, metadata=_help("Passes over the balanced training solutions."))
    learning_rate: float = field(default=1e-4, metadata=_help("AdamW learning rate of the adapter and the head."))
    batch_size: int = field(default=8, metadata=_help("Solutions per optimizer step."))
    latter_fraction: float = field(default=0.5, metadata=_help(
        "The loss covers this last fraction of each solution's tokens (App. E.1: the latter half)."))
    score_batch_size: int = field(default=16, metadata=_help("Solutions per forward pass when scoring."))
    model_dtype: str = field(default="auto", metadata=_help(
        "Weights dtype of full-precision models: auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, "
        "float16, float64."))
    # ---- the run
    output_dir: str = field(default="outputs/verifier", metadata=_help(
        "Where the verifier and the results go; the debate recipe's verifier: names it. Must not hold earlier "
        "results unless overwrite is true."))
    overwrite: bool = field(default=False, metadata=_help(
        "Allow a non-empty output_dir: the files of an earlier run there are removed first."))
    seed: int = field(default=0, metadata=_help("Seed of sampling, balancing, the adapter's init and the order."))
    num_threads: int | None = field(default=None, metadata=_help(
        "CPU threads of torch (empty: every CPU this process may use, unless OMP_NUM_THREADS is set)."))
    disable_progress: bool = field(default=False, metadata=_help("Log each stage instead of drawing progress bars."))

    def __post_init__(self):
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        def whole(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def number(value: Any) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        need(isinstance(self.environment, str) and bool(self.environment), "environment",
             "a registered debate environment or 'module:Class'")
        need(isinstance(self.env_kwargs, dict) and all(isinstance(k, str) for k in self.env_kwargs), "env_kwargs",
             "a mapping of the environment's constructor arguments")
        need(self.agent is None or (isinstance(self.agent, str) and bool(self.agent)), "agent", "a role name or empty")
        need(self.quantization in QUANTIZATIONS, "quantization", f"one of {list(QUANTIZATIONS)}")
        need(self.verifier_quantization in QUANTIZATIONS, "verifier_quantization", f"one of {list(QUANTIZATIONS)}")
        need(isinstance(self.dataset, str) and bool(self.dataset), "dataset",
             "'generated', a data file or a hub dataset id")
        for name in ("num_questions", "num_samples", "max_new_tokens", "per_class", "eval_num_questions",
                     "eval_per_class", "lora_r", "lora_alpha", "epochs", "batch_size", "score_batch_size"):
            need(whole(getattr(self, name)) and getattr(self, name) >= 1, name, "an integer >= 1")
        need(whole(self.max_batch_sequences) and self.max_batch_sequences >= 0, "max_batch_sequences",
             "an integer >= 0 (0: no bound)")
        need(whole(self.eval_bootstrap_resamples) and self.eval_bootstrap_resamples >= 100,
             "eval_bootstrap_resamples", "an integer >= 100")
        need(whole(self.seed) and self.seed >= 0, "seed", "an integer >= 0")
        need(self.num_threads is None or (whole(self.num_threads) and self.num_threads >= 1), "num_threads",
             "an integer >= 1 or empty")
        need(number(self.temperature) and self.temperature > 0, "temperature",
             "a number > 0 (the solutions are sampled)")
        need(number(self.top_p) and 0 < self.top_p <= 1, "top_p", "a number in (0, 1]")
        need(number(self.learning_rate) and self.learning_rate > 0, "learning_rate", "a number > 0")
        need(number(self.latter_fraction) and 0 < self.latter_fraction <= 1, "latter_fraction",
             "a number in (0, 1]")
        need(number(self.eval_threshold) and 0 <= self.eval_threshold <= 1, "eval_threshold", "a number in [0, 1]")
        need(self.model_dtype in MODEL_DTYPES, "model_dtype", f"one of {list(MODEL_DTYPES)}")
        need(isinstance(self.output_dir, str) and bool(self.output_dir.strip()), "output_dir", "a directory path")
        for name in ("require_answer", "fill_missing", "overwrite", "disable_progress"):
            need(isinstance(getattr(self, name), bool), name, "true or false")


# --------------------------------------------------------------------------------------------------- parsing
class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=36, width=118)


_DESCRIPTION = """\
Train MAPoRL's learned verifier (App. E): sample solutions of the training questions with the debaters' base model,
label them with the environment's gold check, balance correct and incorrect solutions per question, train the
verifier (token-level BCE over the latter half of each solution), save it to output_dir, and evaluate it on balanced
solutions of held-out questions (accuracy and AUC, next to the rule verifier). Then name output_dir as the debate
recipe's verifier:, e.g. recipes/configs/math_easy_debate_learned_verifier.yaml. Every field can be set in the
recipe file and overridden on the command line: --field value (true/false for flags, JSON for mappings)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise RecipeError(f"command line: {message}")


def _fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(VerifierTrainingConfig)}


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command's parser: ``--config`` and one ``--field`` per :class:`VerifierTrainingConfig` field (raw values,
    checked by :func:`~trl_multiagent.command.recipe.coerce_value`)."""
    parser = _Parser(prog=prog, usage="%(prog)s --config RECIPE.yaml [--field value ...]", description=_DESCRIPTION,
                     formatter_class=_HelpFormatter, allow_abbrev=False)
    parser.add_argument("--config", metavar="RECIPE.yaml", default=argparse.SUPPRESS,
                        help="The recipe: a YAML mapping of the fields below (the command line overrides it).")
    defaults = VerifierTrainingConfig()
    for name, f in _fields().items():
        default = getattr(defaults, name)
        shown = "empty" if default is None else json.dumps(default) if isinstance(default, (dict, bool)) else default
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "metavar": name.upper(),
                                  "help": f"{f.metadata['help']} (default: {shown})".replace("%", "%%")}
        if f.type in (bool, "bool"):
            kwargs.update(nargs="?", const="true")
        parser.add_argument(f"--{name}", **kwargs)
    return parser


#: A config file of this command says so (``command: train-verifier``), so that ``python -m trl_multiagent train``
#: can tell a user who passes it there which command it belongs to.
COMMAND_KEY, VERIFIER_COMMAND = "command", "train-verifier"


def parse_config(argv: Sequence[str], prog: str = PROG) -> tuple[VerifierTrainingConfig, dict[str, Any]]:
    """``(config, the values as given)`` from a command line ``--config FILE [--field value ...]``; every mistake is
    one :class:`RecipeError` naming the field and where it came from. ``--help`` prints the fields and exits."""
    from trl_multiagent.command.recipe import _hints, coerce_value, unknown_key_message

    parser = build_parser(prog)
    namespace, rest = parser.parse_known_args(list(argv))
    fields = _fields()
    if rest:
        token = next((t for t in rest if t.startswith("-")), rest[0])
        if token.startswith("--"):
            raise RecipeError(unknown_key_message(token[2:].split("=", 1)[0].replace("-", "_"),
                                                  set(fields) | {"config"}, "command line"))
        raise RecipeError(f"command line: unexpected argument {token!r} (options look like --field value)")
    cli_values = vars(namespace)
    path = cli_values.pop("config", None)
    file_values: dict[str, Any] = {}
    source = "command line"
    if path is not None:
        source = str(path)
        file_values = read_recipe_file(path)
        apply_env_block(file_values, source)
        command = file_values.pop(COMMAND_KEY, VERIFIER_COMMAND)
        if command != VERIFIER_COMMAND:
            raise RecipeError(f"{source}: {COMMAND_KEY}: {command!r} names another command; this one is "
                              f"{VERIFIER_COMMAND!r} (python -m trl_multiagent {VERIFIER_COMMAND})")
    hints = _hints(VerifierTrainingConfig)
    given: dict[str, Any] = {}
    for origin, values in ((source, file_values), ("command line", cli_values)):
        for key, value in values.items():
            if key not in fields:
                raise RecipeError(unknown_key_message(key, set(fields), origin))
            given[key] = coerce_value(key, value, hints[key], origin)
    try:
        config = VerifierTrainingConfig(**given)
    except (ValueError, TypeError) as exc:
        field_name = str(exc).split(" ", 1)[0]  # every check's message starts with the field's name
        origin = "command line" if field_name in cli_values else source
        raise RecipeError(f"{origin}: {exc}") from exc
    return config, given


# --------------------------------------------------------------------------------------------------- checks
def check_output_dir(output_dir: str | Path, overwrite: bool) -> None:
    """Refuse an ``output_dir`` that is a file, that cannot be created or written, or that is not empty (unless
    ``overwrite``). Creates the directory (empty) to prove that it can be written."""
    if not str(output_dir).strip():
        raise RecipeError("output_dir is empty; give the directory the verifier and its results go to")
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise RecipeError(f"output_dir {str(path)!r} is an existing file, not a directory; choose another output_dir")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        found = sorted(p.name for p in path.iterdir())
        raise RecipeError(f"output_dir {str(path)!r} already exists and is not empty ({', '.join(found[:4])}); it is "
                          "never overwritten silently. Choose another --output_dir, or pass --overwrite true to "
                          "replace the results of an earlier run there.")
    ancestor = path
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise RecipeError(f"output_dir {str(path)!r} cannot be created: {str(ancestor)!r} is a file")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise RecipeError(f"output_dir {str(path)!r} cannot be written ({exc.strerror or exc}); choose another "
                          "output_dir") from exc


def _numeric(answer: Any) -> bool:
    try:
        float(str(answer).replace(",", ""))
    except ValueError:
        return False
    return True


class VerifierDataError(RuntimeError):
    """The sampled solutions cannot make balanced training or held-out data (reported after sampling)."""
