"""Tiny randomly initialised causal LMs and tokenizers, built on the spot for fast tests (no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from trl_multiagent.testing import CHAR_SPECIALS, char_tokenizer

SPECIALS = CHAR_SPECIALS
LETTERS = list("AB")


def build_tokenizer(chars: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: special tokens, then one token per character of ``chars`` (others -> <unk>)."""
    return char_tokenizer(chars if chars is not None else LETTERS)


#: the widest sum inside a tiny model of the default size: its MLP's intermediate width (2 x hidden 32), wider than
#: its hidden size and its vocabularies (the numerical tests count summed terms with it: tests/numerics.py)
WIDEST = 64


def model_terms(tokens: int, widest: int = WIDEST) -> int:
    """The summed terms behind a tiny model's outputs and gradients over a batch of ``tokens`` positions: a weight's
    gradient sums over every position, each of them over a layer's width (tests/numerics.py)."""
    return tokens * widest


def build_model(vocab_size: int, seed: int = 0, hidden: int = 32, layers: int = 2, max_positions: int = 256,
                initializer_range: float = 0.02) -> LlamaForCausalLM:
    """A random Llama. The default initialisation gives models that respond almost only to the last token; a larger
    ``initializer_range`` (e.g. 0.1) makes the outputs depend on the whole context."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions, pad_token_id=0, eos_token_id=1, bos_token_id=None,
                         tie_word_embeddings=False, initializer_range=initializer_range)
    return LlamaForCausalLM(config)


def save_tiny(directory: str | Path, chars: list[str] | None = None, seed: int = 0, **model_kwargs) -> str:
    """Write a tiny model + tokenizer checkpoint to ``directory`` and return its path."""
    directory = Path(directory)
    tok = build_tokenizer(chars)
    model = build_model(len(tok), seed=seed, **model_kwargs)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)


def prob_first_choice(pool, agent: str, prompt, first: str = "A", second: str = "B") -> float:
    """P(first | first or second) of ``agent``'s next token after ``prompt``, read exactly from its policy (adapter
    active) in ``pool``; the learning tests use it to follow a policy without sampling."""
    ids = torch.tensor([pool.encode_prompt(agent, prompt)])
    with torch.no_grad():
        logits = pool(pool.policy_of(agent), input_ids=ids).logits[0, -1]
    tok = pool.tokenizer_of(agent)
    pair = [tok.convert_tokens_to_ids(first), tok.convert_tokens_to_ids(second)]
    return torch.softmax(logits[pair], dim=0)[0].item()
