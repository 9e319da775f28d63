"""Ragged rank r >= 2 as an ordinary ``NestedBatch`` (TensorFlow's nested raggedness: documents
of sentences of words), against the TF ragged guide (seeds/003: its inputs and printed outputs)
and plain per-sample references.

Dims of a batch of ragged rank ``r``: 0 the batch, ``1..r`` the ragged levels outermost first,
then the feature dims. The references below hold a batch as a list of samples, a sample of ``d``
ragged dims being a list of samples of ``d - 1`` ragged dims, down to a tensor ``(n, *feature)``
for ``d == 1``; they are built by slicing the flat values with plain Python loops.
"""

from __future__ import annotations

import contextlib
import operator

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

import nestbatch as nb
from nestbatch import NestedBatch

# ================================================================================== references


def cut(seq, lengths):
    """``seq`` (a list or a tensor's rows) cut into consecutive pieces of ``lengths``."""
    pieces, start = [], 0
    for n in lengths:
        pieces.append(seq[start : start + n])
        start += n
    assert start == len(seq), "reference: lengths do not cover the sequence"
    return pieces


def build_reference(flat_values, nested_lengths):
    """The samples of the batch of ``flat_values`` and ``nested_lengths`` (outermost first)."""
    items = cut(flat_values, nested_lengths[-1])
    for lengths in reversed(nested_lengths[:-1]):
        items = cut(items, lengths)
    assert len(items) == len(nested_lengths[0])
    return items


def to_lists(node):
    """Nested Python lists of a reference node."""
    if isinstance(node, Tensor):
        return node.tolist()
    return [to_lists(child) for child in node]


def levels_of(samples, rank):
    """Every level's row lengths (outermost first) and the flat elements of a reference batch."""
    lengths, level = [], list(samples)
    for _ in range(rank):
        lengths.append([len(node) for node in level])
        level = [child for node in level for child in node]  # a tensor's children: its rows
    return lengths, level


def flatten_reference(samples, rank, feature, dtype):
    """``(flat_values, nested row lengths)`` of a reference batch."""
    lengths, elements = levels_of(samples, rank)
    flat = torch.stack(elements) if elements else torch.empty((0, *feature), dtype=dtype)
    return flat, lengths


def max_shape_reference(samples, rank):
    lengths, _ = levels_of(samples, rank)
    return tuple(max(level, default=0) for level in lengths)


def splits_of(lengths):
    splits = [0]
    for n in lengths:
        splits.append(splits[-1] + n)
    return splits


def pad_reference(samples, rank, feature, dtype, padding):
    """``(data, mask)``: every level padded to its maximum, ``padding`` where no element is."""
    maxima = max_shape_reference(samples, rank)
    data = torch.full((len(samples), *maxima, *feature), padding, dtype=dtype)
    mask = torch.zeros((len(samples), *maxima), dtype=torch.bool)

    def fill(node, index):
        if isinstance(node, Tensor):
            data[index][: len(node)] = node
            mask[index][: len(node)] = True
        else:
            for i, child in enumerate(node):
                fill(child, (*index, i))

    for i, sample in enumerate(samples):
        fill(sample, (i,))
    return data, mask


def extreme(dtype, lowest):
    """The dtype's lowest (``amax`` of nothing) or highest (``amin`` of nothing) finite value."""
    if dtype == torch.bool:
        return not lowest
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min if lowest else info.max


def reduce_rows(name, rows):
    """``torch.<name>`` over dim 0 of ``rows (n, *feature)``; ``n == 0`` gives TF's empty results
    (sum 0, prod 1, mean nan from torch; amax / amin the dtype's extremes)."""
    if rows.shape[0] == 0 and name in ("amax", "amin"):
        return torch.full(rows.shape[1:], extreme(rows.dtype, name == "amax"), dtype=rows.dtype)
    return getattr(torch, name)(rows, dim=0)


def stack_results(parts, name, proto):
    """Feature-shaped results as one ``(n, *feature)`` tensor (of the result dtype for n == 0)."""
    if parts:
        return torch.stack(parts)
    like = reduce_rows(name, proto)
    return like.new_empty((0, *like.shape))


def merge(children, depth, name, proto):
    """TF's reduction across rows: ``children`` (nodes of ``depth`` ragged dims; depth 0: the
    feature-shaped elements) aligned by position; position ``m`` reduces the children that have
    it (as if the shorter ones were padded with the op's identity; for mean, divided by how many
    have it). ``proto`` is an empty ``(0, *feature)`` tensor of the input dtype."""
    if depth == 0:
        return reduce_rows(name, torch.stack(children) if children else proto)
    longest = max((len(child) for child in children), default=0)
    parts = [
        merge([child[m] for child in children if len(child) > m], depth - 1, name, proto)
        for m in range(longest)
    ]
    return stack_results(parts, name, proto) if depth == 1 else parts


def reduce_level(node, depth, level, name, proto):
    """``node`` (``depth`` ragged dims) with its ragged dim ``level`` (1: outermost) reduced."""
    if level == 1:
        return merge(list(node), depth - 1, name, proto)
    parts = [reduce_level(child, depth - 1, level - 1, name, proto) for child in node]
    return stack_results(parts, name, proto) if depth == 2 else parts


def elements_of(node, depth, proto):
    """Every element of ``node`` (``depth`` ragged dims), ``(n, *feature)``."""
    if depth == 1:
        return node
    return torch.cat([proto, *(elements_of(child, depth - 1, proto) for child in node)])


