"""A normal run prints no warnings raised by the project's own calls (issue: every run printed transformers'
FutureWarning about `is_gradient_checkpointing`)."""

import warnings

from datasets import Dataset

from trl_multiagent.environments import MatrixGameEnv
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer


def test_a_short_training_raises_no_warning_from_the_project_or_about_deprecated_names(tiny_ab_model, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("error", module=r"trl_multiagent(\..*)?")  # raised from the project's own code
        args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=1,
                                    num_generations=4, generation_kwargs={"suppress_tokens": [0, 1, 2]},
                                    save_strategy="no", disable_tqdm=True, max_steps=2, logging_steps=1)
        agents = [AgentSpec("agent1", model=tiny_ab_model, lora_r=4), AgentSpec("agent2", model=tiny_ab_model, lora_r=4)]
        trainer = MAGRPOTrainer(agents, MatrixGameEnv, args, Dataset.from_dict({"task_id": list(range(16))}))
        trainer.train()
    deprecated = [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    assert deprecated == []
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "trl_multiagent" in w.filename]
    assert ours == []


def test_notices_that_do_not_concern_the_run_are_not_printed():
    """bitsandbytes' "no 'kernels' package" notice (nothing is 4-bit here) is dropped; Math-Verify's "Timeout is
    disabled", which it logs at every comparison outside the main thread, becomes one line of ours (issue 62)."""
    import subprocess
    import sys

    code = """
import logging, threading
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
import trl_multiagent.team.pool  # imports peft, transformers and bitsandbytes
from trl_multiagent.metrics.answers import answers_match
results = []
def compare():
    results.extend([answers_match("1/2", "0.5"), answers_match("3", "4"), answers_match("7", "7.0")])
thread = threading.Thread(target=compare)
thread.start(); thread.join()
print("RESULTS", results)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "RESULTS [True, False, True]" in text
    assert "kernels" not in text and "Timeout is disabled" not in text, text[-3000:]
    assert text.count("Math-Verify compares answers without its timeouts") == 1, text[-3000:]


def test_from_python_a_library_warning_has_its_logger_prefix_once():
    """A program that configures no logging sees a warning of the library as the command line shows it,
    ``WARNING trl_multiagent.<module>: ...`` (not Python's bare last-resort message); one that configures logging
    sees it once, through its own handler (issue 62)."""
    import subprocess
    import sys

    code = """
import logging, sys
import trl_multiagent
logging.getLogger("trl_multiagent.command.saved_team").warning("first %s", 1)
logging.getLogger("trl_multiagent.command.saved_team").info("not shown")
logging.basicConfig(stream=sys.stderr, format="mine: %(name)s: %(message)s")
logging.getLogger("trl_multiagent.command.saved_team").warning("second")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.splitlines() == ["WARNING trl_multiagent.command.saved_team: first 1", "mine: trl_multiagent.command.saved_team: second"]
