"""Model resolution and loading for trl-multiagent.

Everything in the library that needs a language model goes through this module. It answers three questions:

* **Which checkpoint?** :func:`resolve_model` turns a user-facing model name into something
  ``from_pretrained`` can load. Three kinds of names are understood:

  - an *embedded short name* such as ``"smollm2-135m-instruct"`` (the default, :data:`DEFAULT_MODEL`): weights that
    ship inside an ordinary Python package, converted once into a checkpoint in the cache
    (:mod:`trl_multiagent.models.embedded` holds the registry, the cache and the conversion);
  - a *local directory* holding a Hugging Face checkpoint, returned as is;
  - anything else, which is treated as a *hub id* (``"org/model"``) and returned unchanged.

* **How to load it?** :func:`load_tokenizer` and :func:`load_base_model` resolve the name and load the
  tokenizer (left padding, pad token always set) or the causal LM (plain, or bitsandbytes 4-bit NF4 /
  8-bit for QLoRA-style training). :func:`context_length` reads the longest sequence from the config alone;
  :func:`check_lora_targets` refuses LoRA on the output layer.

* **What went wrong?** Failures that come from a missing model (package not installed, hub unreachable,
  unknown id, missing local directory) are raised as :class:`ModelNotFoundError` with one message that
  says what to do about it.

The module can also be run: ``python -m trl_multiagent.models.loading prepare [name]`` converts the embedded model
ahead of time (useful before launching several processes) and prints the checkpoint path.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from trl_multiagent.models.embedded import (
    CHATML_TEMPLATE,
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    EmbeddedModel,
    ModelNotFoundError,
    cache_dir,
    embedded_checkpoint_dir,
    ensure_embedded_checkpoint,
)
from trl_multiagent.models.grouped_attention import use_grouped_attention

if TYPE_CHECKING:  # imported lazily at run time: transformers is slow to import
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger("trl_multiagent.models.loading")  # not __name__: stays the same under `python -m`

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "OUTPUT_LAYER_NAMES",
    "QUANTIZATION_CHOICES",
    "EmbeddedModel",
    "ModelNotFoundError",
    "cache_dir",
    "check_lora_targets",
    "context_length",
    "embedded_checkpoint_dir",
    "load_base_model",
    "load_tokenizer",
    "resolve_model",
]

QUANTIZATION_CHOICES: tuple[str | None, ...] = (None, "4bit", "8bit")
"""Accepted values of ``load_base_model(quantization=...)``."""

_OFFLINE_HINT = (
    f"To work offline, pass a local checkpoint directory or the embedded short name {DEFAULT_MODEL!r} "
    f"(prepare it with `python -m trl_multiagent.models.loading prepare`)."
)


# ---------------------------------------------------------------------------------------------------------------
# Name resolution
# ---------------------------------------------------------------------------------------------------------------


def resolve_model(name: str | None = None) -> str:
    """Turn a model name into something ``from_pretrained`` can load.

    Args:
        name: ``None`` (use :data:`DEFAULT_MODEL`), an embedded short name (see :data:`EMBEDDED_MODELS`,
            case-insensitive), a local checkpoint directory, or a Hugging Face hub id.

    Returns:
        For an embedded name, the path of its converted checkpoint in the cache (converted from the GGUF on
        first use; later calls only check that it is there). A local directory is returned as given (with
        ``~`` expanded). Any other string is assumed to be a hub id and returned unchanged; whether it can be
        loaded is only known when :func:`load_tokenizer` / :func:`load_base_model` try.

    Raises:
        ModelNotFoundError: the package of an embedded model is not installed, or ``name`` is clearly a
            filesystem path (absolute, or starting with ``./``, ``../`` or ``~``) that is not a directory.
    """
    if name is None:
        name = DEFAULT_MODEL
    name = str(name)
    key = name.strip().lower()
    if key in EMBEDDED_MODELS:
        return str(ensure_embedded_checkpoint(key))
    if os.path.isdir(name):
        return name
    expanded = os.path.expanduser(name)
    if expanded != name and os.path.isdir(expanded):
        return expanded
    if _looks_like_path(name):
        raise ModelNotFoundError(
            f"Model {name!r} looks like a local path, but no such directory exists. "
            f"Pass an existing checkpoint directory, a Hugging Face hub id, or an embedded short name "
            f"({', '.join(sorted(EMBEDDED_MODELS))})."
        )
    return name


def _looks_like_path(name: str) -> bool:
    return os.path.isabs(name) or name.startswith(("./", "../", "~", ".\\", "..\\")) or name in (".", "..")


# ---------------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------------


def _load_error(name: str, resolved: str, exc: BaseException) -> ModelNotFoundError:
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if os.path.isdir(resolved):
        return ModelNotFoundError(
            f"The local directory {resolved!r} is not a loadable Hugging Face checkpoint ({cause}). {_OFFLINE_HINT}"
        )
    message = (
        f"Could not load model {name!r}: the Hugging Face model hub is unreachable (offline) or has no model "
        f"with this id ({cause}). {_OFFLINE_HINT}"
    )
    if not _hub_offline():
        message += " On a machine without internet, set HF_HUB_OFFLINE=1 to fail fast instead of retrying the hub."
    return ModelNotFoundError(message)


def _hub_offline() -> bool:
    with contextlib.suppress(ImportError, AttributeError):
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return True
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


@contextlib.contextmanager
def _wrap_load_errors(name: str, resolved: str) -> Iterator[None]:
    """Turn "model not found / not reachable / not a checkpoint" failures of ``from_pretrained`` into
    :class:`ModelNotFoundError`; anything else propagates unchanged."""
    try:
        yield
    except _hub_errors() as exc:
        raise _load_error(name, resolved, exc) from exc
    except ValueError as exc:  # e.g. "Unrecognized model in <dir>": a directory that is not a checkpoint
        if os.path.isdir(resolved):
            raise _load_error(name, resolved, exc) from exc
        raise


def _hub_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "this model cannot be fetched/found" rather than a bug."""
    errors: list[type[BaseException]] = [OSError]  # covers requests/urllib3 ConnectionError and transformers'
    with contextlib.suppress(ImportError):
        from huggingface_hub.errors import HFValidationError

        errors.append(HFValidationError)
    with contextlib.suppress(ImportError):
        import httpx

        errors.append(httpx.HTTPError)
    with contextlib.suppress(ImportError):
        import requests

        errors.append(requests.exceptions.RequestException)
    return tuple(errors)


