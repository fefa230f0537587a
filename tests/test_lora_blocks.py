"""The block form of a mixed-adapter batch's LoRA deltas (trl_multiagent/generation/lora_batch.py: AdapterBlocks,
add_block_lora): the layout of the rows by hand, and the deltas against each row's own adapter computed row by row in
float64 (rows gathered into blocks or viewed in place, one projection or a group of several, 2-D and 3-D inputs)."""

import pytest
import torch

from trl_multiagent.generation.lora_batch import AdapterBlocks, add_block_lora


def test_blocks_lay_out_the_rows_by_adapter():
    blocks = AdapterBlocks.of(torch.tensor([1, 0, 1, 2, 0, 1]), 3)
    # adapter 1 has the most rows (3): blocks of 3 slots; adapter 0's rows 1, 4 take slots 0, 1; adapter 1's rows
    # 0, 2, 5 slots 3, 4, 5; adapter 2's row 3 slot 6; spare slots (2, 7, 8) read row 0
    assert blocks.size == 3 and not blocks.in_place and not blocks.full
    assert blocks.slot.tolist() == [3, 0, 4, 6, 1, 5]
    assert blocks.source.tolist() == [1, 4, 0, 0, 2, 5, 3, 0, 0]
    sorted_equal = AdapterBlocks.of(torch.tensor([0, 0, 1, 1]), 2)
    assert sorted_equal.in_place and sorted_equal.full and sorted_equal.size == 2
    unsorted = AdapterBlocks.of(torch.tensor([1, 1, 0, 0]), 2)  # equal counts, not in adapter order
    assert unsorted.full and not unsorted.in_place and unsorted.source.tolist() == [2, 3, 0, 1]
    spare = AdapterBlocks.of(torch.tensor([0, 0, 1]), 2)  # in order, unequal counts
    assert not spare.full and not spare.in_place
    assert AdapterBlocks.of(torch.tensor([0, -1, 1]), 2) is None  # a row without adapter: the masked form
    assert AdapterBlocks.of(torch.tensor([], dtype=torch.long), 2) is None
    assert AdapterBlocks.of(torch.tensor([0, 0]), 0) is None


def _expected(y, x, row_index, a_list, b_list, scale):
    """Row by row: y_r + scale_i * (x_r A_i^T) B_i^T for the row's adapter i (float64)."""
    out = y.clone()
    for r, i in enumerate(row_index.tolist()):
        out[r] += scale[i] * (x[r] @ a_list[i].t()) @ b_list[i].t()
    return out


# in place (rows already blocks); full (every adapter 2 rows, shuffled); spare slots; one adapter; one row
@pytest.mark.parametrize("row_index", [[0, 0, 1, 1, 2, 2], [2, 0, 1, 1, 0, 2], [2, 0, 1, 0, 2, 2, 1, 0], [1, 1, 1],
                                       [0]])
@pytest.mark.parametrize("middle", [(), (5,)])
def test_block_lora_is_each_rows_own_adapter(row_index, middle):
    torch.manual_seed(0)
    row_index = torch.tensor(row_index)
    n, d_in, d_out, rank = 3, 7, 6, 2
    a_list = [torch.randn(rank, d_in, dtype=torch.float64) for _ in range(n)]
    b_list = [torch.randn(d_out, rank, dtype=torch.float64) for _ in range(n)]
    scale = [0.5, 2.0, 1.5]
    a = torch.stack([m.t() for m in a_list])
    b = torch.stack([s * m.t() for s, m in zip(scale, b_list)])
    parts = [(0, d_out, slice(0, rank), b)]
    x = torch.randn(len(row_index), *middle, d_in, dtype=torch.float64)
    y = torch.randn(len(row_index), *middle, d_out, dtype=torch.float64)
    expected = _expected(y, x, row_index, a_list, b_list, scale)
    got = y.clone()
    blocks = AdapterBlocks.of(row_index, n)
    add_block_lora(got, x, blocks, a, parts)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("row_index", [[0, 0, 1, 1], [1, 0, 0, 1, 1], [1, 0, 1, 0]])
def test_a_group_of_projections_adds_each_projections_delta_into_its_columns(row_index):
    """q (4 outputs, rank 2) and v (3 outputs, rank 1) read one input: their A side by side, each its own B block
    (rows already blocks; rows gathered with spare slots; rows gathered, every slot a row)."""
    torch.manual_seed(1)
    row_index = torch.tensor(row_index)
    n, d_in = 2, 5
    shapes = [(4, 2), (3, 1)]  # (outputs, rank) of q and v
    a_q = [[torch.randn(r, d_in, dtype=torch.float64) for _ in range(n)] for _, r in shapes]
    b_q = [[torch.randn(o, r, dtype=torch.float64) for _ in range(n)] for o, r in shapes]
    scale = [3.0, 0.25]
    width, total = sum(o for o, _ in shapes), sum(r for _, r in shapes)
    a = torch.zeros(n, d_in, total, dtype=torch.float64)
    parts, first, offset = [], 0, 0
    for p, (o, r) in enumerate(shapes):
        block = torch.stack([scale[i] * b_q[p][i].t() for i in range(n)])
        for i in range(n):
            a[i, :, first:first + r] = a_q[p][i].t()
        parts.append((offset, o, slice(first, first + r), block))
        first, offset = first + r, offset + o
    x = torch.randn(len(row_index), d_in, dtype=torch.float64)
    y = torch.randn(len(row_index), width, dtype=torch.float64)
    expected = y.clone()
    for r, i in enumerate(row_index.tolist()):
        expected[r, :4] += scale[i] * (x[r] @ a_q[0][i].t()) @ b_q[0][i].t()
        expected[r, 4:] += scale[i] * (x[r] @ a_q[1][i].t()) @ b_q[1][i].t()
    got = y.clone()
    add_block_lora(got, x, AdapterBlocks.of(row_index, n), a, parts)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_rows_in_blocks_add_into_an_output_that_is_not_contiguous():
    """An output that is columns of a wider tensor (as the lean step's groups add into their projections' columns):
    the deltas land in that memory, and only there."""
    torch.manual_seed(2)
    row_index = torch.tensor([0, 0, 1, 1])
    a_list = [torch.randn(2, 3, dtype=torch.float64) for _ in range(2)]
    b_list = [torch.randn(4, 2, dtype=torch.float64) for _ in range(2)]
    a = torch.stack([m.t() for m in a_list])
    parts = [(0, 4, slice(0, 2), torch.stack([m.t() for m in b_list]))]
    x = torch.randn(4, 3, dtype=torch.float64)
    wide = torch.randn(4, 6, dtype=torch.float64)
    expected = _expected(wide[:, 1:5], x, row_index, a_list, b_list, [1.0, 1.0])
    outside = wide[:, [0, 5]].clone()
    add_block_lora(wide[:, 1:5], x, AdapterBlocks.of(row_index, 2), a, parts)
    torch.testing.assert_close(wide[:, 1:5], expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(wide[:, [0, 5]], outside)

