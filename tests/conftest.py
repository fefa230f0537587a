import os
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `tests/tiny.py` imports from the repo root
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: one thread is fastest; trainers respect it

import torch  # noqa: E402

from tests.tiny import save_tiny  # noqa: E402

# The in-process tests run tiny models: one thread avoids oversubscription overhead (several times faster on 2 cores).
# TEST_NUM_THREADS sets another count: tests/numerics_matrix.py runs the numerical tests with one and with two threads
# (a kernel splits its sums by thread), as numerical comparisons must hold either way (tests/numerics.py).
torch.set_num_threads(int(os.environ.get("TEST_NUM_THREADS", "1")))


#: The packages whose versions the suite's header names (the trainers rest on their private surface: compat.py).
REPORTED_PACKAGES = ("trl", "transformers", "torch", "peft", "accelerate")


def pytest_report_header(config) -> str:
    """The versions of trl, transformers, torch, peft and accelerate the suite runs against, in pytest's header."""

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return "against: " + ", ".join(f"{name} {installed(name)}" for name in REPORTED_PACKAGES)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Under ``-q`` (the Makefile's), where pytest prints no header, the same line at the end of the output."""
    if config.get_verbosity() < 0:
        terminalreporter.write_line(pytest_report_header(config))


@pytest.fixture(scope="session")
def tiny_ab_model(tmp_path_factory) -> str:
    """A tiny random model whose vocabulary is <pad>, <eos>, <unk>, A, B."""
    return save_tiny(tmp_path_factory.mktemp("tiny_ab"))


@pytest.fixture(scope="session")
def tiny_text_model(tmp_path_factory) -> str:
    """A tiny random model over lowercase letters, digits and a little punctuation."""
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789 .,:?!AB")
    return save_tiny(tmp_path_factory.mktemp("tiny_text"), chars=chars)
