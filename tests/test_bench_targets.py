"""benchmarks/targets.py's bounds, by hand: the FLOPs per token of a model counted from its linear layers, and the
loss passes against the matmul rate."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.tiny import save_tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from targets import TARGETS, decode_ratios, linear_flops_per_token, target, train_pass_bound, train_pass_flops  # noqa: E402


def test_flops_per_token_are_twice_the_linear_weights_of_the_layers(tmp_path):
    from transformers import AutoModelForCausalLM

    path = save_tiny(tmp_path / "m", chars=list("abcdef"))
    model = AutoModelForCausalLM.from_pretrained(path)
    layer_weights = sum(m.weight.numel() for name, m in model.named_modules()
                        if isinstance(m, torch.nn.Linear) and ".layers." in name)
    flops = linear_flops_per_token(path)
    assert flops["layers"] == 2 * layer_weights
    assert flops["lm_head"] == 2 * model.config.hidden_size * model.config.vocab_size


def test_train_pass_flops_count_the_lora_matrices_and_attention_by_hand(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = save_tiny(tmp_path / "m", chars=list("abcdef"))
    model = AutoModelForCausalLM.from_pretrained(path)
    c = model.config
    lora = get_peft_model(model, LoraConfig(r=3, target_modules="all-linear", task_type="CAUSAL_LM"))
    lora_weights = sum(p.numel() for name, p in lora.named_parameters() if "lora_" in name)
    flops = train_pass_flops(path, 3)
    assert flops["lora"] == 2 * lora_weights  # every LoRA weight multiplies once per position
    head_dim = c.hidden_size // c.num_attention_heads
    assert flops["attention_pair"] == c.num_hidden_layers * c.num_attention_heads * (2 * head_dim + 2 * head_dim)
    assert flops["layers"] == linear_flops_per_token(path)["layers"]


def test_train_pass_ratio_by_hand():
    flops = {"layers": 10.0, "lm_head": 2.0, "lora": 1.0, "attention_pair": 0.5}
    counts = {"tokens/loss_needed": 5, "tokens/loss_completions": 3, "tokens/loss_attention_pairs": 8}
    records = [{"time/forward": 9.0, "time/backward": 9.0, **counts},
               {"step_time": 4.0},  # a line without the loss's numbers is skipped
               {"time/forward": 1.0, "time/backward": 1.78, **counts},
               {"time/forward": 0.69, "time/backward": 0.70, **counts}]
    # frozen: forward 5 x 10 + 3 x 2 = 56, backward as many: 112; LoRA: 5 x 1 forward, twice that backward: 15;
    # attention: 8 x 0.5 forward, twice that backward: 12; 139 FLOPs at 100 FLOP/s = 1.39 s
    out = train_pass_bound(records, flops, 100.0)
    assert out["per_step"] == pytest.approx([18 / 1.39, 2.0, 1.0])
    assert out["mean_after_first"] == pytest.approx(1.5)  # the first step (warm-up) is left out
    assert out["per_step_frozen_linears_only"] == pytest.approx([18 / 1.12, 2.78 / 1.12, 1.39 / 1.12])
    assert out["mean_after_first_frozen_linears_only"] == pytest.approx((2.78 + 1.39) / 2 / 1.12)
    assert out["flops_share_after_first"] == pytest.approx({"frozen": 112 / 139, "lora": 15 / 139,
                                                            "attention": 12 / 139})
    with pytest.raises(RuntimeError, match="fewer than two steps"):
        train_pass_bound(records[:2], flops, 100.0)
    # a library that did not log the attention pairs: no full bound, the frozen linears' one still
    old = [{k: v for k, v in r.items() if k != "tokens/loss_attention_pairs"} for r in records]
    out = train_pass_bound(old, flops, 100.0)
    assert out["mean_after_first"] is None and out["per_step"] is None and out["flops_share_after_first"] is None
    assert out["mean_after_first_frozen_linears_only"] == pytest.approx((2.78 + 1.39) / 2 / 1.12)


def test_the_issue_40_targets():
    assert TARGETS["step_vs_trl"] == (0.5, "le") and TARGETS["train_pass_vs_matmul"] == (1.5, "le")
    assert all(TARGETS[f"decode_vs_bound_{n}"] == (2.0, "le") for n in (1, 16, 64))
    assert target("train_pass_vs_matmul", 1.49)["met"] and not target("train_pass_vs_matmul", 1.51)["met"]


def test_decode_targets_judge_the_unrounded_ratio():
    """decode_step.py's summary rounds to 2 decimals: the targets read the per-row entries, so 2.0012 misses 2.0."""
    decode = {"summary": {"1": {"lean_over_bound": 2.44}, "16": {"lean_over_bound": 2.0}},
              "steps": [{"rows": 1, "lean_over_bound": 2.4373}, {"rows": 16, "lean_over_bound": 2.0012}]}
    ratios = decode_ratios(decode)
    assert ratios == {"1": 2.4373, "16": 2.0012}
    assert not target("decode_vs_bound_16", ratios["16"])["met"]
    assert target("decode_vs_bound_16", 1.9999)["met"]


