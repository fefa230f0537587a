"""Would a compiled training pass reach the matmul rate? One teacher-forced call of the main job's base, forward and
backward, three ways in one run: the library's pass, the same layers written as plain functions (eager), and those
functions compiled by ``torch.compile`` (inductor, forward and backward).

    python benchmarks/train_layers_compiled.py [--rows 12] [--length 40] [--cached 377] [--repeats 3]
        [--out experiments/speed/teacher_forcing/train_layers_compiled.json]

The workload is ``benchmarks/call_cost.py``'s largest shape. SmolLM2-135M-Instruct in float32 with one LoRA adapter
(r=16, alpha 32) on every projection continues a cached prompt of ``--cached`` tokens with ``rows x length`` new
positions. The loss is the LM head's log-sum-exp summed over the positions, and the LoRA matrices get gradients:

* ``library``: the pool's forward (``lm_forward``: transformers' Llama with PEFT's LoRA layers, the packed frozen
  weights where the pool packs them, the grouped attention), as stage 3 of ``teacher_forcing.completion_outputs``
  calls it;
* ``eager``: the 30 decoder layers as one function per layer (RMSNorm, q/k/v against their concatenated frozen
  weights plus each projection's LoRA, rotary, attention over the cached and new keys with the query heads of a
  key/value head stacked, o, the gated MLP with LoRA, residuals), then the final norm, the LM head and the loss; the
  frozen weights through ``F.linear``;
* ``compiled``: the same layer function through ``torch.compile`` (``dynamic=False``; layers of the same shapes
  share a compiled graph, forward and backward; the first layer's input takes no gradient, so it gets a graph of
  its own: ``compiled_graphs``). Compiled before the rounds (its seconds
  reported), with no inductor cache on disk.

The three run alternately, ``--repeats`` rounds, with medians reported. Each way's loss and the first layer's LoRA
gradients are checked against the library's. The FLOPs of the call are counted as ``targets.train_pass_bound``
counts them (layers forward and backward, and the LM head at every new position), at the 2048^3 matmul rate measured
before and after.
"""

# ruff: noqa: E402  (the inductor cache is switched off before torch is imported)
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import torch
import torch.nn.functional as F
from measure import matmul_flops, write_result
from targets import linear_flops_per_token

from trl_multiagent.generation.teacher_forcing import lm_forward
from trl_multiagent.runtime.provenance import cpu_model
from trl_multiagent.team.pool import AgentPool, AgentSpec

ADAPTER = "solver"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def layer_tensors(model, layer) -> dict:
    """A decoder layer's frozen weights (q/k/v and gate/up concatenated) and its LoRA matrices as leaf tensors that
    take gradients (copies of the adapter's, so that the three ways can be compared)."""
    attn, mlp = layer.self_attn, layer.mlp
    module = {**{n: getattr(attn, n) for n in PROJECTIONS[:4]}, **{n: getattr(mlp, n) for n in PROJECTIONS[4:]}}
    frozen = {n: m.base_layer.weight.detach() for n, m in module.items()}
    lora = {n: (m.lora_A[ADAPTER].weight.detach().clone().requires_grad_(),
                m.lora_B[ADAPTER].weight.detach().clone().requires_grad_()) for n, m in module.items()}
    return {"qkv": torch.cat([frozen[n] for n in PROJECTIONS[:3]]), "o": frozen["o_proj"],
            "gate_up": torch.cat([frozen["gate_proj"], frozen["up_proj"]]), "down": frozen["down_proj"],
            "norm1": layer.input_layernorm.weight.detach(), "norm2": layer.post_attention_layernorm.weight.detach(),
            "lora": [lora[n] for n in PROJECTIONS], "scale": float(module["q_proj"].scaling[ADAPTER])}