def map_leaves(node, fn):
    """``fn`` of every innermost row of a reference node."""
    if isinstance(node, Tensor):
        return fn(node)
    return [map_leaves(child, fn) for child in node]


def zip_leaves(node, other, fn):
    """``fn`` of the matching innermost rows of two reference nodes of one structure."""
    if isinstance(node, Tensor):
        return fn(node, other)
    assert len(node) == len(other), "reference: structures differ"
    return [zip_leaves(a, b, fn) for a, b in zip(node, other)]


def result_dtype(name, dtype):
    return reduce_rows(name, torch.zeros(1, dtype=dtype)).dtype


# ==================================================================================== checks


def assert_matches(batch, samples, rank, feature, dtype):
    """``batch`` is a NestedBatch of ragged rank ``rank`` holding the reference ``samples``."""
    assert isinstance(batch, NestedBatch), f"expected a NestedBatch, got {type(batch).__name__}"
    assert batch.ragged_rank == rank
    assert len(batch) == len(samples)
    flat, lengths = flatten_reference(samples, rank, feature, dtype)
    assert [level.tolist() for level in batch.nested_row_lengths()] == lengths
    assert tuple(batch.feature_shape) == tuple(feature)
    torch.testing.assert_close(batch.flat_values, flat, equal_nan=True)


@contextlib.contextmanager
def labelled(*labels):
    """Name the loop iteration (a dtype, a dim) in the report of a failure inside the block."""
    try:
        yield
    except Exception as exc:
        exc.add_note(f"with {', '.join(map(str, labels))}")
        raise


