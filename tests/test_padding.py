"""The one padding of token rows (trl_multiagent/generation/padding.py), by hand."""

import math

import pytest
import torch

from trl_multiagent.generation.padding import left_pad, pad_token_id, right_pad, right_pad_values


def test_left_and_right_padding_of_token_rows():
    ids, mask = left_pad([[5, 6, 7], [8], []], 0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]] and ids.dtype == torch.long
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]] and mask.dtype == torch.long
    ids, mask = right_pad([[5, 6], [8]], 9, width=3)
    assert ids.tolist() == [[5, 6, 9], [8, 9, 9]] and mask.tolist() == [[1, 1, 0], [1, 0, 0]]
    ids, _ = left_pad([[1, 2]], dtype=torch.int32, device="cpu")
    assert ids.dtype == torch.int32
    with pytest.raises(ValueError, match="does not fit"):
        right_pad([[1, 2, 3]], width=2)


def test_right_padding_of_float_rows():
    values = right_pad_values([[0.5, -1.0], []], 3)
    assert values.dtype == torch.float32 and values.tolist() == [[0.5, -1.0, 0.0], [0.0, 0.0, 0.0]]
    nan = right_pad_values([[0.25]], 2, fill=math.nan)
    assert nan[0, 0].item() == 0.25 and math.isnan(nan[0, 1].item())


def test_pad_token_id_falls_back_to_eos():
    class Tok:
        pad_token_id, eos_token_id = None, 2

    assert pad_token_id(Tok()) == 2
    Tok.pad_token_id = 0
    assert pad_token_id(Tok()) == 0