def load_tokenizer(path_or_name: str | None = None) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a model, ready for batched generation.

    Args:
        path_or_name: anything :func:`resolve_model` accepts (``None`` = :data:`DEFAULT_MODEL`).

    Returns:
        The tokenizer with ``padding_side="left"`` (decoder-only generation) and a pad token (the eos token if
        the checkpoint defines none).

    Raises:
        ModelNotFoundError: the model cannot be resolved or loaded (missing package, hub unreachable, ...).
    """
    from transformers import AutoTokenizer

    name = DEFAULT_MODEL if path_or_name is None else str(path_or_name)
    resolved = resolve_model(name)
    with _wrap_load_errors(name, resolved):
        tokenizer = AutoTokenizer.from_pretrained(resolved)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


#: The weights dtypes a ``model_dtype`` setting accepts ("auto": bfloat16 on CUDA, float32 otherwise).
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")


def _as_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"Unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16' or 'float16'")
    return value


def _quantized_device_map() -> dict[str, str]:
    """bitsandbytes models are placed at load time: this process's GPU (``LOCAL_RANK``) or the CPU."""
    if torch.cuda.is_available():
        return {"": f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"}
    return {"": "cpu"}


def _quantization_config(quantization: str | None):
    from transformers import BitsAndBytesConfig

    if quantization is None:
        return None
    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            # bfloat16 compute on GPU; the CPU backend of bitsandbytes computes in float32.
            bnb_4bit_compute_dtype=torch.bfloat16 if torch.cuda.is_available() else torch.float32,
        )
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(
        f"Unknown quantization {quantization!r}; choose one of {', '.join(repr(q) for q in QUANTIZATION_CHOICES)}"
    )