def make_values(total, feature, dtype, seed=0):
    """Exact small values of ``dtype`` (quarters for floats)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (total, *feature)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return torch.randint(-8, 9, shape, generator=gen).to(dtype) / 4
    return torch.randint(-9, 10, shape, generator=gen).to(dtype)


def rank_of(nested_lengths):
    return len(nested_lengths)


# Cases: nested row lengths (outermost first) and the feature shape. Empty samples, empty rows
# at every level, one sample, the empty batch, ranks 2 and 3, feature dims 0-2.
CASES = {
    "guide": (([1, 0, 4], [3, 0, 2, 4, 1]), ()),
    "guide_f3": (([1, 0, 4], [3, 0, 2, 4, 1]), (3,)),
    "rank3": (([2, 0, 1], [1, 2, 0], [2, 0, 3]), (2,)),
    "rank3_f22": (([1, 2], [3, 0, 1], [1, 0, 2, 2]), (2, 2)),
    "one_sample": (([3], [2, 0, 1]), (2, 2)),
    "one_sample_rank3": (([1], [2], [0, 3]), ()),
    "empty_rows": (([2, 1], [0, 0, 0]), (2,)),
    "empty_samples": (([0, 0], []), ()),
    "empty_batch": (([], []), (3,)),
    "empty_batch_rank3": (([], [], []), ()),
}
DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool)
NUMERIC = (torch.float32, torch.float64, torch.int64)
REDUCTIONS = ("sum", "mean", "amax", "amin", "prod")


def dtypes_for(name):
    """The dtypes a reduction is checked in (torch's mean takes floating dtypes only)."""
    return [d for d in DTYPES if name != "mean" or d.is_floating_point]


def make_case(case, dtype, seed=0):
    """``(batch, samples, rank, feature)`` of a named case."""
    nested_lengths, feature = CASES[case]
    values = make_values(sum(nested_lengths[-1]), feature, dtype, seed)
    batch = NestedBatch.from_nested_row_lengths(values, nested_lengths)
    return batch, build_reference(values, nested_lengths), rank_of(nested_lengths), feature


# ============================================================================ TF guide examples

GUIDE_VALUES = torch.arange(10, 20)
GUIDE_SPLITS = ([0, 1, 1, 5], [0, 3, 3, 5, 9, 10])
GUIDE_LIST = [[[10, 11, 12]], [], [[], [13, 14], [15, 16, 17, 18], [19]]]


def test_guide_from_nested_row_splits():
    # Guide 8.1: tf.RaggedTensor.from_nested_row_splits(flat_values=[10, ..., 19],
    # nested_row_splits=([0, 1, 1, 5], [0, 3, 3, 5, 9, 10])); "Shape: (3, None, None)",
    # "Number of ragged dimensions: 2".
    rt = NestedBatch.from_nested_row_splits(GUIDE_VALUES, GUIDE_SPLITS)
    assert isinstance(rt, NestedBatch)
    assert rt.ragged_rank == 2 and rt.num_ragged_dims == 2
    assert rt.tolist() == GUIDE_LIST == rt.to_list()
    assert len(rt) == rt.batch_size == 3 and rt.dim() == 3
    assert rt.feature_shape == torch.Size([]) and rt.dtype == torch.int64
    assert rt.device == torch.device("cpu")
    assert torch.equal(rt.flat_values, GUIDE_VALUES)
    assert torch.equal(rt.packed().values, GUIDE_VALUES)
    splits = rt.nested_row_splits
    assert isinstance(splits, tuple) and len(splits) == 2
    assert all(s.dtype == torch.int64 for s in splits)
    assert [s.tolist() for s in splits] == [list(s) for s in GUIDE_SPLITS]
    lengths = rt.nested_row_lengths()
    assert isinstance(lengths, tuple) and all(s.dtype == torch.int64 for s in lengths)
    assert [s.tolist() for s in lengths] == [[1, 0, 4], [3, 0, 2, 4, 1]]
    assert rt.max_shape == (4, 4)
    # TF's rt.values: one level down, the rows of every sample.
    inner = rt.values
    assert isinstance(inner, NestedBatch) and inner.ragged_rank == 1
    assert inner.tolist() == [[10, 11, 12], [], [13, 14], [15, 16, 17, 18], [19]]


def test_guide_from_row_splits_of_a_ragged_tensor_via_nested():
    # Guide 8.1: tf.RaggedTensor.from_row_splits(values=tf.RaggedTensor.from_row_splits(
    # values=[10, ..., 19], row_splits=[0, 3, 3, 5, 9, 10]), row_splits=[0, 1, 1, 5]).
    inner = NestedBatch.from_offsets(GUIDE_VALUES, [0, 3, 3, 5, 9, 10])
    rt = nb.nested([inner[0:1], inner[1:1], inner[1:5]])
    assert isinstance(rt, NestedBatch) and rt.ragged_rank == 2
    assert rt.tolist() == GUIDE_LIST
    assert [s.tolist() for s in rt.nested_row_splits] == [list(s) for s in GUIDE_SPLITS]
    assert torch.equal(rt.flat_values, GUIDE_VALUES)


def test_guide_from_nested_row_lengths():
    rt = NestedBatch.from_nested_row_lengths(GUIDE_VALUES, ([1, 0, 4], [3, 0, 2, 4, 1]))
    assert isinstance(rt, NestedBatch) and rt.ragged_rank == 2
    assert rt.tolist() == GUIDE_LIST
    # Guide 1.3: tf.ragged.constant([[[1, 2], [3]], [[4, 5]]]) (type=int32, rank=3).
    small = NestedBatch.from_nested_row_lengths(torch.tensor([1, 2, 3, 4, 5]), ([2, 1], [2, 1, 2]))
    assert small.ragged_rank == 2 and small.dim() == 3
    assert small.tolist() == [[[1, 2], [3]], [[4, 5]]]


def test_guide_paragraphs_of_sentences_of_words():
    # Guide 1.2: paragraphs = tf.ragged.constant([[['I', 'have', 'a', 'cat'], ['His', 'name',
    # 'is', 'Mat']], [['Do', 'you', 'want', 'to', 'come', 'visit'], ["I'm", 'free',
    # 'tomorrow']]]); the words as ids into a vocabulary.
    printed = [
        [["I", "have", "a", "cat"], ["His", "name", "is", "Mat"]],
        [["Do", "you", "want", "to", "come", "visit"], ["I'm", "free", "tomorrow"]],
    ]
    vocabulary = [w for paragraph in printed for sentence in paragraph for w in sentence]
    ids = torch.arange(len(vocabulary))
    paragraphs = NestedBatch.from_nested_row_lengths(ids, ([2, 2], [4, 4, 6, 3]))
    assert paragraphs.ragged_rank == 2 and paragraphs.max_shape == (2, 6)
    words = [[[vocabulary[i] for i in s] for s in p] for p in paragraphs.tolist()]
    assert words == printed


GUIDE_INDEXING_LIST = [[[1, 2, 3], [4]], [[5], [], [6]], [[7]], [[8, 9], [10]]]


def guide_indexing_batch():
    # Guide 5.2: rt = tf.ragged.constant([[[1, 2, 3], [4]], [[5], [], [6]], [[7]],
    # [[8, 9], [10]]]).
    return NestedBatch.from_nested_row_lengths(
        torch.arange(1, 11), ([2, 3, 1, 2], [3, 1, 1, 0, 1, 1, 2, 1])
    )


def test_guide_indexing_a_ragged_rank_2_batch():
    rt = guide_indexing_batch()
    assert rt.tolist() == GUIDE_INDEXING_LIST
    second = rt[1]  # "Second row (2-D RaggedTensor)": <tf.RaggedTensor [[5], [], [6]]>
    assert isinstance(second, NestedBatch) and second.ragged_rank == 1
    assert second.tolist() == [[5], [], [6]]
    # rt[3, 0]: tf.Tensor([8 9]) (here as rt[3][0]).
    assert torch.equal(rt[3][0], torch.tensor([8, 9]))
    # rt[:, 1:3]: <tf.RaggedTensor [[[4]], [[], [6]], [], [[10]]]>
    items = rt[:, 1:3]
    assert isinstance(items, NestedBatch) and items.ragged_rank == 2
    assert items.tolist() == [[[4]], [[], [6]], [], [[10]]]
    # rt[:, -1:]: <tf.RaggedTensor [[[4]], [[6]], [[7]], [[10]]]>
    assert rt[:, -1:].tolist() == [[[4]], [[6]], [[7]], [[10]]]
    # queries[1:] (guide 5.1, here on the rank-2 batch): every sample but the first.
    assert rt[1:].tolist() == GUIDE_INDEXING_LIST[1:]


def test_guide_broadcasting_a_ragged_rank_2_batch():
    # Guide 7.2: x (ragged_rank=2): 2 x (r1) x (r2) x 1, y = tf.constant([10, 20, 30]).
    x_printed = [[[[1], [2]], [], [[3]], [[4]]], [[[5], [6]], [[7]]]]
    x = NestedBatch.from_nested_row_lengths(
        torch.tensor([[1], [2], [3], [4], [5], [6], [7]]), ([4, 2], [2, 0, 1, 1, 2, 1])
    )
    assert x.ragged_rank == 2 and x.tolist() == x_printed and x.dim() == 4
    y = torch.tensor([10, 20, 30])
    out = x + y
    assert isinstance(out, NestedBatch) and out.ragged_rank == 2
    assert out.feature_shape == torch.Size([3])
    assert out.tolist() == [
        [[[11, 21, 31], [12, 22, 32]], [], [[13, 23, 33]], [[14, 24, 34]]],
        [[[15, 25, 35], [16, 26, 36]], [[17, 27, 37]]],
    ]


def test_guide_ragged_dims_that_do_not_match_do_not_broadcast():
    # Guide 7.2: ragged dims that do not match raise (here one level down, at rank 2).
    a = NestedBatch.from_nested_row_lengths(torch.arange(6), ([2, 1], [3, 1, 2]))
    b = NestedBatch.from_nested_row_lengths(torch.arange(6), ([2, 1], [2, 2, 2]))
    with pytest.raises(ValueError):
        _ = a + b
    c = NestedBatch.from_nested_row_lengths(torch.arange(6), ([1, 2], [3, 1, 2]))
    with pytest.raises(ValueError):
        _ = a + c


# ================================================================================ construction


def test_one_level_gives_an_ordinary_rank_1_batch():
    rt = NestedBatch.from_nested_row_splits(torch.tensor([3, 1, 4, 1, 5, 9, 2]), ([0, 4, 4, 6, 7],))
    assert type(rt) is NestedBatch and rt.ragged_rank == 1 and rt.num_ragged_dims == 1
    assert rt.tolist() == [[3, 1, 4, 1], [], [5, 9], [2]]  # guide 8
    same = NestedBatch.from_nested_row_lengths(torch.tensor([3, 1, 4, 1, 5, 9, 2]), ([4, 0, 2, 1],))
    assert type(same) is NestedBatch and same.tolist() == rt.tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_splits_and_lengths_agree_and_take_int_tensors(case):
    nested_lengths, feature = CASES[case]
    values = make_values(sum(nested_lengths[-1]), feature, torch.float32)
    rank = rank_of(nested_lengths)
    samples = build_reference(values, nested_lengths)
    splits = [splits_of(level) for level in nested_lengths]
    for batch in (
        NestedBatch.from_nested_row_lengths(values, nested_lengths),
        NestedBatch.from_nested_row_lengths(values, [torch.tensor(x, dtype=torch.int64)
                                                     for x in nested_lengths]),
        NestedBatch.from_nested_row_splits(values, splits),
        NestedBatch.from_nested_row_splits(values, [torch.tensor(s, dtype=torch.int32)
                                                    for s in splits]),
        NestedBatch.from_nested_row_splits(values, splits, validate=False),
        NestedBatch.from_nested_row_lengths(values, nested_lengths, validate=False),
    ):
        assert_matches(batch, samples, rank, feature, torch.float32)
        assert [s.tolist() for s in batch.nested_row_splits] == splits
        assert all(s.dtype == torch.int64 for s in batch.nested_row_splits)


RANK3_SPLITS = ([0, 2, 2, 3], [0, 1, 3, 3], [0, 2, 2, 5])  # lengths ([2, 0, 1], [1, 2, 0], ...)


@pytest.mark.parametrize(
    "splits",
    [
        pytest.param(([1, 1, 5], [0, 3, 3, 5, 9, 10]), id="outer-not-from-0"),
        pytest.param(([0, 2, 1, 5], [0, 3, 3, 5, 9, 10]), id="outer-decreasing"),
        pytest.param(([0, 1, 1, 4], [0, 3, 3, 5, 9, 10]), id="outer-last-not-next-rows"),
        pytest.param(([0, 1, 1, 6], [0, 3, 3, 5, 9, 10]), id="outer-last-past-next-rows"),
        pytest.param(([0, 1, 1, 5], [1, 3, 3, 5, 9, 10]), id="inner-not-from-0"),
        pytest.param(([0, 1, 1, 5], [0, 3, 2, 5, 9, 10]), id="inner-decreasing"),
        pytest.param(([0, 1, 1, 5], [0, 3, 3, 5, 9, 11]), id="inner-last-past-values"),
        pytest.param(([0, 1, 1, 5], [0, 3, 3, 5, 9, 9]), id="inner-last-short-of-values"),
        pytest.param(([], [0, 3, 3, 5, 9, 10]), id="outer-empty"),
    ],
)
def test_invalid_splits_raise_value_error(splits):
    with pytest.raises(ValueError):
        NestedBatch.from_nested_row_splits(GUIDE_VALUES, splits)


@pytest.mark.parametrize(
    "splits",
    [
        pytest.param(([0, 2, 2, 3], [0, 1, 3, 4], [0, 2, 2, 5]), id="middle-last-past-rows"),
        pytest.param(([0, 2, 2, 3], [0, 2, 1, 3], [0, 2, 2, 5]), id="middle-decreasing"),
        pytest.param(([0, 2, 2, 3], [1, 1, 3, 3], [0, 2, 2, 5]), id="middle-not-from-0"),
        pytest.param(([0, 2, 2, 3], [0, 1, 3, 3], [0, 2, 2, 6]), id="innermost-past-values"),
    ],
)
def test_invalid_splits_at_the_middle_level_of_rank_3(splits):
    values = torch.arange(5.0)
    assert NestedBatch.from_nested_row_splits(values, RANK3_SPLITS).ragged_rank == 3
    with pytest.raises(ValueError):
        NestedBatch.from_nested_row_splits(values, splits)


@pytest.mark.parametrize(
    "lengths",
    [
        pytest.param(([1, 0, 4], [3, 0, 2, 4, -1]), id="negative"),
        pytest.param(([1, 0, 3], [3, 0, 2, 4, 1]), id="outer-sum-short"),
        pytest.param(([1, 0, 4], [3, 0, 2, 4, 2]), id="inner-sum-past-values"),
        pytest.param(([1, 0, 4], [3, 0, 2, 4]), id="inner-too-few-rows"),
    ],
)
def test_invalid_lengths_raise_value_error(lengths):
    with pytest.raises(ValueError):
        NestedBatch.from_nested_row_lengths(GUIDE_VALUES, lengths)


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError):
        NestedBatch.from_nested_row_splits(GUIDE_VALUES, ([0.0, 1.0, 1.0, 5.0], GUIDE_SPLITS[1]))
    with pytest.raises(TypeError):
        NestedBatch.from_nested_row_splits(
            GUIDE_VALUES, (torch.tensor([0.0, 1.0, 1.0, 5.0]), GUIDE_SPLITS[1])
        )
    with pytest.raises(TypeError):
        NestedBatch.from_nested_row_lengths(GUIDE_VALUES, ([1, 0, 4], "30241"))


