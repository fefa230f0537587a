"""docs/guides/from_trl.md runs as written (issue 66, item 6): its TRL script and its team port each train two steps on
a tiny chat model put in place of ``MODEL``, and its recipe passes every check before a model loads."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from tests.tiny import save_tiny

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "from_trl.md"
CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")


def blocks(kind: str) -> list[str]:
    text = GUIDE.read_text()
    return [part.split("```", 1)[0] for part in text.split(f"```{kind}\n")[1:]]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> str:
    from transformers import AutoTokenizer

    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    path = save_tiny(tmp_path_factory.mktemp("chat"), chars=chars, max_positions=1024)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = CHAT
    tok.save_pretrained(path)
    return path


@pytest.mark.slow
def test_the_trl_script_and_its_team_port_train_as_written(chat_model, tmp_path, monkeypatch):
    trl_script, team_port = blocks("python")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(trl_script.replace('MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"', f"MODEL = {chat_model!r}"),
                 "from_trl.md (TRL)", "exec"), namespace)
    assert namespace["trainer"].state.global_step == 2
    exec(compile(team_port, "from_trl.md (team)", "exec"), namespace)
    team = namespace["team"]
    assert team.state.global_step == 2 and (tmp_path / "outputs" / "team-solver" / "adapters" / "solver").is_dir()
    # each agent is scored by both functions on its own answer
    env = namespace["env"]()
    env.reset(namespace["dataset"][0])
    result = env.step({"solver": "\\boxed{5}", "checker": "\\boxed{6}"})
    assert result.info == {"solver/accuracy_reward": 1.0, "solver/short": 1.0, "checker/accuracy_reward": 0.0,
                           "checker/short": 1.0}
    assert result.team_reward == 1.0 + 0.5 + 0.0 + 0.5


def test_the_guides_recipe_passes_every_check(tmp_path, monkeypatch):
    from trl_multiagent.command.cli import parse_recipe
    from trl_multiagent.command.runner import Run

    (recipe_text,) = blocks("yaml")
    team_port = blocks("python")[1]
    functions = team_port.split("\n\n\nenv = ")[0].replace(
        "from trl_multiagent import AgentSpec, FunctionEnvironment, MAGRPOConfig, MAGRPOTrainer\n", "")
    short = blocks("python")[0].split("def short")[1].split("\n\n\n")[0]
    (tmp_path / "my_task.py").write_text(functions + "\n\ndef short" + short + "\n")
    (tmp_path / "my_data.jsonl").write_text("".join(json.dumps({
        "prompt": [{"role": "user", "content": f"What is {a} + 1?"}], "solution": f"${a + 1}$"}) + "\n"
        for a in range(4)))
    monkeypatch.chdir(tmp_path)
    run = Run(*parse_recipe(["--output_dir", str(tmp_path / "out"), "--eval_stages", "[]"], yaml_text=recipe_text))
    run.prepare()
    env = run.env_factory()
    assert env.reward_names == ["accuracy_reward", "short"] and env.reward_weights == [1.0, 0.5]
