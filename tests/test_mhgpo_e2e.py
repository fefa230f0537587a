"""End to end on the embedded model: recipes/mhgpo.py trains the search system for one step and writes the
before/after evaluation (EM, F1, accuracy, per-agent output statistics, paired gains) with the command and the recipe
to summary.json."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mhgpo_recipe_on_the_embedded_model(tmp_path):
    sys.path.insert(0, str(ROOT / "recipes"))
    import mhgpo as recipe_script

    out = tmp_path / "run"
    code = recipe_script.main([
        # the demo config (3 candidates, 2 selected, beta 0: short prompts, no reference pass) switched to RR
        "--config", str(ROOT / "recipes/configs/search_qa_mhgpo_demo.yaml"), "--output_dir", str(out),
        "--sampling", "round_robin", "--fork_probabilities", "[0.7, 0.1, 0.2]",
        "--max_steps", "1", "--episodes_per_step", "2", "--num_generations", "2", "--max_completion_length", "8",
        "--eval_num_problems", "2", "--eval_max_new_tokens", "8", "--num_tasks", "8", "--disable_tqdm", "true",
    ])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "MHGPO" and summary["global_step"] == 1
    assert summary["recipe"]["sampling"] == "round_robin"  # the recipe as given
    assert "recipes/mhgpo.py --config" in summary["command"]  # as launched (python, accelerate launch, torchrun)
    ev = summary["evaluation"]
    assert ev["evaluator"] == "pipeline" and ev["metric"] == "f1" and ev["held_out_tasks"] == 2
    metrics = ev["methods"]["team"]["metrics"]
    assert {"em", "f1", "acc", "agent/rewriter/num_queries", "agent/reranker/num_selected",
            "agent/answerer/answer_words"} <= set(metrics)
    for stage in ("before", "after"):
        assert 0.0 <= metrics["em"][stage]["mean"] <= metrics["acc"][stage]["mean"] <= 1.0
    assert set(metrics["f1"]["gain"]) == {"mean", "ci95"}
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("agent/rewriter/similarity" in row and "env/f1" in row for row in logged)
    assert (out / "adapters" / "shared" / "adapter_model.safetensors").is_file()