# ========================================================================== properties, layouts


@pytest.mark.parametrize("case", list(CASES))
def test_properties_match_the_reference(case):
    for dtype in DTYPES:
        with labelled(dtype):
            check_properties(case, dtype)


def check_properties(case, dtype):
    batch, samples, rank, feature = make_case(case, dtype)
    assert_matches(batch, samples, rank, feature, dtype)
    assert batch.ragged_rank == batch.num_ragged_dims == rank
    assert batch.dim() == 1 + rank + len(feature)
    assert batch.batch_size == len(batch) == len(samples)
    assert batch.dtype == dtype and batch.device == torch.device("cpu")
    assert batch.max_shape == max_shape_reference(samples, rank)
    assert all(isinstance(m, int) for m in batch.max_shape)
    lengths, _ = levels_of(samples, rank)
    assert [s.tolist() for s in batch.nested_row_splits] == [splits_of(x) for x in lengths]
    assert batch.tolist() == to_lists(samples)
    assert torch.equal(batch.packed().values, batch.flat_values)
    # TF's values: one level down, every level-1 row of every sample, in order.
    rows = [row for sample in samples for row in sample]
    assert_matches(batch.values, rows, rank - 1, feature, dtype)


@pytest.mark.parametrize("case", list(CASES))
def test_padded_pads_every_level_with_one_combined_mask(case):
    for dtype in DTYPES:
        with labelled(dtype):
            check_padded(case, dtype)


