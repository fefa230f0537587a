"""Padding of token rows into batch tensors: the one implementation every batch of the library is built with.

* :func:`left_pad`: rows end at the last column (prompts: the last column is every row's last token, where
  generation and the teacher-forced pass continue from);
* :func:`right_pad`: rows start at column 0 (completions, and inputs whose real tokens keep positions
  ``0..len-1``);
* :func:`right_pad_values`: per-token floats (log-probs, advantages, values), right-padded with a fill value.

The token paddings return ``(values, mask)``, the mask ``torch.long`` with 1 on real tokens. :func:`pad_token_id` is
the id a tokenizer pads with (its pad token, else its EOS token).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_token_id(tokenizer) -> int:
    """The id ``tokenizer`` pads with: its pad token, or its EOS token when it has none."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def left_pad(rows: Sequence[Sequence[int]], pad_id: int = 0, *, width: int | None = None,
             dtype: torch.dtype = torch.long, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``: the ``rows`` left-padded with ``pad_id`` to ``width`` columns (default: the longest row)."""
    return _pad(rows, pad_id, True, width, dtype, device)


def right_pad(rows: Sequence[Sequence[int]], pad_id: int = 0, *, width: int | None = None,
              dtype: torch.dtype = torch.long, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)``: the ``rows`` right-padded with ``pad_id`` to ``width`` columns (default: the longest row)."""
    return _pad(rows, pad_id, False, width, dtype, device)


def right_pad_values(rows: Sequence[Sequence[float]], width: int | None = None, *, fill: float = 0.0,
                     dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The float ``rows`` right-padded with ``fill`` to ``width`` columns (default: the longest row)."""
    return _pad(rows, fill, False, width, dtype, device)[0]


def _pad(rows, value, left: bool, width: int | None, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max((len(r) for r in rows), default=0)
    width = longest if width is None else width
    if longest > width:
        raise ValueError(f"a row of {longest} entries does not fit in {width} columns")
    values = torch.full((len(rows), width), value, dtype=dtype)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if len(row):
            columns = slice(width - len(row), width) if left else slice(0, len(row))
            values[i, columns] = torch.as_tensor(row, dtype=dtype)
            mask[i, columns] = 1
    if device is not None:
        values, mask = values.to(device), mask.to(device)
    return values, mask