def decoder_layer(x, past_k, past_v, cos, sin, mask, qkv, o, gate_up, down, norm1, norm2,
                  a_q, b_q, a_k, b_k, a_v, b_v, a_o, b_o, a_g, b_g, a_u, b_u, a_d, b_d,
                  scale: float, eps: float, heads: int, kv_heads: int, dim: int):
    """One Llama decoder layer with LoRA on its seven projections, for ``x`` ``(rows, T, hidden)`` after a cached
    ``past_k``/``past_v`` ``(rows, kv_heads, P, dim)``; ``mask`` additive ``(rows, 1, T, P + T)``."""
    rows, t, _ = x.shape
    groups = heads // kv_heads
    h = F.rms_norm(x, (x.size(-1),), norm1, eps)
    y = F.linear(h, qkv)
    q = y[..., :heads * dim] + F.linear(F.linear(h, a_q), b_q) * scale
    k = y[..., heads * dim:(heads + kv_heads) * dim] + F.linear(F.linear(h, a_k), b_k) * scale
    v = y[..., (heads + kv_heads) * dim:] + F.linear(F.linear(h, a_v), b_v) * scale
    q = q.view(rows, t, heads, dim).transpose(1, 2)
    k = k.view(rows, t, kv_heads, dim).transpose(1, 2)
    v = v.view(rows, t, kv_heads, dim).transpose(1, 2)
    half = dim // 2

    def rotate(z):
        return z * cos + torch.cat([-z[..., half:], z[..., :half]], dim=-1) * sin

    q, k = rotate(q), rotate(k)
    keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    stacked = q.reshape(rows, kv_heads, groups * t, dim)
    a = F.scaled_dot_product_attention(stacked, keys, values, attn_mask=mask.repeat(1, 1, groups, 1))
    a = a.reshape(rows, heads, t, dim).transpose(1, 2).reshape(rows, t, heads * dim)
    x = x + F.linear(a, o) + F.linear(F.linear(a, a_o), b_o) * scale
    h = F.rms_norm(x, (x.size(-1),), norm2, eps)
    gu = F.linear(h, gate_up)
    inter = gu.size(-1) // 2
    gate = gu[..., :inter] + F.linear(F.linear(h, a_g), b_g) * scale
    up = gu[..., inter:] + F.linear(F.linear(h, a_u), b_u) * scale
    m = F.silu(gate) * up
    return x + F.linear(m, down) + F.linear(F.linear(m, a_d), b_d) * scale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/speed/teacher_forcing/train_layers_compiled.json")
    parser.add_argument("--rows", type=int, default=12)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--cached", type=int, default=377)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from transformers import DynamicCache

    torch.manual_seed(0)
    pool = AgentPool([AgentSpec(ADAPTER, model="smollm2-135m-instruct", lora_r=16, lora_alpha=32)])
    with torch.no_grad():  # adapters as after training (B = 0 at initialisation: no gradient would reach A)
        for name, p in pool.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    forward = lm_forward(functools.partial(pool, ADAPTER))
    model = next(iter(pool.bases.values())).get_base_model()
    config = model.config
    rows, length, cached = args.rows, args.length, args.cached
    ids = torch.randint(100, 1000, (1, cached))
    with torch.no_grad():
        _, prompt = forward(ids, torch.ones_like(ids), torch.arange(cached)[None], None, True, 1)
    tokens = torch.randint(100, 1000, (rows, length))
    positions = cached + torch.arange(length)[None].expand(rows, -1)
    past = [(layer.keys.expand(rows, -1, -1, -1).contiguous(), layer.values.expand(rows, -1, -1, -1).contiguous())
            for layer in prompt.layers]

    def library() -> tuple[float, torch.Tensor, torch.Tensor]:
        cache = DynamicCache()
        for i, (k, v) in enumerate(past):
            cache.update(k.clone(), v.clone(), i)
        mask = torch.ones(rows, cached + length, dtype=torch.long)
        start = time.perf_counter()
        logits, _ = forward(tokens, mask, positions, cache, True, length)
        loss = logits.logsumexp(-1).sum()
        loss.backward()
        seconds = time.perf_counter() - start
        grad = model.model.layers[0].self_attn.q_proj.lora_A[ADAPTER].weight.grad.clone()
        pool.zero_grad()
        return seconds, loss.detach(), grad

    layers = [layer_tensors(model, layer) for layer in model.model.layers[:config.num_hidden_layers]]
    attn = model.model.layers[0].self_attn
    shape = {"eps": model.model.norm.variance_epsilon, "heads": config.num_attention_heads,
             "kv_heads": config.num_key_value_heads, "dim": attn.head_dim}
    embed, head = model.model.embed_tokens.weight.detach(), model.lm_head.weight.detach()
    final_norm = model.model.norm.weight.detach()
    cos, sin = model.model.rotary_emb(embed[:1], position_ids=positions)
    cos, sin = cos[:, None], sin[:, None]  # (rows, 1, length, dim)
    causal = torch.full((length, length), -torch.inf).triu(1)
    mask = torch.cat([torch.zeros(length, cached), causal], dim=1).expand(rows, 1, -1, -1).contiguous()

    def functional(layer_fn) -> tuple[float, torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        x = F.embedding(tokens, embed)
        for t, (k, v) in zip(layers, past):
            lora = [m for pair in t["lora"] for m in pair]
            x = layer_fn(x, k, v, cos, sin, mask, t["qkv"], t["o"], t["gate_up"], t["down"], t["norm1"],
                         t["norm2"], *lora, scale=t["scale"], **shape)
        logits = F.linear(F.rms_norm(x, (x.size(-1),), final_norm, shape["eps"]), head)
        loss = logits.logsumexp(-1).sum()
        loss.backward()
        seconds = time.perf_counter() - start
        grad = layers[0]["lora"][0][0].grad.clone()
        for t in layers:
            for a, b in t["lora"]:
                a.grad = b.grad = None
        return seconds, loss.detach(), grad

    compiled_layer = torch.compile(decoder_layer, dynamic=False)
    rate_before = matmul_flops()
    start = time.perf_counter()
    functional(compiled_layer)
    compile_s = time.perf_counter() - start
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"]["unique_graphs"])
    ways = {"library": library, "eager": lambda: functional(decoder_layer),
            "compiled": lambda: functional(compiled_layer)}
    for way in ways.values():  # warm-up
        way()
    times = {name: [] for name in ways}
    checks = {}
    for r in range(args.repeats):
        results = {}
        for name in list(ways) if r % 2 == 0 else reversed(list(ways)):
            seconds, loss, grad = ways[name]()
            times[name].append(seconds)
            results[name] = (loss, grad)
        loss0, grad0 = results["library"]
        for name in ("eager", "compiled"):
            loss, grad = results[name]
            checks[name] = {"loss_relative_difference": abs((loss - loss0) / loss0).item(),
                            "first_lora_grad_max_difference": (grad - grad0).abs().max().item(),
                            "first_lora_grad_max": grad0.abs().max().item()}
    rate = (rate_before + matmul_flops()) / 2
    flops = linear_flops_per_token("smollm2-135m-instruct")
    positions_ = rows * length
    call_flops = 2 * positions_ * (flops["layers"] + flops["lm_head"])  # forward, and backward's input gradients
    bound = call_flops / rate
    result = {"command": "python benchmarks/train_layers_compiled.py "
                         + " ".join(argv if argv is not None else sys.argv[1:]),
              "cpu": cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "rows": rows, "length": length, "cached": cached, "matmul_gflops": rate / 1e9,
              "flops": call_flops, "flops_at_matmul_rate_s": bound,
              "compile_s": compile_s, "compiled_graphs": graphs, "checks_against_library": checks}
    for name, values in times.items():
        result[f"{name}_s"] = [round(v, 4) for v in values]
        result[f"{name}_s_median"] = statistics.median(values)
        result[f"{name}_over_flops_at_rate"] = statistics.median(values) / bound
    write_result(args.out, result)
    print({k: round(v, 3) for k, v in result.items() if k.endswith("median") or k.endswith("rate") or
           k in ("compile_s", "compiled_graphs")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
