"""use_vllm's checks (before any model loads) and TRL's importance-sampling correction, without a vLLM engine:
these run in every venv (tests/test_vllm.py runs the engine, in .venv-vllm)."""

import math

import pytest
import torch

from trl_multiagent.generation import vllm as vllm_backend
from trl_multiagent.generation.vllm import check_vllm_team, importance_sampling_ratio, sampling_kwargs
from trl_multiagent.team.pool import AgentSpec
from trl_multiagent.trainers import MultiAgentGRPOConfig

F64 = torch.float64


def _config(tmp_path, **kw):
    return MultiAgentGRPOConfig(output_dir=str(tmp_path), report_to=[], use_vllm=True, **kw)


def test_use_vllm_without_vllm_names_make_test_vllm(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    with pytest.raises(ValueError, match="vLLM is not installed.*make test-vllm"):
        _config(tmp_path)


@pytest.mark.parametrize("kw, message", [
    ({"vllm_mode": "remote"}, "vllm_mode must be one of \\('colocate', 'server'\\)"),
    ({"vllm_mode": "server", "vllm_server_base_url": "localhost:8000"}, "vllm_server_base_url must be http://host:port"),
    ({"vllm_mode": "server", "vllm_server_timeout": 0.0}, "vllm_server_timeout must be positive"),
    ({"vllm_importance_sampling_mode": "token_truncate"}, "weighs tokens.*sequence_mask"),
    ({"vllm_importance_sampling_mode": "nope", "loss_type": "grpo"}, "vllm_importance_sampling_mode must be one of"),
    ({"vllm_enable_sleep_mode": True}, "vllm_enable_sleep_mode"),
])
def test_unsupported_vllm_settings_are_refused_with_the_reason(tmp_path, monkeypatch, kw, message):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: True)
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **kw)


def test_supported_vllm_settings_pass(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: True)
    config = _config(tmp_path, loss_type="grpo", vllm_importance_sampling_mode="token_truncate")
    assert config.use_vllm and config.vllm_importance_sampling_clip_max == 3.0
    _config(tmp_path, vllm_importance_sampling_correction=False, vllm_importance_sampling_mode="token_mask")
    config = _config(tmp_path, vllm_mode="server", vllm_server_base_url="http://10.0.0.2:8000", loss_type="grpo")
    assert config.vllm_mode == "server"  # the server's fields are TRL's, accepted (tests/test_vllm_server.py)


def test_server_mode_keeps_the_other_checks(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)  # a server needs no vLLM in this process
    with pytest.raises(ValueError, match="weighs tokens.*sequence_mask"):
        _config(tmp_path, vllm_mode="server", vllm_importance_sampling_mode="token_truncate")
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode"):
        _config(tmp_path, vllm_mode="server", vllm_enable_sleep_mode=True)


def test_a_4bit_base_is_refused_before_it_loads():
    with pytest.raises(ValueError, match="4-bit .*quantization: null"):
        check_vllm_team([AgentSpec("writer"), AgentSpec("editor", quantization="4bit")])


def test_a_quantized_checkpoint_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], '
                                          '"quantization_config": {"quant_method": "gptq"}}')
    with pytest.raises(ValueError, match="quantized \\(gptq\\)"):
        check_vllm_team([AgentSpec("writer", model=str(tmp_path))])


def test_importance_sampling_ratio_by_hand():
    # own tensors in float64: the hand values hold far below any CPU's rounding differences (tests/numerics.py)
    # two responses of 3 and 2 tokens; trainer minus engine log-probs per token
    trainer = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, 0.0]], dtype=F64)
    engine = torch.tensor([[-1.5, -2.0, -0.1], [-0.2, -3.0, 7.0]], dtype=F64)  # the padded 7.0 must not count
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=F64)
    # per-token differences: [0.5, 0, -0.4] and [0, 2.7, (masked)]
    token = importance_sampling_ratio(trainer, engine, mask, "token_truncate", None, 3.0)
    assert torch.allclose(token, torch.tensor([[math.exp(0.5), 1.0, math.exp(-0.4)], [1.0, 3.0, 1.0]], dtype=F64))
    token_mask = importance_sampling_ratio(trainer, engine, mask, "token_mask", 0.7, 3.0)
    assert torch.allclose(token_mask, torch.tensor([[math.exp(0.5), 1.0, 0.0], [1.0, 0.0, 1.0]], dtype=F64))
    # sequence sums: 0.1 and 2.7
    seq = importance_sampling_ratio(trainer, engine, mask, "sequence_truncate", None, 3.0)
    assert torch.allclose(seq, torch.tensor([[math.exp(0.1)], [3.0]], dtype=F64))  # e^2.7 = 14.9, clipped at 3
    seq_mask = importance_sampling_ratio(trainer, engine, mask, "sequence_mask", None, 3.0)
    # e^2.7 = 14.9 > 3: masked out
    assert torch.allclose(seq_mask, torch.tensor([[math.exp(0.1)], [0.0]], dtype=F64))
    # a token without an engine log-prob (NaN) counts as ratio 1
    unknown = torch.tensor([[math.nan, -2.0, -0.5], [-0.2, -0.3, 0.0]], dtype=F64)
    nan = importance_sampling_ratio(trainer, unknown, mask, "token_truncate", None, 3.0)
    assert torch.allclose(nan, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=F64))


def test_importance_sampling_matches_trls_own_computation():
    """The same numbers as TRL's GRPOTrainer computes inline (trl 1.16, _generate_and_score_completions)."""
    torch.manual_seed(0)
    old, sampling = torch.randn(4, 5, dtype=F64) - 2, torch.randn(4, 5, dtype=F64) - 2
    mask = (torch.rand(4, 5) > 0.3).double()
    for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        diff = (old - sampling) * mask
        if mode.startswith("sequence"):
            diff = diff.sum(-1, keepdim=True)
        ratio = torch.exp(diff)
        expected = (torch.clamp(ratio, min=0.5, max=2.0) if mode.endswith("truncate")
                    else ratio.masked_fill((ratio < 0.5) | (ratio > 2.0), 0.0))
        assert torch.allclose(importance_sampling_ratio(old, sampling, mask, mode, 0.5, 2.0), expected)


def test_sampling_params_follow_the_generation_config():
    from transformers import GenerationConfig

    greedy = sampling_kwargs(GenerationConfig(max_new_tokens=5, do_sample=False, top_p=0.5), [2, 7])
    assert greedy["temperature"] == 0.0 and greedy["top_p"] == 1.0 and greedy["max_tokens"] == 5
    assert greedy["stop_token_ids"] == [2, 7]
    sampled = sampling_kwargs(GenerationConfig(max_new_tokens=9, min_new_tokens=2, do_sample=True, temperature=0.7,
                                               top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                                               suppress_tokens=[3]), [2])
    assert (sampled["temperature"], sampled["top_k"], sampled["top_p"], sampled["min_p"]) == (0.7, 20, 0.9, 0.05)
    assert sampled["min_tokens"] == 2 and sampled["repetition_penalty"] == 1.1 and sampled["logit_bias"] == {3: -math.inf}
    with pytest.raises(ValueError, match="no vLLM mapping"):
        sampling_kwargs(GenerationConfig(max_new_tokens=5, num_beams=2), [2])
