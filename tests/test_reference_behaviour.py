"""Behaviours of the reference implementations that code moving to nestbatch relies on (issue
#15): empty samples in any shape, the reference's exception types, the validation it does."""

from __future__ import annotations

import math

import pytest
import torch

import nestbatch as nb
from nestbatch import NestedBatch, RaggedBatch
from nestbatch.batching_helpers import combine_data


# ------------------------------------------------------------------ empty samples in any shape
def _boxes():
    gen = torch.Generator().manual_seed(0)
    return [torch.rand(3, 4, generator=gen), torch.rand(2, 4, generator=gen)]


@pytest.mark.parametrize(
    "empty",
    [torch.tensor([[]]), torch.tensor([]), torch.zeros(0, 7), torch.zeros(2, 0, 3),
     torch.zeros(0, 4, dtype=torch.int64)],
    ids=["[[]]", "[]", "(0, 7)", "(2, 0, 3)", "int64 (0, 4)"],
)
def test_combine_data_counts_an_empty_sample_of_any_shape_as_size_zero(empty):
    """The reference's perception example passes ``torch.tensor([[]])`` beside (n, 4) boxes."""
    boxes = _boxes()
    got = combine_data([boxes[0], empty, boxes[1]])
    want = combine_data([boxes[0], torch.zeros(0, 4), boxes[1]])
    assert torch.equal(got.sample_sizes, torch.tensor([3, 0, 2]))
    assert torch.equal(got.tensor, want.tensor) and got.tensor.dtype == torch.float32
    # The first sample may be the empty one too.
    first = combine_data([empty, *boxes])
    assert first.tensor.shape == (3, 3, 4) and first.sample_sizes.tolist() == [0, 3, 2]


def test_list_constructors_count_empty_samples_of_any_shape_as_size_zero():
    boxes = _boxes()
    samples = [boxes[0], torch.tensor([[]]), boxes[1], torch.tensor([])]
    for batch in (nb.nested(samples), nb.as_nested(samples), NestedBatch.from_list(samples)):
        assert batch.lengths.tolist() == [3, 0, 2, 0] and batch.feature_shape == (4,)
        assert torch.equal(batch.values, torch.cat(boxes))
    # Several ragged dims: the empty sample takes zero in every ragged dim.
    grid = nb.nested([torch.rand(2, 3, 5), torch.tensor([[]])], num_ragged_dims=2)
    assert grid.partition.host_shapes == ((2, 3), (0, 0))


def test_empty_samples_that_fit_keep_their_shape_and_mismatches_with_elements_still_raise():
    # (1, 0) fits a batch of (n, 0) samples: one row of no features, not an empty sample.
    batch = nb.nested([torch.zeros(2, 0), torch.zeros(1, 0)])
    assert batch.lengths.tolist() == [2, 1]
    with pytest.raises(ValueError, match="feature shape"):
        nb.nested([torch.rand(3, 4), torch.rand(1, 5)])
    with pytest.raises(ValueError, match="sample 1 has shape"):
        combine_data([torch.rand(3, 4), torch.rand(1, 5)])
    # All samples empty: nothing to take a shape from, so they must agree as usual.
    assert nb.nested([torch.zeros(0, 4), torch.zeros(0, 4)]).feature_shape == (4,)


# ----------------------------------------------------------- validation the reference does
@pytest.mark.parametrize("check_bounds", [True, False])
def test_index_mapping_refuses_index_batches_of_different_sample_sizes(check_bounds):
    data = torch.randn(2, 5, 3)
    indices = torch.zeros(2, 4, dtype=torch.int64)
    source = RaggedBatch(indices, sample_sizes=torch.tensor([1, 2]))
    target = RaggedBatch(indices.clone(), sample_sizes=torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="same sample sizes"):
        nb.batched_index_mapping(data, source, target, data, check_bounds=check_bounds)
    # Equal sizes in distinct tensors are fine, and give the shared-sizes result.
    twin = RaggedBatch(indices.clone(), sample_sizes=torch.tensor([1, 2]))
    shared = source.create_with_sample_sizes_like_self(indices.clone())
    assert torch.equal(nb.batched_index_mapping(data, source, twin, data),
                       nb.batched_index_mapping(data, source, shared, data))