def test_each_kind_of_cpu_keeps_its_latest_bench_record(tmp_path):
    from measure import cpu_slug, keep_cpu_record

    assert cpu_slug("AMD EPYC") == "amd_epyc"
    assert cpu_slug("Intel(R) Xeon(R) Platinum 8488C") == "intel_r_xeon_r_platinum_8488c"
    for cpu, text in (("AMD EPYC", "first"), ("Intel(R) Xeon(R) CPU", "second"), ("AMD EPYC", "third")):
        (tmp_path / "bench.json").write_text(f'{{"run": "{text}"}}')
        (tmp_path / "bench.md").write_text(f"# {text}")
        keep_cpu_record(tmp_path, cpu)
    kept = sorted(p.name for p in (tmp_path / "by_cpu").iterdir())
    assert kept == ["amd_epyc.json", "amd_epyc.md", "intel_r_xeon_r_cpu.json", "intel_r_xeon_r_cpu.md"]
    assert (tmp_path / "by_cpu" / "amd_epyc.md").read_text() == "# third"  # the latest run of that CPU
    assert (tmp_path / "by_cpu" / "intel_r_xeon_r_cpu.json").read_text() == '{"run": "second"}'


def test_paired_medians_by_hand():
    from measure import paired_medians

    medians, ratios = paired_medians({"base": [2.0, 4.0, 6.0], "fast": [1.0, 1.0, 3.0]}, "base")
    assert medians == {"base": 4.0, "fast": 1.0}
    assert ratios == {"fast": 2.0}  # per round 2, 4, 2: the median of the ratios, not the ratio of the medians (4)


def test_packed_matmul_rate_counts_the_products_flops_and_is_none_without_onednn(monkeypatch):
    """``measure.packed_matmul_flops``: 2 n^3 FLOPs per timed call of oneDNN's packed linear (a fake clock makes the
    rate exact), and ``None`` where torch has no oneDNN linear op."""
    import measure

    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        pytest.skip("this torch build has no oneDNN linear op")
    ticks = iter([10.0, 12.0])  # start and end of the timed loop: 2 seconds
    assert measure.packed_matmul_flops(n=64, repeats=3, clock=lambda: next(ticks)) == pytest.approx(3 * 2 * 64**3 / 2.0)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert measure.packed_matmul_flops(n=64, repeats=3) is None


def test_the_memory_target_pairs_each_round_and_skips_incomplete_ones():
    """bench.paired_memory_ratios: one ratio per round with both runs of the shared pair (a failed run, another
    layout, or a 2-agent run does not count), in round order; the target is their median."""
    import statistics

    from bench import paired_memory_ratios

    runs = [
        {"n_agents": 1, "layout": "shared", "peak_rss_mib": 2900.0},            # round 1 (no key: round 1)
        {"n_agents": 2, "layout": "shared", "peak_rss_mib": 3000.0, "round": 1},
        {"n_agents": 4, "layout": "separate", "peak_rss_mib": 8700.0, "round": 1},
        {"n_agents": 4, "layout": "shared", "peak_rss_mib": 3045.0, "round": 1},
        {"n_agents": 4, "layout": "shared", "peak_rss_mib": 3016.0, "round": 2},
        {"n_agents": 1, "layout": "shared", "peak_rss_mib": 2875.0, "round": 2},
        {"n_agents": 1, "layout": "shared", "error": "killed", "round": 3},
        {"n_agents": 4, "layout": "shared", "peak_rss_mib": 3100.0, "round": 3},
        {"n_agents": 1, "layout": "shared", "peak_rss_mib": 2950.0, "round": 4},
        {"n_agents": 4, "layout": "shared", "peak_rss_mib": 3068.0, "round": 4},
    ]
    ratios = paired_memory_ratios(runs, 4)
    assert ratios == [3045.0 / 2900.0, 3016.0 / 2875.0, 3068.0 / 2950.0]
    # 1.05, 1.049..., 1.04: the middle one is round 2's
    assert statistics.median(ratios) == 3016.0 / 2875.0
