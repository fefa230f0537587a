"""The private surface of TRL and transformers the trainers rely on (trl_multiagent/trainers/compat.py) is what it was
written against: every mirrored signature is unchanged, and every attribute TRL's loss and logging read is set."""

import ast
import importlib
import inspect
import textwrap

import pytest
import transformers
import trl

from trl_multiagent.trainers import compat


def _resolve(dotted: str):
    module_name, cls_name, attr = dotted.rsplit(".", 2)
    return getattr(getattr(importlib.import_module(module_name), cls_name), attr)


@pytest.mark.parametrize("name", sorted(compat.MIRRORED))
def test_mirrored_private_signature_is_unchanged(name):
    actual = str(inspect.signature(_resolve(name)))
    assert actual == compat.MIRRORED[name], (
        f"{name} changed in this trl {trl.__version__} / transformers {transformers.__version__} (tested: "
        f"{compat.TESTED_VERSIONS}); review trl_multiagent/trainers/compat.py before widening the pins.\n"
        f"  recorded: {compat.MIRRORED[name]}\n  now:      {actual}")


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_installed_versions_are_within_the_tested_minor_releases():
    for package, version in (("trl", trl.__version__), ("transformers", transformers.__version__)):
        low, high = compat.TESTED_VERSIONS[package]
        assert _minor(low) <= _minor(version) <= _minor(high), f"{package} {version} is not within {low}.x-{high}.x"


def test_pyproject_pins_the_tested_minor_ranges():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    for package, (low, high) in compat.TESTED_VERSIONS.items():
        (major, minor), (high_major, high_minor) = _minor(low), _minor(high)
        assert (major, minor) <= (high_major, high_minor), f"{package}: {low} is above {high}"
        pins = re.findall(rf'"{package}([<>=][^"]*)"', text)
        want = f">={major}.{minor},<{high_major}.{high_minor + 1}"
        assert pins == [want], f"pyproject.toml pins {package} as {pins}, the tested range is {want}"


def _self_attributes_read(func) -> set[str]:
    """Names ``self.<name>`` read in ``func``'s source (not assigned to, not called as methods)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    reads = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and isinstance(node.ctx, ast.Load)):
            reads.add(node.attr)
    return reads


def test_every_attribute_trls_loss_and_logging_read_is_set(tiny_ab_model, tmp_path):
    from datasets import Dataset

    from trl_multiagent.environments import MatrixGameEnv
    from trl_multiagent.team.pool import AgentSpec
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], disable_tqdm=True, max_completion_length=1)
    trainer = MAGRPOTrainer([AgentSpec("agent1", model=tiny_ab_model, lora_r=4),
                                     AgentSpec("agent2", model=tiny_ab_model, lora_r=4)], MatrixGameEnv, args,
                                    Dataset.from_dict({"task_id": [0, 1]}))
    read = set()
    for method in (trl.GRPOTrainer._compute_loss, trl.GRPOTrainer._get_per_token_logps_and_entropies,
                   trl.GRPOTrainer.log):
        read |= _self_attributes_read(method)
    missing = sorted(name for name in read if not hasattr(trainer, name))
    assert not missing, f"GRPOTrainer reads attributes that set_grpo_state does not set: {missing}"
