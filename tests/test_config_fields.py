"""Every field of every trainer config is read by code that runs, or refused, or deliberately inert (issue 66, item 3).

A field counts as read when this library's code reads it (an attribute ``.<name>`` loaded anywhere in the package,
``getattr(x, "<name>")``, or an alias moved by ``take_alias(self, "<name>", ...)``), or when code of transformers and
TRL that the trainers run reads it:

* the methods of ``transformers.Trainer`` and ``trl.GRPOTrainer`` reachable from the trainers: those the package
  calls (``self.<m>``, ``super().<m>``, ``Trainer.<m>(self, ...)``, ``GRPOTrainer.<m>(self, ...)``) and, from them,
  every ``self.<m>`` that resolves to an upstream method (a method the trainers override is theirs, scanned with the
  package). ``GRPOTrainer.__init__`` is never reached (the trainers run ``Trainer.__init__`` instead, compat.py), nor
  its generation; the evaluation methods are left out (:data:`NOT_RUN`: ``Trainer.__init__`` refuses an
  ``eval_strategy`` without an eval dataset, and the trainers never pass one);
* transformers' modules of the training loop's helpers (callbacks, optimizers, schedulers, the integrations that
  ``report_to`` names) and ``TrainingArguments`` itself (its ``__post_init__`` and properties run).

``GRPOConfig.__post_init__`` runs too but only checks or derives values; the fields it moves into another field are
listed in :data:`TAKEN_OVER` and checked. Everything else must be refused at non-default values
(``trl_multiagent/trainers/unused_fields.py: UNUSED_GRPO_FIELDS``) or be on its commented allow-list
(``INERT_FIELDS``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trl_multiagent"
UPSTREAM = ("transformers.", "trl.")
#: Upstream methods that never run in a team trainer: the evaluation through ``Trainer`` (no eval dataset is ever
#: passed, and ``Trainer.__init__`` refuses an ``eval_strategy`` without one).
NOT_RUN = frozenset({"evaluate", "_evaluate", "predict", "evaluation_loop", "prediction_step", "get_eval_dataloader",
                     "get_test_dataloader", "_get_eval_sampler"})
#: transformers' modules whose ``args.<name>`` reads count (the training loop's helpers and TrainingArguments).
TRANSFORMERS_MODULES = ("trainer_callback.py", "trainer_optimizer.py", "trainer_pt_utils.py", "trainer_utils.py",
                        "optimization.py", "training_args.py", "integrations/integration_utils.py")
#: Fields that a ``__post_init__`` that runs moves into another field: name -> (the field it sets, a value to try).
TAKEN_OVER = {
    "gradient_checkpointing_kwargs": ("activation_checkpointing_kwargs", {"use_reentrant": False}),  # transformers
    "vllm_importance_sampling_cap": ("vllm_importance_sampling_clip_max", 2.5),  # GRPOConfig.__post_init__
    "gradient_checkpointing": ("activation_checkpointing", True),  # transformers' deprecated alias
}
#: Refused fields that transformers reads nonetheless, only where that reading changes nothing here (a listed field
#: read anywhere else is listed wrongly): name -> where and why.
READ_BUT_UNUSED = {
    "train_sampling_strategy": "Trainer._validate_args only warns about it; Trainer._get_train_sampler, which uses "
                               "it, is replaced (compat.py: task_sampler)",
    "label_smoothing_factor": "Trainer.__init__ builds a label smoother that only Trainer.compute_loss calls, which "
                              "the trainers never run",
}


def _function(obj):
    if isinstance(obj, property):
        return obj.fget
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    return obj if inspect.isfunction(obj) else None


def _tree(fn) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def _upstream(cls: type, name: str):
    """``(class, function)`` that ``name`` resolves to on ``cls`` when transformers or TRL defines it, else None."""
    for klass in cls.__mro__:
        if name in vars(klass):
            fn = _function(vars(klass)[name])
            return (klass, fn) if fn is not None and klass.__module__.startswith(UPSTREAM) else None
    return None


def _names_read(tree: ast.AST, own_fields: bool = False) -> set[str]:
    """Attributes read: every ``.<name>`` load (``own_fields``: only of ``self``), ``getattr(x, "<name>")`` and the
    old name of ``take_alias(self, "<name>", ...)``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            if not own_fields or (isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2 and \
                node.func.id in ("getattr", "hasattr", "take_alias") and isinstance(node.args[1], ast.Constant):
            names.add(node.args[1].value)
    return names


def _args_read(tree: ast.AST) -> set[str]:
    """``args.<name>`` and ``self.args.<name>`` loads, and ``getattr(args, "<name>")``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "args") or \
                    (isinstance(owner, ast.Attribute) and owner.attr == "args"):
                names.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and \
                len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and \
                ast.unparse(node.args[0]) in ("args", "self.args"):
            names.add(node.args[1].value)
    return names


@functools.cache
def trainer_classes() -> tuple[type, ...]:
    from trl_multiagent.trainers import TRAINERS

    return tuple(trainer for _, trainer in TRAINERS.values())


@functools.cache
def upstream_methods_run() -> frozenset:
    """The upstream ``(class, function)`` pairs the trainers run (module docstring)."""
    from transformers import Trainer
    from trl import GRPOTrainer

    explicit = {"Trainer": Trainer, "GRPOTrainer": GRPOTrainer}
    queue = []
    for path in (PACKAGE / "trainers").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id == "self":
                queue += [_upstream(cls, node.attr) for cls in trainer_classes()]
            elif isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                queue.append(_upstream(GRPOTrainer, node.attr))
            elif isinstance(owner, ast.Name) and owner.id in explicit:
                queue.append(_upstream(explicit[owner.id], node.attr))
    seen = set()
    while queue:
        found = queue.pop()
        if found is None or found in seen or found[1].__name__ in NOT_RUN:
            continue
        seen.add(found)
        tree = _tree(found[1])
        if tree is not None:
            queue += [_upstream(cls, name) for name in _names_read(tree, own_fields=True) for cls in trainer_classes()]
    return frozenset(seen)


@functools.cache
def fields_read() -> dict[str, str]:
    """Every name read, with who reads it (the first reader found)."""
    import transformers

    readers: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _names_read(ast.parse(path.read_text())):
            readers.setdefault(name, f"trl_multiagent/{path.relative_to(PACKAGE)}")
    for klass, fn in sorted(upstream_methods_run(), key=lambda kf: (kf[0].__name__, kf[1].__name__)):
        tree = _tree(fn)
        for name in _args_read(tree) if tree is not None else ():
            readers.setdefault(name, f"{klass.__name__}.{fn.__name__}")
    root = Path(transformers.__file__).parent
    for module in TRANSFORMERS_MODULES:
        tree = ast.parse((root / module).read_text())
        names = _args_read(tree) | (_names_read(tree, own_fields=True) if module == "training_args.py" else set())
        for name in names:
            readers.setdefault(name, f"transformers/{module}")
    return readers


def all_fields() -> dict[str, list[str]]:
    """Every init field of every trainer config -> the trainers whose config has it."""
    from trl_multiagent.trainers import TRAINERS

    out: dict[str, list[str]] = {}
    for trainer, (config_class, _) in TRAINERS.items():
        for f in dataclasses.fields(config_class):
            if f.init:
                out.setdefault(f.name, []).append(trainer)
    return out


def test_every_field_of_every_trainer_config_is_read_refused_or_inert():
    from trl_multiagent.trainers.unused_fields import INERT_FIELDS, UNUSED_GRPO_FIELDS

    read = fields_read()
    unread = sorted(name for name in all_fields() if name not in read and name not in UNUSED_GRPO_FIELDS
                    and name not in INERT_FIELDS and name not in TAKEN_OVER)
    assert not unread, (f"config fields nothing reads: {unread}; make them work, refuse them (unused_fields.py: "
                        "UNUSED_GRPO_FIELDS) or allow them with a reason (INERT_FIELDS)")


def test_the_run_upstream_code_is_what_the_trainers_reach():
    """The reachability above reaches TRL's loss and logging and transformers' loop, never GRPOTrainer.__init__ or
    its generation, and every method named in NOT_RUN exists (a renamed one would silently count again)."""
    from transformers import Trainer
    from trl import GRPOTrainer

    reached = {f"{k.__name__}.{f.__name__}" for k, f in upstream_methods_run()}
    for name in ("Trainer.__init__", "Trainer.train", "Trainer._inner_training_loop", "GRPOTrainer._compute_loss",
                 "GRPOTrainer.log"):
        assert name in reached, name
    for name in ("GRPOTrainer.__init__", "GRPOTrainer._generate_and_score_completions", "GRPOTrainer._prepare_inputs",
                 "GRPOTrainer.prediction_step", "Trainer.evaluate"):
        assert name not in reached, name
    assert all(hasattr(Trainer, n) or hasattr(GRPOTrainer, n) for n in NOT_RUN)


def test_the_refused_and_inert_lists_hold_only_fields_nothing_reads():
    """A listed field that something reads is listed wrongly (it would be refused while it works), and a listed
    name that is no field is stale."""
    from trl_multiagent.trainers.unused_fields import INERT_FIELDS, UNUSED_GRPO_FIELDS

    fields, read = all_fields(), fields_read()
    for name in [*UNUSED_GRPO_FIELDS, *INERT_FIELDS, *TAKEN_OVER]:
        assert name in fields, f"{name} is no field of any trainer config"
    for name in [*UNUSED_GRPO_FIELDS, *INERT_FIELDS]:
        assert name not in read or (name in READ_BUT_UNUSED and not read[name].startswith("trl_multiagent/")), \
            f"{name} is listed as unused but {read[name]} reads it"
    assert set(READ_BUT_UNUSED) <= set(UNUSED_GRPO_FIELDS)


@pytest.mark.parametrize("trainer", ["magrpo", "at_grpo", "mhgpo", "collm", "maporl"])
def test_an_unused_field_is_refused_in_one_line_and_its_default_accepted(trainer, tmp_path):
    from trl_multiagent.trainers import TRAINERS
    from trl_multiagent.trainers.unused_fields import UNUSED_GRPO_FIELDS, field_default

    config_class = TRAINERS[trainer][0]
    config_class(output_dir=str(tmp_path), **{n: field_default(config_class, n) for n in UNUSED_GRPO_FIELDS})
    for name in UNUSED_GRPO_FIELDS:
        default = field_default(config_class, name)
        other = (not default) if isinstance(default, bool) else "not-the-default"
        with pytest.raises(ValueError) as info:
            config_class(output_dir=str(tmp_path), **{name: other})
        message = str(info.value)
        assert message.startswith(f"{name} is a GRPOConfig field this library does not use: "), message
        assert "\n" not in message


def test_fields_taken_over_by_a_post_init_reach_the_field_that_is_read(tmp_path):
    from trl_multiagent.trainers import MAGRPOConfig

    read = fields_read()
    for name, (target, value) in TAKEN_OVER.items():
        assert target in read, target
        config = MAGRPOConfig(output_dir=str(tmp_path), **{name: value})
        assert getattr(config, target) == value, name


def test_trl_per_token_options_are_refused_with_the_whole_response_objective(tmp_path):
    from trl_multiagent.trainers import MAGRPOConfig

    with pytest.raises(ValueError, match="use_bias_correction_kl is an option of TRL's per-token losses"):
        MAGRPOConfig(output_dir=str(tmp_path), use_bias_correction_kl=True)
    assert MAGRPOConfig(output_dir=str(tmp_path), loss_type="grpo", use_bias_correction_kl=True)


@pytest.mark.parametrize("trainer, k, batch, seen", [
    ("magrpo", 4, 8, (4, 1)),        # the values the config means
    ("magrpo", 3, 2, (3, 3)),        # K does not divide the micro-batch
    ("collm", 1, 8, (2, 1)),  # one path per episode
])
def test_grpo_config_sees_the_values_a_team_config_means(trainer, k, batch, seen, tmp_path, monkeypatch):
    """GRPOConfig.__post_init__ is given a team config's own K and steps_per_generation 1, but for the one exception
    (base_config.grpo_group_check_values): where its checks of TRL's prompt groups refuse them (K = 1; a K that does
    not divide per_device_train_batch_size), as a plain GRPOConfig does, those checks see the nearest values they
    accept. The team config keeps its own values either way."""
    from trl import GRPOConfig

    from trl_multiagent.trainers import TRAINERS

    plain = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, bf16=False, num_generations=k,
                 per_device_train_batch_size=batch, steps_per_generation=1)
    if seen == (k, 1):
        GRPOConfig(**plain)
    else:
        with pytest.raises(ValueError, match="must be divisible by num_generations|at least 2 generations"):
            GRPOConfig(**plain)
    checked, post_init = [], GRPOConfig.__post_init__

    def spy(self):
        checked.append((self.num_generations, self.steps_per_generation))
        post_init(self)

    monkeypatch.setattr(GRPOConfig, "__post_init__", spy)
    config = TRAINERS[trainer][0](output_dir=str(tmp_path), report_to=[], num_generations=k,
                                  per_device_train_batch_size=batch)
    assert checked == [seen]
    assert (config.num_generations, config.steps_per_generation) == (k, 1)
    assert config.generation_batch_size == batch * config.world_size


def test_disable_dropout_switches_every_dropout_of_the_team_off(tiny_ab_model, tmp_path):
    """GRPOConfig's disable_dropout, which GRPOTrainer.__init__ applies to its model, applies to the team's pool."""
    import torch
    from datasets import Dataset

    from trl_multiagent import AgentSpec, MAGRPOConfig, MAGRPOTrainer
    from trl_multiagent.environments import MatrixGameEnv

    def trainer(disable: bool):
        agents = [AgentSpec("agent1", model=tiny_ab_model, lora_dropout=0.1),
                  AgentSpec("agent2", model=tiny_ab_model, lora_dropout=0.1)]
        args = MAGRPOConfig(output_dir=str(tmp_path / str(disable)), max_steps=1, report_to=[],
                                    disable_dropout=disable, num_generations=2, max_completion_length=2)
        return MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": [0, 1]}))

    def rates(t):
        return {m.p for m in t.pool.modules() if isinstance(m, torch.nn.Dropout)}

    assert 0.1 in rates(trainer(False))
    assert rates(trainer(True)) == {0}