def test_validation_the_reference_does_before_computing():
    rb = RaggedBatch(torch.zeros(2, 3), sample_sizes=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="cannot broadcast"):
        rb.broadcast_batch_dims_to_shape((3,))
    other = RaggedBatch(torch.zeros(3, 3), sample_sizes=torch.tensor([1, 2, 0]))
    with pytest.raises(ValueError, match="cannot broadcast"):
        RaggedBatch.broadcast_batch_dims([rb, other])
    with pytest.raises(ValueError, match="uniform lengths"):
        combine_data([[torch.rand(2, 3)], [torch.rand(1, 3), torch.rand(2, 3)]],
                     flatten_batch_dims=False)
    with pytest.raises(ValueError, match="sample 1 has shape"):
        combine_data([[torch.rand(2, 3)], [torch.rand(1, 4)]])
    wrong_dims = RaggedBatch(torch.zeros(2, 4, 2, dtype=torch.int64),
                             sample_sizes=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="max_num_indices"):
        nb.batched_indexing_access(torch.randn(2, 5, 3), wrong_dims)
    with pytest.raises(ValueError, match="max_num_indices"):
        nb.get_mask_from_indices(5, wrong_dims)


# --------------------------------------------------------------------------- exception types
def _bad_calls():
    data = torch.randn(2, 5, 3)
    sizes = torch.tensor([1, 2])
    indices = RaggedBatch(torch.tensor([[0, 0], [1, 7]]), sample_sizes=sizes)
    return [
        (ValueError, lambda: RaggedBatch(torch.zeros(2, 3), sample_sizes=torch.tensor([1]))),
        (ValueError, lambda: RaggedBatch(torch.zeros(2, 3), sample_sizes=sizes)
         .broadcast_batch_dims_to_shape((3,))),
        (TypeError, lambda: nb.batched_indexing_access(data, torch.zeros(2, 2))),
        (IndexError, lambda: nb.batched_indexing_access(data, indices)),
        (ValueError, lambda: combine_data([torch.rand(3, 4), torch.rand(1, 5)])),
        (ValueError, lambda: nb.get_mask_from_indices(-1, indices)),
        (TypeError, lambda: nb.batched_index_mapping(data, indices, indices.int(), data)),
        (ValueError, lambda: nb.batched_indexing_write(torch.randn(2, 2), indices, data)),
        (ValueError, lambda: combine_data([])),
        (ValueError, lambda: RaggedBatch.broadcast_batch_dims(
            [RaggedBatch(torch.zeros(2, 3), sample_sizes=sizes),
             RaggedBatch(torch.zeros(1, 2, 3), sample_sizes=sizes[None])])),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_errors_are_nestbatch_types_and_also_the_references(case):
    from nestbatch import errors

    kind, call = _bad_calls()[case]
    for catch in (kind, RuntimeError, AssertionError):
        with pytest.raises(catch) as caught:
            call()
    error = caught.value
    assert isinstance(error, kind) and isinstance(error, RuntimeError | AssertionError)
    assert type(error) in (errors.RaggedValueError, errors.RaggedTypeError,
                           errors.RaggedIndexError)
    assert str(error)  # the clear message is kept


def test_conversion_keeps_message_and_traceback():
    from nestbatch.errors import RaggedValueError, reference_compatible

    @reference_compatible
    def fails():
        raise ValueError("lengths must be non-negative, got -1")

    with pytest.raises(RaggedValueError, match="non-negative, got -1") as caught:
        fails()
    assert caught.traceback[-1].name == "fails"


# --------------------------------------------- operands with non-uniform dims in other places
def _moved(batch: RaggedBatch, dim: int) -> RaggedBatch:
    return batch.get_non_uniform_dimension_transposed_to(dim)


@pytest.mark.parametrize("write_dim, into_dim", [(2, 4), (3, 1), (4, 2), (1, 3)])
def test_bool_indexing_write_takes_operands_moved_to_different_dims(write_dim, into_dim):
    """The issue's example: the result keeps ``to_write_into``'s layout and, transposed back,
    equals the untransposed call."""
    gen = torch.Generator().manual_seed(write_dim * 10 + into_dim)
    sizes = torch.tensor([2, 5, 0])
    raw = torch.rand(3, 5, generator=gen) < 0.6
    mask = RaggedBatch(raw, sample_sizes=sizes)
    counts = (raw & (torch.arange(5) < sizes[:, None])).sum(1)
    to_write = RaggedBatch(torch.randn(3, int(counts.max()), 2, 4, 6, generator=gen),
                           sample_sizes=counts)
    into = RaggedBatch(torch.randn(3, 5, 2, 4, 6, generator=gen), sample_sizes=sizes)
    plain = nb.batched_bool_indexing_write(to_write, mask, into)
    moved = nb.batched_bool_indexing_write(_moved(to_write, write_dim), mask,
                                           _moved(into, into_dim))
    assert moved.non_uniform_dim == into_dim
    assert torch.equal(_moved(moved, 1).tensor, plain.tensor)
    # The selection itself, from a moved operand, keeps that operand's layout.
    picked = nb.batched_bool_indexing(_moved(into, into_dim), mask)
    assert picked.non_uniform_dim == into_dim
    assert torch.equal(_moved(picked, 1).tensor, nb.batched_bool_indexing(into, mask).tensor)


@pytest.mark.parametrize("source_dim, target_dim", [(3, 4), (1, 2), (4, 1)])
def test_index_mapping_takes_data_moved_to_different_dims(source_dim, target_dim):
    gen = torch.Generator().manual_seed(source_dim * 10 + target_dim)
    sizes = torch.tensor([2, 4, 0])
    source_indices = RaggedBatch(torch.randint(0, 5, (3, 4), generator=gen), sample_sizes=sizes)
    targets = torch.stack([torch.randperm(6, generator=gen)[:4] for _ in range(3)])
    target_indices = source_indices.create_with_sample_sizes_like_self(targets)
    source = RaggedBatch(torch.randn(3, 5, 2, 4, 3, generator=gen),
                         sample_sizes=torch.tensor([5, 5, 5]))
    target = RaggedBatch(torch.randn(3, 6, 2, 4, 3, generator=gen),
                         sample_sizes=torch.tensor([6, 6, 6]))
    plain = nb.batched_index_mapping(source, source_indices, target_indices, target)
    moved = nb.batched_index_mapping(_moved(source, source_dim), source_indices, target_indices,
                                     _moved(target, target_dim))
    assert moved.non_uniform_dim == target_dim
    assert torch.equal(_moved(moved, 1).tensor, plain.tensor)


# --------------------------------------------------------- one name per concept on the batch
def test_one_name_per_concept():
    samples = [torch.tensor([[1, 2], [3, 4]]), torch.zeros(0, 2, dtype=torch.int64),
               torch.tensor([[5, 6]])]
    batch = nb.nested(samples)
    assert batch.tolist() == [s.tolist() for s in samples] == batch.to_list()
    assert all(torch.equal(a, b) for a, b in zip(batch.unbind(), samples))
    assert all(torch.equal(a, b) for a, b in zip(batch, samples))
    assert torch.equal(batch[2], samples[2])
    padded = batch.to_padded_tensor(-1)
    assert padded.tolist() == [[[1, 2], [3, 4]], [[-1, -1], [-1, -1]], [[5, 6], [-1, -1]]]
    assert torch.equal(batch.to_tensor(-1), padded)
    assert batch.to_padded_tensor(0, output_size=(3, 4, 2)).shape == (3, 4, 2)
    assert batch.to_padded_tensor(0, output_size=(3, -1, 2)).shape == (3, 2, 2)
    with pytest.raises(ValueError, match="only ragged dims are padded"):
        batch.to_padded_tensor(0, output_size=(3, 4, 5))
    with pytest.raises(ValueError, match="3 entries"):
        batch.to_padded_tensor(0, output_size=(3, 4))
    for gone in ("sample", "to_pylist", "to_padded", "from_trailing_padding",
                 "to_packed_sequence", "from_packed_sequence", "to_nested_tensor",
                 "from_nested_tensor"):
        assert not hasattr(NestedBatch, gone), gone
    sequences = nb.nested([torch.randn(3, 4), torch.randn(1, 4)])
    back = nb.from_packed_sequence(nb.to_packed_sequence(sequences))
    assert torch.equal(back.values, sequences.values)
    assert torch.equal(nb.from_nested_tensor(nb.to_nested_tensor(sequences)).values,
                       sequences.values)
    with pytest.raises(TypeError, match="takes a NestedBatch"):
        nb.to_packed_sequence(torch.randn(3, 4))


# ------------------------------------------------- the reference's checks, words and repr
def _index_pairs(source_dtype, target_dtype):
    sizes = torch.tensor([2, 1])
    source = RaggedBatch(torch.tensor([[0, 2], [1, 0]], dtype=source_dtype), sample_sizes=sizes)
    target = RaggedBatch(torch.tensor([[3, 1], [0, 0]], dtype=target_dtype), sample_sizes=sizes)
    return source, target


@pytest.mark.parametrize("check_bounds", [True, False])
@pytest.mark.parametrize("source_dtype, target_dtype",
                         [(torch.int64, torch.int32), (torch.int32, torch.int64)])
def test_index_mapping_refuses_index_batches_of_different_dtypes(source_dtype, target_dtype,
                                                                 check_bounds):
    """The reference's kernel reads both index batches with one index type: a mix raises a
    ``RuntimeError`` there. nestbatch names both arguments and dtypes."""
    data = torch.randn(2, 4, 3)
    source, target = _index_pairs(source_dtype, target_dtype)
    words = (f"source_indices has dtype {source_dtype} but target_indices has dtype "
             f"{target_dtype}")
    for catch in (RuntimeError, TypeError, AssertionError):
        with pytest.raises(catch, match=words):
            nb.batched_index_mapping(data, source, target, data, check_bounds=check_bounds)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_index_mapping_takes_index_batches_of_one_dtype(dtype):
    data = torch.arange(24.0).view(2, 4, 3)
    source, target = _index_pairs(dtype, dtype)
    out = nb.batched_index_mapping(data, source, target, torch.zeros(2, 4, 3))
    assert torch.equal(out[0, 3], data[0, 0]) and torch.equal(out[0, 1], data[0, 2])
    assert torch.equal(out[1, 0], data[1, 1])


def _writes_with_operands_of_different_dims():
    sizes = torch.tensor([2, 1])
    indices = RaggedBatch(torch.tensor([[0, 2], [1, 0]]), sample_sizes=sizes)
    mask = torch.tensor([[True, False, True, False], [False, True, False, False]])
    values = RaggedBatch(torch.randn(2, 2, 3), sample_sizes=sizes)
    return {
        "indexing_write, more dims in to_write": lambda: nb.batched_indexing_write(
            torch.randn(2, 2, 3), indices, torch.zeros(2, 4)),
        "indexing_write, fewer dims in to_write": lambda: nb.batched_indexing_write(
            torch.randn(2, 2), indices, torch.zeros(2, 4, 3)),
        "bool_indexing_write": lambda: nb.batched_bool_indexing_write(
            values, mask, torch.zeros(2, 4)),
        "bool_indexing_write, ragged target": lambda: nb.batched_bool_indexing_write(
            values, mask, RaggedBatch(torch.zeros(2, 4, 3, 1), sample_sizes=torch.tensor([4, 2]))),
        "index_mapping": lambda: nb.batched_index_mapping(
            torch.randn(2, 4), indices, indices, torch.zeros(2, 4, 3)),
    }


@pytest.mark.parametrize("case", list(_writes_with_operands_of_different_dims()))
def test_writes_refuse_operands_of_different_numbers_of_dims_in_the_references_words(case):
    """The reference asserts ``to_write.dim() == to_write_into.dim()`` (boolean write) and its
    kernels assert the same of the two data operands (indexed write, mapping)."""
    call = _writes_with_operands_of_different_dims()[case]
    for catch in (ValueError, RuntimeError, AssertionError):
        with pytest.raises(catch, match="must have the same number of dimensions"):
            call()


def test_combine_data_refuses_an_empty_list_as_the_reference():
    """The reference asserts ``len(data_list) > 0``; nested lists without a sample still give
    an empty batch (the reference's ``Empty(2, 1)`` there too)."""
    for empty in ([], ()):
        for catch in (ValueError, AssertionError):
            with pytest.raises(catch, match="data_list must not be empty"):
                combine_data(empty)
    nothing = combine_data([[], []])
    assert nothing.batch_shape == (0,) and nothing.dim() == 2


def _batch(*batch_shape):
    sizes = torch.arange(math.prod(batch_shape)).view(batch_shape) % 3
    return RaggedBatch(torch.randn(*batch_shape, 2, 5), sample_sizes=sizes)


def test_broadcast_batch_dims_repeats_each_dim_to_a_multiple_of_its_size():
    batches = [_batch(2, 3), _batch(4, 3), _batch(2, 6)]
    out = RaggedBatch.broadcast_batch_dims(batches)
    assert [tuple(b.batch_shape) for b in out] == [(4, 6)] * 3
    for before, after in zip(batches, out):
        reps = (4 // before.batch_shape[0], 6 // before.batch_shape[1])
        assert torch.equal(after.tensor, before.tensor.repeat(*reps, 1, 1))
        assert torch.equal(after.sample_sizes, before.sample_sizes.repeat(*reps))


@pytest.mark.parametrize("shapes", [[(2, 3), (3,)], [(3,), (1, 3)], [(2, 3), (2, 3), (1, 1, 3)]])
def test_broadcast_batch_dims_refuses_different_numbers_of_batch_dims(shapes):
    """The reference stacks the batch shapes and asserts when that fails: it never adds a
    batch dim, unlike torch broadcasting."""
    for catch in (ValueError, AssertionError, RuntimeError):
        with pytest.raises(catch, match="number of batch dims differs"):
            RaggedBatch.broadcast_batch_dims([_batch(*shape) for shape in shapes])


@pytest.mark.parametrize("shapes", [[(2, 3), (3, 3)], [(2, 4), (2, 6)], [(4,), (6,)]])
def test_broadcast_batch_dims_refuses_sizes_that_are_not_multiples(shapes):
    with pytest.raises(AssertionError, match="cannot broadcast batch shape"):
        RaggedBatch.broadcast_batch_dims([_batch(*shape) for shape in shapes])


def test_repr_has_the_references_fields_in_its_order():
    rb = RaggedBatch(torch.tensor([[1, 2, 0], [3, 0, 0]]), sample_sizes=torch.tensor([2, 1]))
    text = repr(rb)
    fields = ["tensor=", "mask=", "sample_sizes=", "non_uniform_dim=", "batch_shape="]
    positions = [text.index(field) for field in fields]
    assert positions == sorted(positions)
    assert text.startswith("RaggedBatch(tensor=tensor(")
    assert text.endswith("non_uniform_dim=1, batch_shape=torch.Size([2]))")
