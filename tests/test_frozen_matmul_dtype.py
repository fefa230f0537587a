"""``frozen_matmul_dtype: bfloat16`` (trl_multiagent/generation/frozen_weights.py): the frozen linears compute from
packed bfloat16 copies, in generation and in the teacher-forced passes.

What is checked: one packed bfloat16 matmul (forward and the input's gradient) element by element against the float64
product of the bfloat16-rounded operands, within one bfloat16 rounding of the output; that the pool makes and uses
the bfloat16 copies only (no float32 copy), in the decoding loop, the lean step and the training pass; the model's
outputs and LoRA gradients against float32's within the bound of the roundings on their path; that generation and
training agree (the lean step against the forward, both in bfloat16); and the errors for settings where it cannot
apply. Tests that run the bfloat16 kernels skip on a CPU without them (oneDNN needs AVX512-BW/VL/DQ or AVX-NE-CONVERT;
``bfloat16_matmuls_available``)."""

import pytest
import torch
from transformers import GenerationConfig

from trl_multiagent.generation import LeanStep, MultiAdapterBatch, frozen_weights
from trl_multiagent.generation.frozen_weights import (
    PackedFrozenLinears,
    bfloat16_matmuls_available,
    packed_linear,
    packed_transposed,
    packed_weight,
    packed_weight_bytes,
)
from trl_multiagent.generation.kv_cache import preallocated_cache
from trl_multiagent.runtime.provenance import pool_paths
from trl_multiagent.team.pool import AgentPool, AgentSpec, GenerationRequest

from .numerics import UNIT_ROUNDOFF, assert_same_computation

needs_bf16 = pytest.mark.skipif(not bfloat16_matmuls_available(),
                                reason="oneDNN has no bfloat16 matmuls on this CPU (AVX512-BW/VL/DQ or AVX-NE-CONVERT)")

U_BF16, U_FP32 = UNIT_ROUNDOFF[torch.bfloat16], UNIT_ROUNDOFF[torch.float32]
#: the tiny model's longest chain of frozen matmuls: 2 layers x (q/k/v, o, gate/up, down) + the LM head, each rounding
#: its input, its weights and its output to bfloat16: the "terms" of the bfloat16 bound on its outputs
TINY_BF16_ROUNDINGS = 3 * (2 * 4 + 1)


def _rounded(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).double()


def _assert_one_bfloat16_rounding(y: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor, terms: int,
                                  what: str) -> None:
    """Each element of ``y`` within one bfloat16 rounding of ``exact`` (the float64 value of the rounded operands)
    plus the float32 accumulation of ``terms`` products (``magnitude``: the sum of their absolute values)."""
    bound = U_BF16 * exact.abs() * (1 + 1e-3) + 2 * terms * U_FP32 * magnitude
    excess = (y.double() - exact).abs() - bound
    assert excess.max() <= 0, f"{what}: {int((excess > 0).sum())} elements beyond one bfloat16 rounding"


@needs_bf16
def test_bfloat16_copy_rounds_operands_and_output_of_the_matmul_and_its_input_gradient():
    torch.manual_seed(0)
    layer = torch.nn.Linear(300, 200).requires_grad_(False)
    x = torch.randn(7, 300, requires_grad=True)
    g = torch.randn(7, 200)
    packed = packed_weight(layer, [layer.weight], dtype=torch.bfloat16)
    assert packed.dtype == torch.bfloat16
    y = frozen_weights._PackedFrozenLinear.apply(
        x, packed, layer.bias, lambda: packed_transposed(layer, layer.weight, torch.bfloat16))
    y.backward(g)
    assert y.dtype == torch.float32 and x.grad.dtype == torch.float32
    w, b = _rounded(layer.weight), _rounded(layer.bias)
    exact = _rounded(x.detach()) @ w.T + b
    _assert_one_bfloat16_rounding(y, exact, _rounded(x.detach()).abs() @ w.abs().T + b.abs(), 300, "x W^T + b")
    exact_grad = _rounded(g) @ w
    _assert_one_bfloat16_rounding(x.grad, exact_grad, _rounded(g).abs() @ w.abs(), 200, "g W")
    # it is not float32's product: the rounding happened (float32 would be within ~1e-6 relative)
    full = x.detach().double() @ layer.weight.double().T + layer.bias.double()
    assert (y.double() - full).norm() > 100 * U_FP32 * full.norm()
    # the copies are the bfloat16 ones, kept on the layer apart from float32's
    assert "_trl_multiagent_packed_bfloat16" in layer.__dict__ and "_trl_multiagent_packed_t_bfloat16" in layer.__dict__
    assert "_trl_multiagent_packed" not in layer.__dict__ and "_trl_multiagent_packed_t" not in layer.__dict__
    # packed_linear of a 3-D input reshapes around the same op
    x3 = torch.randn(2, 3, 300)
    assert torch.equal(packed_linear(x3, packed, layer.bias), packed_linear(x3.reshape(6, 300), packed,
                                                                            layer.bias).reshape(2, 3, 200))