def check_padded(case, dtype):
    batch, samples, rank, feature = make_case(case, dtype)
    padding = True if dtype == torch.bool else -7
    data, mask = pad_reference(samples, rank, feature, dtype, padding)
    padded = batch.padded(padding)
    assert padded.data.dtype == dtype and padded.mask.dtype == torch.bool
    assert padded.data.shape == data.shape and padded.mask.shape == mask.shape
    assert torch.equal(padded.data, data)
    assert torch.equal(padded.mask, mask)
    assert torch.equal(batch.to_padded_tensor(padding), data)
    assert torch.equal(batch.to_tensor(padding), data)
    zeros, _ = pad_reference(samples, rank, feature, dtype, 0)
    assert torch.equal(batch.to_tensor(0), zeros)


def test_guide_to_tensor():
    rt = NestedBatch.from_nested_row_splits(GUIDE_VALUES, GUIDE_SPLITS)
    expected = torch.tensor([
        [[10, 11, 12, -1], [-1, -1, -1, -1], [-1, -1, -1, -1], [-1, -1, -1, -1]],
        [[-1, -1, -1, -1], [-1, -1, -1, -1], [-1, -1, -1, -1], [-1, -1, -1, -1]],
        [[-1, -1, -1, -1], [13, 14, -1, -1], [15, 16, 17, 18], [19, -1, -1, -1]],
    ])
    assert torch.equal(rt.to_tensor(-1), expected)
    assert torch.equal(rt.padded(-1).mask, expected != -1)


@pytest.mark.parametrize("case", list(CASES))
def test_unbind_iteration_and_indexing(case):
    batch, samples, rank, feature = make_case(case, torch.float64)
    parts, iterated = batch.unbind(), list(batch)
    assert len(parts) == len(iterated) == len(samples)
    for i, sample in enumerate(samples):
        for got in (parts[i], iterated[i], batch[i], batch[i - len(samples)]):
            assert_matches(got, sample, rank - 1, feature, torch.float64)
    with pytest.raises(IndexError):
        batch[len(samples)]
    with pytest.raises(IndexError):
        batch[-len(samples) - 1]


def test_a_sample_of_rank_2_is_a_batch_of_its_rows():
    rt = NestedBatch.from_nested_row_splits(GUIDE_VALUES, GUIDE_SPLITS)
    last = rt[2]
    assert type(last) is NestedBatch and last.ragged_rank == 1 and len(last) == 4
    assert last.lengths.tolist() == [0, 2, 4, 1]
    assert [t.tolist() for t in last.unbind()] == GUIDE_LIST[2]
    assert rt[1].tolist() == [] and len(rt[1]) == 0
    rank3 = NestedBatch.from_nested_row_lengths(torch.arange(5.0), ([2, 0, 1], [1, 2, 0],
                                                                    [2, 0, 3]))
    assert rank3[0].ragged_rank == 2 and rank3[0].tolist() == [[[0.0, 1.0]], [[], [2.0, 3.0, 4.0]]]
    assert rank3[2].tolist() == [[]]


