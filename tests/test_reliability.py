"""No silent wrong results: the inputs of the reliability report, one by one, and saving."""

from __future__ import annotations

import io

import pytest
import torch

import nestbatch as nb
from nestbatch import Layout, NestedBatch, RaggedBatch


def _batch() -> NestedBatch:
    return nb.nested([torch.arange(3.0), torch.arange(2.0)])


# ------------------------------------------------------------------------ silent wrong results
def test_max_len_below_a_sample_is_refused_at_construction():
    with pytest.raises(ValueError, match="max_len=2"):
        NestedBatch.from_lengths(torch.arange(5), [2, 3], max_len=2)
    with pytest.raises(ValueError, match="max_len=2"):
        NestedBatch.from_offsets(torch.arange(5), torch.tensor([0, 2, 5]), max_len=2)
    with pytest.raises(ValueError, match="max_len"):
        NestedBatch.from_lengths(torch.arange(5), [2, 3], max_len=-1)


@pytest.mark.parametrize(
    "build",
    [
        lambda: NestedBatch.from_lengths(torch.arange(4.0), [1.9, 1.9]),
        lambda: NestedBatch.from_lengths(torch.arange(2.0), [True, True]),
        lambda: NestedBatch.from_padded(torch.zeros(2, 3), [1.7, 2.2]),
        lambda: NestedBatch.from_padded(torch.zeros(2, 3), "21"),
        lambda: NestedBatch.from_row_limits(torch.arange(5.0), [2.9, 5]),
        lambda: NestedBatch.from_row_starts(torch.arange(5.0), [0, 2.5]),
    ],
)
def test_fractional_bool_and_string_sizes_are_refused(build):
    with pytest.raises(TypeError, match="must be"):
        build()


def test_truth_value_of_a_batch_is_ambiguous():
    a = _batch()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(a == a + 1)
    with pytest.raises(RuntimeError, match="ambiguous"):
        if a:
            pass


def test_equal_and_allclose_compare_structure_and_values():
    a = _batch()
    assert a.equal(a.clone()) and torch.equal(a, a.clone())
    assert not torch.equal(a, a + 1)
    assert not a.equal(nb.nested([torch.arange(2.0), torch.arange(3.0)]))  # other structure
    assert a.equal(a.to(torch.float64))  # values compared across dtypes, as torch.equal
    assert not a.equal((a + 0.5).to(torch.float64))
    assert not torch.equal(a, a.values)
    assert torch.allclose(a, a + 1e-9) and not torch.allclose(a, a + 1)
    assert a.to(Layout.PADDED).equal(a)  # layouts do not matter


# ------------------------------------------------------------------------ valid input accepted
def test_zero_size_features():
    batch = nb.nested([torch.zeros(2, 0), torch.zeros(3, 0)])
    assert batch.lengths.tolist() == [2, 3] and batch.padded().data.shape == (2, 3, 0)


def test_meta_tensors_with_host_sizes():
    batch = NestedBatch.from_lengths(torch.zeros(5, 4, device="meta"), [2, 3])
    assert batch.padded().data.shape == (2, 3, 4)


def test_empty_index_list_selects_no_sample():
    assert _batch()[[]].batch_size == 0


# ------------------------------------------------------------------------ clear errors
@pytest.mark.parametrize(
    "build, error, name",
    [
        (lambda: NestedBatch.from_lengths(torch.arange(3.0), None), TypeError, "lengths"),
        (lambda: NestedBatch.from_lengths(torch.arange(3.0), [1, "a"]), TypeError, "lengths"),
        (lambda: NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([0, 0, 1]),
                                          num_rows="3"), TypeError, "num_rows"),
        (lambda: NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([0, 0, 1]),
                                          num_rows=5.0), TypeError, "num_rows"),
        (lambda: NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([0, 0, 1]),
                                          num_rows=-1), ValueError, "num_rows"),
        (lambda: NestedBatch.from_row_ids(torch.arange(3.0), torch.tensor([0, 0, 1]),
                                          num_rows=2**40), ValueError, "num_rows"),
        (lambda: nb.nested([torch.zeros(2)], num_ragged_dims=None), TypeError,
         "num_ragged_dims"),
        (lambda: nb.nested([torch.zeros(2)], num_ragged_dims=1.5), TypeError, "num_ragged_dims"),
        (lambda: _batch()[None], TypeError, "index"),
        (lambda: _batch()["a"], TypeError, "index"),
        (lambda: NestedBatch.from_row_starts(torch.tensor(3.0), [0]), ValueError, "values"),
        (lambda: NestedBatch.from_row_ids(torch.tensor(3.0), torch.tensor(0)), ValueError,
         "values"),
        # (what torch.full refuses: -1 is 255 in uint8 and 1e10 inf in float16, as torch's)
        (lambda: nb.nested([torch.arange(3, dtype=torch.uint8)]).padded(256), ValueError,
         "padding_value"),
        (lambda: nb.nested([torch.ones(2)]).padded(1e300), ValueError, "padding_value"),
    ],
)
def test_bad_arguments_get_a_clear_error(build, error, name):
    with pytest.raises(error, match=name):
        build()


# ------------------------------------------------------------------------ saving and loading
def _round_trip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer)  # weights_only=True, torch's default


@pytest.mark.parametrize("layout", [Layout.LIST, Layout.PACKED, Layout.PADDED])
def test_batches_load_with_weights_only(layout):
    batch = nb.nested([torch.randn(3, 2), torch.randn(0, 2), torch.randn(4, 2)]).to(layout)
    loaded = _round_trip(batch)
    assert loaded.layout is layout and loaded.equal(batch)


def test_device_sized_and_moved_batches_load_with_weights_only():
    values = torch.randn(5, 2, 3)
    from_offsets = NestedBatch.from_offsets(values, torch.tensor([0, 2, 5]))
    assert _round_trip(from_offsets).equal(from_offsets)
    moved = from_offsets.transpose(1, 2)
    loaded = _round_trip(moved)
    assert loaded.ragged_dim == 2 and loaded.equal(moved)
    images = nb.nested([torch.randn(2, 3, 1), torch.randn(4, 1, 1)], num_ragged_dims=2)
    assert _round_trip(images).equal(images)


def test_ragged_batch_loads_with_weights_only():
    ragged = RaggedBatch(torch.randn(2, 4, 3), sample_sizes=torch.tensor([1, 4]))
    loaded = _round_trip(ragged)
    assert torch.equal(loaded.tensor, ragged.tensor)
    assert torch.equal(loaded.sample_sizes, ragged.sample_sizes)