def _pool(model_dir, dtype, **kw):
    torch.manual_seed(1)  # the same LoRA matrices in every pool
    pool = AgentPool([AgentSpec("aux", model=model_dir, lora_r=4), AgentSpec("main", model=model_dir, lora_r=4)],
                     frozen_matmul_dtype=dtype, **kw)
    with torch.no_grad():
        for n, p in pool.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return pool


def _copies(model) -> set[str]:
    return {k for m in model.modules() for k in m.__dict__ if k.startswith("_trl_multiagent_packed")}


@needs_bf16
def test_pool_generates_and_trains_with_the_bfloat16_copies_only(tiny_text_model, monkeypatch):
    monkeypatch.setattr(frozen_weights, "PACK_MIN_WEIGHTS", 0)  # the tiny model's layers are all small
    pools = {d: _pool(tiny_text_model, d) for d in ("float32", "bfloat16")}
    pool = pools["bfloat16"]
    (key,) = pool.bases
    model = pool.bases[key].get_base_model()
    assert pool.packs_weights(key) and pool.packs_training(key) and pool.lean_decodes(key)
    assert pool.frozen_dtype_of(key) == torch.bfloat16 and pool_paths(pool)[key]["frozen_matmul_dtype"] == "bfloat16"
    assert pool_paths(pools["float32"])[key]["frozen_matmul_dtype"] == "float32"
    # half the bytes of float32's copies
    assert 2 * packed_weight_bytes(model, torch.bfloat16) == packed_weight_bytes(model)
    requests = [GenerationRequest(a, p) for p in ("abc", "what is two plus two") for a in ("aux", "main")]
    out = pool.generate_many(requests, GenerationConfig(max_new_tokens=6, do_sample=False))
    assert all(len(g[0].completion_ids) > 0 for g in out)
    after_generation = _copies(model)
    # generation made the bfloat16 copies (the lean step's concatenations and the shared ones), no float32 copy
    assert after_generation == {"_trl_multiagent_packed_bfloat16", "_trl_multiagent_packed_qkv_bfloat16",
                                "_trl_multiagent_packed_gate_up_bfloat16"}
    # training: loss and LoRA gradients through the bfloat16 copies (forward and the transposed ones)
    ids = torch.tensor([pool.encode_prompt("aux", "what is two plus two"), pool.encode_prompt("aux", "hi there, ab cd efgh")])
    results = {}
    for name, p in pools.items():
        p.zero_grad()
        loss = p("aux", input_ids=ids, labels=ids).loss
        loss.backward()
        results[name] = (loss.detach(), [q.grad.clone() for q in p.policy_parameters("aux")])
    assert "_trl_multiagent_packed_t_bfloat16" in _copies(model)
    assert all(k.endswith("_bfloat16") for k in _copies(model))
    assert all(g.abs().sum() > 0 for g in results["bfloat16"][1] if g.numel())
    # against float32: within the roundings of the path, and not float32's numbers
    assert_same_computation(results["bfloat16"][0], results["float32"][0], terms=TINY_BF16_ROUNDINGS,
                            dtype=torch.bfloat16, what="loss, bfloat16 copies against float32")
    assert_same_computation(results["bfloat16"][1], results["float32"][1], terms=TINY_BF16_ROUNDINGS,
                            dtype=torch.bfloat16, what="LoRA gradients, bfloat16 copies against float32")
    assert not torch.equal(results["bfloat16"][0], results["float32"][0])


@needs_bf16
def test_lean_step_in_bfloat16_gives_the_forwards_logits(tiny_text_model, monkeypatch):
    """Generation (the lean step) and the teacher-forced pass (the forward) compute with the same bfloat16 copies:
    they differ only where a float32 sum in another order rounds to a neighbouring bfloat16 value."""
    monkeypatch.setattr(frozen_weights, "PACK_MIN_WEIGHTS", 0)
    pool = _pool(tiny_text_model, "bfloat16")
    (key,) = pool.bases
    model = pool.bases[key].get_base_model().eval()
    adapters = ["aux", "main", "main", "aux"]
    torch.manual_seed(0)
    ids = torch.randint(3, len(pool.tokenizer_of("aux")), (4, 12))
    nxt = torch.randint(3, len(pool.tokenizer_of("aux")), (4,))
    cache = preallocated_cache(model, 14)
    with torch.no_grad(), MultiAdapterBatch(model, adapters) as batch:
        with PackedFrozenLinears(model, skip=LeanStep.concatenated_modules(model), dtype=torch.bfloat16):
            model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        step = LeanStep(model, batch, packed=True, frozen_dtype=torch.bfloat16)
        lean = step(nxt, torch.ones(4, 13, dtype=torch.long), torch.full((4,), 12), cache)
    full = torch.cat([ids, nxt[:, None]], dim=1)
    for row, adapter in enumerate(adapters):
        with torch.no_grad(), PackedFrozenLinears(model, dtype=torch.bfloat16):
            forward = pool.activate(adapter)(input_ids=full[row:row + 1]).logits[0, -1]
            with PackedFrozenLinears(model):  # float32 copies: the bfloat16 ones do change the numbers
                plain = pool.activate(adapter)(input_ids=full[row:row + 1]).logits[0, -1]
        assert_same_computation(lean[row], forward, terms=TINY_BF16_ROUNDINGS, dtype=torch.bfloat16,
                                what=f"row {row}: lean step against the forward, bfloat16")
        assert not torch.equal(forward, plain)