@pytest.mark.parametrize("case", ["guide_f3", "rank3", "empty_batch"])
def test_to_clone_and_detach_keep_the_structure(case):
    batch, samples, rank, feature = make_case(case, torch.float32)
    doubled = batch.to(torch.float64)
    assert doubled.dtype == torch.float64
    assert_matches(doubled, map_leaves(samples, lambda t: t.double()), rank, feature,
                   torch.float64)
    copy = batch.clone()
    assert_matches(copy, samples, rank, feature, torch.float32)
    if batch.flat_values.numel():
        assert copy.flat_values.data_ptr() != batch.flat_values.data_ptr()
    nested_lengths, _ = CASES[case]
    values = batch.flat_values.clone().requires_grad_()
    tracked = NestedBatch.from_nested_row_lengths(values, nested_lengths)
    assert tracked.flat_values.requires_grad
    detached = tracked.detach()
    assert not detached.flat_values.requires_grad
    assert_matches(detached, samples, rank, feature, torch.float32)


# ============================================================= from batches: nested / collate


def _rank_down(case):
    """The samples of ``case`` as batches of ragged rank one less (rank 1 for rank 2), built
    from their own flat values and lengths; with the reference samples, rank and feature."""
    _, samples, rank, feature = make_case(case, torch.float32)
    parts = []
    for sample in samples:
        inner_lengths, elements = levels_of(sample, rank - 1)
        flat = torch.stack(elements) if elements else torch.empty((0, *feature))
        parts.append(NestedBatch.from_nested_row_lengths(flat, inner_lengths))
    return parts, samples, rank, feature


@pytest.mark.parametrize("case", ["guide", "guide_f3", "rank3", "rank3_f22", "one_sample",
                                  "empty_rows", "empty_samples"])
def test_nested_of_batches_adds_a_level(case):
    parts, samples, rank, feature = _rank_down(case)
    assert all(p.ragged_rank == rank - 1 for p in parts)
    assert_matches(nb.nested(parts), samples, rank, feature, torch.float32)


@pytest.mark.parametrize("case", ["guide", "rank3", "one_sample", "empty_samples"])
def test_nested_of_a_batchs_samples_gives_it_back(case):
    batch, samples, rank, feature = make_case(case, torch.float64)
    assert_matches(nb.nested(list(batch.unbind())), samples, rank, feature, torch.float64)


def test_nested_of_plain_tensors_is_still_rank_1():
    batch = nb.nested([torch.ones(2, 3), torch.ones(0, 3)])
    assert batch.ragged_rank == 1 and batch.lengths.tolist() == [2, 0]


def test_nested_refuses_batches_that_disagree():
    a = NestedBatch.from_lengths(torch.ones(3, 2), [2, 1])
    with pytest.raises((TypeError, ValueError)):
        nb.nested([a, NestedBatch.from_lengths(torch.ones(3, 4), [2, 1])])  # feature shapes
    with pytest.raises((TypeError, ValueError)):
        nb.nested([a, NestedBatch.from_lengths(torch.ones(3, 2, dtype=torch.int64), [2, 1])])
    rank2 = NestedBatch.from_nested_row_lengths(torch.ones(3, 2), ([1, 1], [2, 1]))
    with pytest.raises((TypeError, ValueError)):
        nb.nested([a, rank2])  # ragged ranks


@pytest.mark.parametrize("case", ["guide", "rank3", "empty_rows"])
def test_collate_batches_of_rank_r_minus_1(case):
    parts, samples, rank, feature = _rank_down(case)
    assert_matches(nb.collate(parts), samples, rank, feature, torch.float32)


def test_collate_in_a_dataloader_and_in_dicts():
    parts, samples, rank, feature = _rank_down("guide_f3")
    loader = torch.utils.data.DataLoader(parts, batch_size=2, collate_fn=nb.collate)
    batches = list(loader)
    assert len(batches) == 2
    assert_matches(batches[0], samples[:2], rank, feature, torch.float32)
    assert_matches(batches[1], samples[2:], rank, feature, torch.float32)
    as_dicts = nb.collate([{"document": p, "label": i} for i, p in enumerate(parts)])
    assert_matches(as_dicts["document"], samples, rank, feature, torch.float32)
    assert as_dicts["label"].tolist() == [0, 1, 2]


# ================================================================================ elementwise ops

UNARY = {
    "exp": lambda x: torch.exp(x),
    "neg": lambda x: -x,
    "abs": lambda x: x.abs(),
    "times_2": lambda x: x * 2,
    "plus_scalar": lambda x: x + 3,
}




@pytest.mark.parametrize("op", list(UNARY))
@pytest.mark.parametrize("case", list(CASES))
def test_unary_ops_map_the_flat_values(case, op):
    fn = UNARY[op]
    for dtype in NUMERIC:
        if op == "exp" and not dtype.is_floating_point:
            continue
        with labelled(dtype):
            batch, samples, rank, feature = make_case(case, dtype)
            expected = map_leaves(samples, fn)
            out_dtype = fn(torch.zeros(1, dtype=dtype)).dtype
            assert_matches(fn(batch), expected, rank, feature, out_dtype)