def _keep_4bit_trainable_on_cpu(model: torch.nn.Module) -> None:
    """Stop bitsandbytes from silently breaking backprop through 4-bit layers on CPU.

    On CPUs with AVX512-BF16, ``bnb.nn.Linear4bit.forward`` repacks its weight *in place and for good* into an
    inference-only layout the first time it runs in eval mode on an input that does not require grad (which is
    exactly what ``generate()`` does). From then on every matmul goes through ``gemv_4bit``, which has no
    autograd formula: gradients through the frozen 4-bit layers become zero (PyTorch only warns), so LoRA
    adapters stop learning after the first rollout. Disabling that optimization keeps the ordinary
    dequantize-and-matmul path, which is differentiable (and, for a model this small, not slower).
    """
    import bitsandbytes as bnb

    count = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit) and getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
            count += 1
    if count:
        logger.debug("Disabled the inference-only CPU repacking of %d bitsandbytes Linear4bit layers", count)


class _DropInt8CastWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("MatMul8bitLt: inputs will be cast")


def _quiet_int8_cast_warning() -> None:
    """bitsandbytes logs one warning *per matmul* when a float32 input meets an int8 layer; keep it quiet."""
    bnb_logger = logging.getLogger("bitsandbytes.autograd._functions")
    if not any(isinstance(f, _DropInt8CastWarning) for f in bnb_logger.filters):
        bnb_logger.addFilter(_DropInt8CastWarning())


def load_base_model(
    path_or_name: str | None = None,
    *,
    quantization: str | None = None,
    dtype: str | torch.dtype = "float32",
) -> PreTrainedModel:
    """Load a causal language model.

    Args:
        path_or_name: anything :func:`resolve_model` accepts (``None`` = :data:`DEFAULT_MODEL`).
        quantization: ``None`` for plain weights; ``"4bit"`` for bitsandbytes NF4 with double quantization
            (compute dtype bfloat16 on CUDA, float32 on CPU), the QLoRA setup; ``"8bit"`` for bitsandbytes
            LLM.int8(). Quantized models are placed on this process's GPU (``LOCAL_RANK``) or on the CPU. On CPU,
            4-bit layers are kept differentiable after eval-mode forwards (see ``_keep_4bit_trainable_on_cpu``).
        dtype: dtype of the (non-quantized) weights, e.g. ``"float32"`` (the default, right for CPU) or
            ``"bfloat16"``.

    Returns:
        The model, in eval mode as ``from_pretrained`` leaves it. Unquantized models stay on the CPU. A model on the
        CPU with grouped-query attention computes it with :func:`~trl_multiagent.models.grouped_attention.grouped_sdpa`.

    Raises:
        ValueError: unknown ``quantization`` or ``dtype``.
        ModelNotFoundError: the model cannot be resolved or loaded (missing package, hub unreachable, ...).
    """
    from transformers import AutoModelForCausalLM

    quant_config = _quantization_config(quantization)  # validate before any slow work
    torch_dtype = _as_dtype(dtype)
    name = DEFAULT_MODEL if path_or_name is None else str(path_or_name)
    resolved = resolve_model(name)
    kwargs: dict[str, object] = {"dtype": torch_dtype}
    if quant_config is not None:
        kwargs["quantization_config"] = quant_config
        kwargs["device_map"] = _quantized_device_map()
    with _wrap_load_errors(name, resolved):
        model = AutoModelForCausalLM.from_pretrained(resolved, **kwargs)
    if quantization == "4bit":
        _keep_4bit_trainable_on_cpu(model)
        if all(p.device.type == "cpu" for p in model.parameters()):
            import importlib.util

            if importlib.util.find_spec("kernels") is None:  # bitsandbytes' own notice is dropped at import
                logger.info("bitsandbytes computes the 4-bit layers on the CPU with its plain kernels (the optional "
                            "'kernels' package, its faster CPU path, is not installed)")
    elif quantization == "8bit":
        _quiet_int8_cast_warning()
    if quant_config is not None:
        _detach_from_checkpoint_file(model)
    if all(p.device.type == "cpu" for p in model.parameters()):
        use_grouped_attention(model)  # grouped-query attention without copying the keys and values
    logger.debug("Loaded %s (%s, quantization=%s)", resolved, torch_dtype, quantization)
    return model