def test_lean_step_takes_a_bfloat16_dtype_only_with_packed_copies(tiny_text_model):
    pool = _pool(tiny_text_model, "float32")
    model = pool.bases["base0"].get_base_model()
    with MultiAdapterBatch(model, ["aux"]) as batch, pytest.raises(ValueError, match="packed=True"):
        LeanStep(model, batch, packed=False, frozen_dtype=torch.bfloat16)


def test_frozen_matmul_dtype_errors_before_any_model_loads(monkeypatch, tmp_path):
    from trl_multiagent.trainers import MAGRPOConfig

    with pytest.raises(ValueError, match="frozen_matmul_dtype must be one of"):
        MAGRPOConfig(output_dir=str(tmp_path), frozen_matmul_dtype="float16")
    with pytest.raises(ValueError, match="frozen_matmul_dtype must be one of"):
        AgentPool([AgentSpec("solver", model="no-such-model")], frozen_matmul_dtype="half")
    with pytest.raises(ValueError, match="packed_weights is 'never'"):
        MAGRPOConfig(output_dir=str(tmp_path), frozen_matmul_dtype="bfloat16", packed_weights="never")
    with pytest.raises(ValueError, match="packed_weights must not be 'never'"):
        AgentPool([AgentSpec("solver", model="no-such-model")], frozen_matmul_dtype="bfloat16", packed_weights="never")
    with pytest.raises(ValueError, match="model_dtype is 'bfloat16'"):
        MAGRPOConfig(output_dir=str(tmp_path), frozen_matmul_dtype="bfloat16", model_dtype="bfloat16")
    from trl_multiagent.trainers import base_config

    monkeypatch.setattr(base_config, "bfloat16_matmuls_available", lambda: False)
    with pytest.raises(ValueError, match="no bfloat16 matmuls"):
        MAGRPOConfig(output_dir=str(tmp_path), frozen_matmul_dtype="bfloat16")
    assert MAGRPOConfig(output_dir=str(tmp_path)).frozen_matmul_dtype == "float32"


def test_bfloat16_needs_packed_copies_for_generation_and_training(tiny_text_model, monkeypatch):
    """A base whose copies the pool would not make (here: the tiny model's layers are below PACK_MIN_WEIGHTS, so
    nothing packs) is an error when it loads, not a silent float32."""
    if not bfloat16_matmuls_available():
        from trl_multiagent.team import pool as agents

        monkeypatch.setattr(agents, "bfloat16_matmuls_available", lambda: True)
    with pytest.raises(ValueError, match="cannot compute with packed bfloat16 copies"):
        _pool(tiny_text_model, "bfloat16")


@needs_bf16
def test_the_trainer_builds_its_pool_with_the_configs_dtype_and_trains_a_step(tiny_text_model, tmp_path, monkeypatch):
    from datasets import Dataset

    from trl_multiagent.environments import FunctionEnvironment
    from trl_multiagent.trainers import MAGRPOConfig, MAGRPOTrainer

    monkeypatch.setattr(frozen_weights, "PACK_MIN_WEIGHTS", 0)
    env = lambda: FunctionEnvironment(["solo"], {"solo": lambda t: t["prompt"]},  # noqa: E731
                                      lambda completions, **_: float(sum(map(ord, str(completions))) % 7))
    args = MAGRPOConfig(output_dir=str(tmp_path), report_to=[], max_completion_length=4, num_generations=4,
                                save_strategy="no", disable_tqdm=True, per_device_train_batch_size=4, max_steps=1,
                                frozen_matmul_dtype="bfloat16")
    specs = [AgentSpec("solo", model=tiny_text_model, lora_r=4, lora_alpha=8)]
    trainer = MAGRPOTrainer(specs, env, args, Dataset.from_dict({"prompt": ["ab"] * 2}))
    (key,) = trainer.pool.bases
    assert trainer.pool.frozen_dtype_of(key) == torch.bfloat16
    before = [p.detach().clone() for p in trainer.pool.policy_parameters("solo")]
    trainer.train()
    # the step generated and trained through the bfloat16 copies, and moved the adapter
    model = trainer.pool.bases[key].get_base_model()
    assert "_trl_multiagent_packed_t_bfloat16" in _copies(model) and all(k.endswith("_bfloat16")
                                                                          for k in _copies(model))
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.pool.policy_parameters("solo")))
    # a pool built by the caller must have the config's dtype
    pool = AgentPool(specs, frozen_matmul_dtype="float32")
    args.output_dir = str(tmp_path / "second")
    with pytest.raises(ValueError, match="frozen_matmul_dtype='bfloat16'"):
        MAGRPOTrainer(pool, env, args, Dataset.from_dict({"prompt": ["ab"] * 2}))