@pytest.mark.parametrize("case", list(CASES))
def test_binary_ops_with_a_batch_and_a_dense_tensor(case):
    for dtype in NUMERIC:
        with labelled(dtype):
            check_binary(case, dtype)


def check_binary(case, dtype):
    batch, samples, rank, feature = make_case(case, dtype, seed=0)
    nested_lengths, _ = CASES[case]
    other_values = make_values(sum(nested_lengths[-1]), feature, dtype, seed=1)
    other = NestedBatch.from_nested_row_lengths(other_values, nested_lengths)
    other_samples = build_reference(other_values, nested_lengths)
    for fn in (operator.add, operator.mul, operator.sub, torch.add, torch.maximum):
        with labelled(fn):
            expected = zip_leaves(samples, other_samples, fn)
            assert_matches(fn(batch, other), expected, rank, feature, dtype)
    dense = make_values(1, feature, dtype, seed=2)[0]  # the feature shape
    expected = map_leaves(samples, lambda t: t + dense)
    assert_matches(batch + dense, expected, rank, feature, dtype)
    assert_matches(dense + batch, expected, rank, feature, dtype)


def test_unary_on_bool():
    batch, samples, rank, feature = make_case("rank3", torch.bool)
    assert_matches(~batch, map_leaves(samples, lambda t: ~t), rank, feature, torch.bool)


# ================================================================================= reductions


def test_reductions_of_the_guides_batch_by_hand():
    # Rows of sample 2: [], [13, 14], [15, 16, 17, 18], [19].
    rt = NestedBatch.from_nested_row_splits(GUIDE_VALUES, GUIDE_SPLITS)
    inner = torch.sum(rt, dim=2)  # every innermost row reduced: rank 1, [B, (R1)]
    assert isinstance(inner, NestedBatch) and inner.ragged_rank == 1
    assert inner.tolist() == [[33], [], [0, 27, 66, 19]]
    # TF's reduce_sum(rt, axis=1): the rows of a sample added position by position.
    outer = torch.sum(rt, dim=1)
    assert isinstance(outer, NestedBatch) and outer.ragged_rank == 1
    assert outer.tolist() == [[10, 11, 12], [], [47, 30, 17, 18]]
    assert torch.amax(rt, dim=1).tolist() == [[10, 11, 12], [], [19, 16, 17, 18]]
    assert torch.amin(rt, dim=1).tolist() == [[10, 11, 12], [], [13, 14, 17, 18]]
    assert torch.prod(rt, dim=1).tolist() == [[10, 11, 12], [], [13 * 15 * 19, 14 * 16, 17, 18]]
    mean = torch.mean(rt.to(torch.float64), dim=1)  # divided by how many rows have the position
    torch.testing.assert_close(mean.flat_values,
                               torch.tensor([10, 11, 12, 47 / 3, 15, 17, 18], dtype=torch.float64))
    assert mean.nested_row_lengths()[0].tolist() == [3, 0, 4]
    everything = torch.sum(rt, dim=(1, 2))
    assert isinstance(everything, Tensor) and not isinstance(everything, NestedBatch)
    assert everything.tolist() == [33, 0, 112]
    empty_max = torch.amax(rt, dim=2)
    assert empty_max.tolist() == [[12], [], [torch.iinfo(torch.int64).min, 14, 18, 19]]


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_reduce_the_innermost_level(case, name):
    for dtype in dtypes_for(name):
        with labelled(dtype):
            batch, samples, rank, feature = make_case(case, dtype)
            proto = batch.flat_values[:0]
            expected = [reduce_level(s, rank, rank, name, proto) for s in samples]
            out = getattr(torch, name)(batch, dim=rank)
            assert_matches(out, expected, rank - 1, feature, result_dtype(name, dtype))


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_reduce_an_outer_level_as_tf(case, name):
    for dtype in dtypes_for(name):
        batch, samples, rank, feature = make_case(case, dtype)
        proto = batch.flat_values[:0]
        for level in range(1, rank):
            with labelled(dtype, f"dim={level}"):
                expected = [reduce_level(s, rank, level, name, proto) for s in samples]
                out = getattr(torch, name)(batch, dim=level)
                assert_matches(out, expected, rank - 1, feature, result_dtype(name, dtype))


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_reduce_every_ragged_dim_gives_a_dense_tensor(case, name):
    for dtype in dtypes_for(name):
        with labelled(dtype):
            batch, samples, rank, feature = make_case(case, dtype)
            proto = batch.flat_values[:0]
            parts = [reduce_rows(name, elements_of(s, rank, proto)) for s in samples]
            expected = stack_results(parts, name, proto)
            dims = tuple(range(1, rank + 1))
            # (torch.prod's argument parser takes one dim: the method takes several.)
            out = batch.prod(dims) if name == "prod" else getattr(torch, name)(batch, dim=dims)
            assert isinstance(out, Tensor) and not isinstance(out, NestedBatch)
            assert out.shape == (len(samples), *feature)
            torch.testing.assert_close(out, expected, equal_nan=True)


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][1]])
def test_reduce_a_feature_dim_keeps_the_structure(case, name):
    for dtype in dtypes_for(name):
        batch, samples, rank, feature = make_case(case, dtype)
        for dim in (rank + 1, -1):
            with labelled(dtype, f"dim={dim}"):
                at = 1 if dim > 0 else len(feature)  # the dim in every innermost row
                expected = map_leaves(samples, lambda t, at=at: getattr(torch, name)(t, dim=at))
                out = getattr(torch, name)(batch, dim=dim)
                kept = feature[:at - 1] + feature[at:]
                assert_matches(out, expected, rank, kept, result_dtype(name, dtype))


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduce_over_the_batch_dim_raises(name):
    batch, _, _, _ = make_case("rank3", torch.float32)
    with pytest.raises(ValueError):
        getattr(torch, name)(batch, dim=0)


