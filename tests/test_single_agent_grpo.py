"""docs/results/math_generalisation/single_agent_grpo.py: one agent trained with TRL's GRPOTrainer on the budget of
a team run, evaluated on the team's held-out problems and paired with the team by problem (issue 37, item 4)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.tiny import save_tiny
from trl_multiagent.environments.math_tool import MathToolGeneralisationEnv

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "results" / "math_generalisation" / "single_agent_grpo.py"
CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")


def _script():
    spec = importlib.util.spec_from_file_location("single_agent_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_single_agent_trains_on_the_team_budget_and_is_paired_with_the_team_by_problem(tmp_path):
    from transformers import AutoTokenizer

    model = save_tiny(tmp_path / "model", chars=list("abcdefghijklmnopqrstuvwxyz0123456789 .,:?!{}"))
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = CHAT
    tok.save_pretrained(model)
    held = MathToolGeneralisationEnv.make_dataset(num_tasks=6, seed=0, split="test").to_dict()
    team_scores = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]
    team = tmp_path / "team"
    team.mkdir()
    (team / "summary.json").write_text(json.dumps({
        "command": "the team run",
        "recipe": {"environment": "math_tool_generalisation", "env_kwargs": {"max_turns": 2}, "model": model,
                   "lora_r": 4, "lora_alpha": 8, "num_tasks": 16, "eval_num_problems": 6, "eval_max_new_tokens": 3},
        "config": {"seed": 0, "num_generations": 2, "max_completion_length": 3, "temperature": 0.7, "top_p": 1.0,
                   "learning_rate": 1e-3, "lr_scheduler_type": "constant", "alpha": 1.0},
        "generated_samples": {"completion_tokens": 20},
        "evaluation": {"task_ids": held["task_id"]}}))
    (team / "eval_per_task.jsonl").write_text("\n".join(
        json.dumps({"stage": stage, "method": "team", "task_id": t, "final/team_correct": v if stage == "after" else 0.0})
        for stage in ("before", "after") for t, v in zip(held["task_id"], team_scores)))
    out = tmp_path / "single"
    work = tmp_path / "work"
    assert _script().main(["--team", str(team), "--out", str(out), "--work", str(work), "--max_steps", "10"]) == 0

    result = json.loads((out / "result.json").read_text())
    training = result["training"]
    # 8 completions of 1-3 tokens per step (4 prompts x K = 2): the step that reaches 20 tokens is the last
    assert training["budget"] == 20 and 20 <= training["completion_tokens"] < 20 + 8 * 3
    assert 1 <= training["steps"] <= 3
    assert (work / "adapter" / "adapter_model.safetensors").is_file() and not (out / "adapter").exists()
    rows = [json.loads(line) for line in (out / "per_task.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == held["task_id"] and [r["team"] for r in rows] == team_scores
    assert [r["held_out_set"] for r in rows] == ["unseen_operands"] * 4 + ["unseen_form"] * 2
    single = [r["single_agent"] for r in rows]
    assert set(result["sets"]) == {"all", "unseen_operands", "unseen_form"}
    for name, idx in (("all", range(6)), ("unseen_operands", range(4)), ("unseen_form", range(4, 6))):
        entry = result["sets"][name]
        diff = sum(team_scores[i] - single[i] for i in idx) / len(idx)
        assert entry["tasks"] == len(idx) and entry["team_minus_single"]["mean"] == pytest.approx(diff)
        assert entry["team"]["mean"] == pytest.approx(sum(team_scores[i] for i in idx) / len(idx))
    texts = [json.loads(line) for line in (out / "texts.jsonl").read_text().splitlines()]
    assert len(texts) == 6 and {t["agent"] for t in texts} == {"reasoner"}


def test_a_team_run_without_a_token_count_is_refused(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"recipe": {}, "config": {}, "generated_samples": {"total": 4}}))
    with pytest.raises(SystemExit, match="completion_tokens"):
        _script().read_team(tmp_path)
