"""``train-single`` (trl_multiagent/command/train_single.py): each agent of a team trained alone with TRL's
GRPOTrainer on the budget of a team run, evaluated on the team's held-out problems and paired with the team by problem
(issue 37, item 4; issue 60, item 2)."""

from __future__ import annotations

import json

import pytest

from tests.tiny import save_tiny
from trl_multiagent.command.cli import main as cli_main
from trl_multiagent.command.train_single import SingleAgentError, read_team
from trl_multiagent.environments.math_tool import MathToolGeneralisationEnv

CHAT = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")


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
                   "eval_metric": "final/team_correct",
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
    assert cli_main(["train-single", "--team", str(team), "--out", str(out), "--work", str(work), "--max_steps", "10",
                     "--agent", "reasoner", "--agent", "tool"]) == 0

    result = json.loads((out / "result.json").read_text())
    assert set(result["training"]) == {"reasoner", "tool"} and result["metric"] == "final/team_correct"
    training = result["training"]["reasoner"]
    # 8 completions of 1-3 tokens per step (4 prompts x K = 2): the step that reaches 20 tokens is the last
    assert training["budget"] == 20 and 20 <= training["completion_tokens"] < 20 + 8 * 3
    assert 1 <= training["steps"] <= 3
    for agent in ("reasoner", "tool"):
        assert (work / agent / "adapter" / "adapter_model.safetensors").is_file()
    rows = [json.loads(line) for line in (out / "per_task.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == held["task_id"] and [r["team"] for r in rows] == team_scores
    assert [r["held_out_set"] for r in rows] == ["unseen_operands"] * 4 + ["unseen_form"] * 2
    for agent in ("reasoner", "tool"):
        single = [r[f"{agent}_alone_grpo"] for r in rows]
        assert set(result["sets"][agent]) == {"all", "unseen_operands", "unseen_form"}
        for name, idx in (("all", range(6)), ("unseen_operands", range(4)), ("unseen_form", range(4, 6))):
            entry = result["sets"][agent][name]
            diff = sum(team_scores[i] - single[i] for i in idx) / len(idx)
            assert entry["tasks"] == len(idx) and entry["team_minus_single"]["mean"] == pytest.approx(diff)
            assert entry["team"]["mean"] == pytest.approx(sum(team_scores[i] for i in idx) / len(idx))
    means = {a: result["sets"][a]["all"]["single_agent"]["mean"] for a in ("reasoner", "tool")}
    assert result["best_single_agent"] == max(means, key=means.get)
    texts = [json.loads(line) for line in (out / "texts.jsonl").read_text().splitlines()]
    assert len(texts) == 12 and {t["agent"] for t in texts} == {"reasoner", "tool"}


def test_a_team_run_without_a_token_count_is_refused(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"recipe": {}, "config": {}, "generated_samples": {"total": 4}}))
    with pytest.raises(SingleAgentError, match="completion_tokens"):
        read_team(tmp_path)