# ================================================================================ selection, cat


SAMPLE_SLICES = [slice(1, None), slice(0, 0), slice(-2, None), slice(None, 100), slice(1, 2)]
ROW_SLICES = [slice(1, 3), slice(None, 2), slice(-1, None), slice(2, 100), slice(3, 1),
              slice(None, -1)]


@pytest.mark.parametrize("case", list(CASES))
def test_slicing_samples_and_selecting_them(case):
    batch, samples, rank, feature = make_case(case, torch.float32)
    for s in SAMPLE_SLICES:
        assert_matches(batch[s], samples[s], rank, feature, torch.float32)
    if len(samples) >= 3:
        for index in ([0, 2], [2, 0], [1, 1]):
            expected = [samples[i] for i in index]
            assert_matches(batch[index], expected, rank, feature, torch.float32)


@pytest.mark.parametrize("case", list(CASES))
def test_slicing_every_samples_outermost_rows(case):
    batch, samples, rank, feature = make_case(case, torch.float32)
    for s in ROW_SLICES:
        expected = [sample[s] for sample in samples]  # clipped as Python slices are
        assert_matches(batch[:, s], expected, rank, feature, torch.float32)


@pytest.mark.parametrize(
    ("first", "second"),
    [("guide", "guide"), ("guide", "empty_samples"), ("guide_f3", "empty_batch"),
     ("rank3", "rank3"), ("one_sample_rank3", "empty_batch_rank3"),
     ("empty_batch", "empty_batch")],
)
def test_cat_along_the_batch(first, second):
    a, a_samples, rank, feature = make_case(first, torch.float32, seed=0)
    b, b_samples, _, feature_b = make_case(second, torch.float32, seed=1)
    assert feature_b == feature, "test pairs must share a feature shape"
    out = torch.cat([a, b], dim=0)
    assert_matches(out, a_samples + b_samples, rank, feature, torch.float32)


# ===================================================================================== autograd

GRAD_LENGTHS = {
    2: ([2, 0, 2], [3, 0, 1, 2]),
    3: ([2, 1], [1, 2, 1], [2, 0, 3, 1]),
}


@pytest.mark.parametrize("rank", [2, 3])
def test_gradcheck_through_padding(rank):
    lengths = GRAD_LENGTHS[rank]
    values = torch.randn(sum(lengths[-1]), 2, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda v: NestedBatch.from_nested_row_lengths(v, lengths).to_padded_tensor(0.0), (values,)
    )


@pytest.mark.parametrize("rank", [2, 3])
def test_gradcheck_through_innermost_and_outer_sums(rank):
    lengths = GRAD_LENGTHS[rank]
    values = torch.randn(sum(lengths[-1]), 2, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda v: torch.sum(NestedBatch.from_nested_row_lengths(v, lengths), dim=rank).flat_values,
        (values,),
    )
    torch.autograd.gradcheck(
        lambda v: torch.sum(NestedBatch.from_nested_row_lengths(v, lengths), dim=1).flat_values,
        (values,),
    )


# ============================================================================= unsupported ops


def test_unsupported_ops_refuse_by_name():
    q = NestedBatch.from_nested_row_lengths(torch.randn(6, 4), ([2, 1], [3, 1, 2]))
    with pytest.raises((TypeError, ValueError), match="scaled_dot_product_attention"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
    gru = torch.nn.GRU(4, 3, batch_first=True)
    with pytest.raises((TypeError, ValueError), match="(?i)gru"):
        gru(q)


# =================================================================================== hypothesis


@st.composite
def nested_cases(draw):
    rank = draw(st.integers(2, 3))
    count = draw(st.integers(0, 4))
    nested_lengths = []
    for _ in range(rank):
        level = draw(st.lists(st.integers(0, 3), min_size=count, max_size=count))
        nested_lengths.append(level)
        count = sum(level)
    feature = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**16))
    return nested_lengths, feature, dtype, seed


@given(nested_cases())
def test_round_trip_against_a_recursive_reference(case):
    nested_lengths, feature, dtype, seed = case
    rank = rank_of(nested_lengths)
    values = make_values(sum(nested_lengths[-1]), feature, dtype, seed)
    samples = build_reference(values, nested_lengths)
    batch = NestedBatch.from_nested_row_lengths(values, nested_lengths)
    assert_matches(batch, samples, rank, feature, dtype)
    assert batch.tolist() == to_lists(samples)
    padding = False if dtype == torch.bool else 5
    data, mask = pad_reference(samples, rank, feature, dtype, padding)
    assert torch.equal(batch.to_padded_tensor(padding), data)
    assert torch.equal(batch.padded(padding).mask, mask)
    parts = batch.unbind()
    assert len(parts) == len(samples)
    for part, sample in zip(parts, samples):
        assert_matches(part, sample, rank - 1, feature, dtype)
    splits = [splits_of(level) for level in nested_lengths]
    again = NestedBatch.from_nested_row_splits(values, splits)
    assert again.tolist() == batch.tolist()
