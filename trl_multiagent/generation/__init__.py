"""Team-level generation: every row of every agent that shares a base, sampled in ONE batched decoding loop.

A step of a team asks for completions of several agents at once (:meth:`AgentPool.generate_many
<trl_multiagent.team.pool.AgentPool.generate_many>`). The package, from the bottom up (a module imports only the ones
above it in this list; of the rest of the library, the folder may import :mod:`trl_multiagent.models` (the grouped
attention of the teacher-forced pass; the vLLM backend's model checks), :mod:`trl_multiagent.credit` (the vLLM
backend reads its loss settings) and :mod:`trl_multiagent.errors`). Besides decoding it holds the one padding
(:mod:`.padding`), the one teacher-forced pass (:mod:`.teacher_forcing`) and the one log-prob path
(:mod:`.logprobs`):

* :mod:`.requests`: the :data:`Prompt` type, :class:`GenerationRequest` (one prompt of one agent) and
  :class:`Generation` (one sampled response);
* :mod:`.frozen_weights`: the de-quantised copy of a 4-bit base's frozen weights (:func:`use_dense_copy`) and the
  oneDNN-packed copy of frozen float32 linears on the CPU (:class:`PackedFrozenLinears`, ``PACK_MIN_WEIGHTS``), in
  float32 or bfloat16 (:data:`FROZEN_MATMUL_DTYPES`, ``frozen_matmul_dtype``);
* :mod:`.compute_paths`: how each base computes, decided once per base by the pool (:class:`~.compute_paths.BasePaths`:
  a de-quantised copy, packed frozen weights in generation and training, the lean decoding step);
* :mod:`.lora_batch`: :class:`MultiAdapterBatch`, one forward pass for rows of several LoRA adapters;
* :mod:`.lean_step`: :class:`LeanStep`, the one-token decoding step of a Llama-architecture base computed without
  transformers' forward (few operations per layer), and :func:`lean_support` (which bases it applies to);
* :mod:`.sampling`: the sampler, :func:`sample_next` and :func:`nucleus_candidates` (``TOP_P_CANDIDATES``);
* :mod:`.prefixes`: :func:`shared_prefixes`, the grouping of prompts that begin alike, shared with the
  teacher-forced pass (:mod:`trl_multiagent.generation.teacher_forcing`);
* :mod:`.kv_cache`: the preallocated KV cache of the loop (:func:`~.kv_cache.preallocated_cache`);
* :mod:`.decoding`: the decoding loop :func:`decode`, the bucketed prefill (:func:`prefill_buckets`,
  ``PREFILL_BUCKET_MIN_ROWS``, ``PREFILL_BUCKET_OVERHEAD``) and the options it implements (:data:`SUPPORTED_OPTIONS`);
* :mod:`.team`: team dispatch, :func:`generate_team` (requests grouped by base, chunks, transformers' ``generate``
  for options the loop lacks), :func:`check_transformers_for_decode`;
* :mod:`.vllm`: the vLLM backend (``use_vllm: true``), :class:`~.vllm.VLLMGenerationBackend` and its checks and
  importance-sampling correction, :func:`~.vllm_server.make_generation_backend` (the backend a config names);
* :mod:`.vllm_server`: ``vllm_mode: server``, :class:`~.vllm_server.VLLMServerBackend`: a ``vllm serve`` process of
  its own, one LoRA adapter per policy loaded over HTTP after every step (only the changed ones).

Where the old names went: ``trl_multiagent/generation.py`` became this package; its public functions and classes are
importable from ``trl_multiagent.generation`` as before. The tunable constants live in their module only (set them
there: ``generation.frozen_weights.PACK_MIN_WEIGHTS``, ``generation.decoding.PREFILL_BUCKET_MIN_ROWS`` /
``PREFILL_BUCKET_OVERHEAD``, ``generation.sampling.TOP_P_CANDIDATES``); ``_preallocated_cache`` is
``generation.kv_cache.preallocated_cache``. ``trl_multiagent.vllm_generation`` is ``trl_multiagent.generation.vllm``.
``Prompt`` moved here from ``trl_multiagent.environments.base`` (still importable from there and from
``trl_multiagent.environments``).
"""

from trl_multiagent.generation.decoding import SUPPORTED_OPTIONS, decode, prefill_buckets, unsupported_options
from trl_multiagent.generation.frozen_weights import (
    FROZEN_MATMUL_DTYPES,
    PackedFrozenLinears,
    bfloat16_matmuls_available,
    dense_weight_bytes,
    dequantized_weight,
    frozen_matmul_torch_dtype,
    packed_weight_bytes,
    packing_available,
    use_dense_copy,
)
from trl_multiagent.generation.lean_step import LeanStep, lean_support
from trl_multiagent.generation.lora_batch import MultiAdapterBatch
from trl_multiagent.generation.prefixes import shared_prefixes
from trl_multiagent.generation.requests import Generation, GenerationRequest, Prompt
from trl_multiagent.generation.sampling import nucleus_candidates, sample_next
from trl_multiagent.generation.team import (
    MIN_TRANSFORMERS_FOR_DECODE,
    check_transformers_for_decode,
    eval_mode,
    generate_team,
)

__all__ = [
    "MIN_TRANSFORMERS_FOR_DECODE",
    "SUPPORTED_OPTIONS",
    "Generation",
    "GenerationRequest",
    "LeanStep",
    "MultiAdapterBatch",
    "FROZEN_MATMUL_DTYPES",
    "PackedFrozenLinears",
    "bfloat16_matmuls_available",
    "frozen_matmul_torch_dtype",
    "Prompt",
    "check_transformers_for_decode",
    "decode",
    "dense_weight_bytes",
    "dequantized_weight",
    "eval_mode",
    "generate_team",
    "lean_support",
    "nucleus_candidates",
    "packed_weight_bytes",
    "packing_available",
    "prefill_buckets",
    "sample_next",
    "shared_prefixes",
    "unsupported_options",
    "use_dense_copy",
]