def _detach_from_checkpoint_file(model) -> None:
    """Copy the weights that stayed unquantized (embeddings, norms) out of the memory-mapped checkpoint.

    Otherwise each quantized base keeps the whole full-precision ``model.safetensors`` mapped and resident, which
    costs about three times the quantized model's size per base on CPU.
    """
    for param in model.parameters():
        if param.device.type == "cpu" and param.dtype.is_floating_point and param.numel() > 0:
            param.data = param.data.clone()
    for buffer_owner in model.modules():
        for name, buf in list(buffer_owner.named_buffers(recurse=False)):
            if buf is not None and buf.device.type == "cpu":
                buffer_owner._buffers[name] = buf.clone()


def context_length(name: str | None) -> int | None:
    """The longest sequence (prompt + completion) a model accepts, read from its config without loading weights;
    ``None`` when the config cannot be read here (e.g. a hub id offline: loading reports that) or names no limit."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(resolve_model(name))
    except Exception:  # noqa: BLE001 - any failure here is reported, better worded, when the model loads
        return None
    text = config.get_text_config()
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def _check_config_loads(name: str, resolved: str) -> None:
    """Raise :class:`ModelNotFoundError` if the config of ``resolved`` cannot be loaded (fetching it if needed)."""
    from transformers import AutoConfig

    with _wrap_load_errors(name, resolved):
        AutoConfig.from_pretrained(resolved)


def main(argv: list[str] | None = None) -> int:
    """``python -m trl_multiagent.models.loading prepare [name]``: convert an embedded model and print its path."""
    parser = argparse.ArgumentParser(prog="python -m trl_multiagent.models.loading", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="resolve a model (converting an embedded GGUF once) and print its path")
    prepare.add_argument(
        "name",
        nargs="?",
        default=DEFAULT_MODEL,
        help=f"embedded short name ({', '.join(sorted(EMBEDDED_MODELS))}), local directory or hub id "
        f"(default: {DEFAULT_MODEL})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        path = resolve_model(args.name)
        if args.name.strip().lower() not in EMBEDDED_MODELS:
            _check_config_loads(args.name, path)  # a hub id or directory: fail now, not at training time
    except ModelNotFoundError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"{path}\n")  # the command's answer: the checkpoint's folder
    return 0


# ---------------------------------------------------------------------------------------------------------------
# LoRA targets
# ---------------------------------------------------------------------------------------------------------------


#: Names of the output layer (LM head) in the model families transformers ships.
OUTPUT_LAYER_NAMES = ("lm_head", "embed_out", "output_layer")


def check_lora_targets(owner: str, targets: str | list[str] | tuple[str, ...]) -> None:
    """Refuse LoRA on the output layer: the trainers compute log-probs from the LM head's base weight directly
    (TRL's fused head), so such an adapter would be used when generating but never trained.

    ``targets`` as PEFT reads them: a list of module-name suffixes, or one string that is a regular expression
    matched against full module names (``"all-linear"`` leaves the output layer out)."""
    if isinstance(targets, str):
        hit = [] if targets == "all-linear" else [n for n in OUTPUT_LAYER_NAMES if re.fullmatch(targets, n)]
    else:
        hit = [t for t in targets if t.split(".")[-1] in OUTPUT_LAYER_NAMES]
    if hit:
        raise ValueError(f"{owner}: lora_target_modules {targets!r} puts LoRA on the output layer {hit[0]!r}, which "
                         "is not supported: log-probs for the loss are computed from the LM head's base weight "
                         "(TRL's fused head), so an adapter there would change generation but never be trained. "
                         "Leave it out (\"all-linear\" already does).")


if __name__ == "__main__":
    # Run the package's copy of this module (``trl_multiagent/__init__`` imports it), so that the classes and the
    # logger are the same objects everywhere instead of duplicates living in ``__main__``.
    from trl_multiagent.models.loading import main as _package_main

    sys.exit(_package_main())
