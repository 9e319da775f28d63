"""Hypothesis strategies and plain-loop references shared by the tests."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from torch import Tensor

ALL_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def make_tensor(shape: Sequence[int], dtype: torch.dtype, generator: torch.Generator) -> Tensor:
    """Random tensor of any dtype (values exact in every dtype)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=generator).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randint(-50, 50, tuple(shape), generator=generator).to(dtype) / 4
    low = 0 if dtype == torch.uint8 else -100
    return torch.randint(low, 100, tuple(shape), generator=generator).to(dtype)


@st.composite
def ragged_samples(
    draw: st.DrawFn,
    *,
    num_ragged_dims: int | None = None,
    feature_dims: int | None = None,
    dtypes: Sequence[torch.dtype] = ALL_DTYPES,
    min_batch: int = 0,
    max_batch: int = 5,
    max_len: int = 5,
    noncontiguous: bool | None = None,
) -> tuple[list[Tensor], int]:
    """A list of samples ``(*ragged_i, *feature)`` and its number of ragged dims ``k``.

    Covers the empty batch, zero-length samples, one sample, k in {1, 2}, 0-2 feature dims,
    every dtype, and non-contiguous samples.
    """
    k = draw(st.integers(1, 2)) if num_ragged_dims is None else num_ragged_dims
    nf = draw(st.integers(0, 2)) if feature_dims is None else feature_dims
    feature = tuple(draw(st.lists(st.integers(1, 3), min_size=nf, max_size=nf)))
    batch = draw(st.integers(min_batch, max_batch))
    shapes = [
        tuple(draw(st.lists(st.integers(0, max_len), min_size=k, max_size=k)))
        for _ in range(batch)
    ]
    dtype = draw(st.sampled_from(list(dtypes)))
    strided = draw(st.booleans()) if noncontiguous is None else noncontiguous
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    samples = []
    for shape in shapes:
        if strided:
            # Every other row along the first ragged dim: a non-contiguous view.
            big = make_tensor((2 * shape[0], *shape[1:], *feature), dtype, generator)
            samples.append(big[::2])
        else:
            samples.append(make_tensor((*shape, *feature), dtype, generator))
    return samples, k


def reference_padded(
    samples: Sequence[Tensor],
    k: int,
    padding_value: float = 0.0,
    max_shape: Sequence[int] | None = None,
    feature_shape: Sequence[int] = (),
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Pad with a plain per-sample loop (the independent reference)."""
    if samples:
        feature_shape, dtype = samples[0].shape[k:], samples[0].dtype
    if max_shape is None:
        max_shape = [max((s.shape[d] for s in samples), default=0) for d in range(k)]
    out = torch.full((len(samples), *max_shape, *feature_shape), padding_value, dtype=dtype)
    for i, sample in enumerate(samples):
        out[(i, *(slice(0, n) for n in sample.shape[:k]))] = sample
    return out


def reference_packed(samples: Sequence[Tensor], k: int) -> Tensor:
    """Concatenate the flattened ragged dims with a plain loop."""
    rows = [s.reshape(-1, *s.shape[k:]) for s in samples]
    return torch.cat(rows) if rows else torch.empty(0)


def assert_same_samples(actual: Sequence[Tensor], expected: Sequence[Tensor]) -> None:
    """Exact equality of two lists of samples (shape, dtype and values)."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and a.dtype == e.dtype
        assert torch.equal(a, e)


def value_pool(dtype: torch.dtype, mode: str) -> list | None:
    """Values to draw every element from: few (``"ties"``), the dtype's special values
    (``"special"``), or none in particular (``None``: ``"plain"``, and bools)."""
    if mode == "plain" or dtype == torch.bool:
        return None
    if mode == "ties":
        return [0, 1, 2]
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return [math.nan, math.inf, -math.inf, -0.0, 0.0, 1.0, info.min, info.max]
    info = torch.iinfo(dtype)
    return [info.min, info.max, 0, -1, 1]


def build_batch(samples: list[Tensor], k: int, how: str, *, declare_filler: bool = False):
    """The batch of ``samples`` (``k`` ragged dims) stored as ``how`` says: ``"packed"``,
    ``"padded"`` (7, or True, in the padding: declared as its filler with
    ``declare_filler``, else junk), ``"strided"`` (packed rows that are a strided view) or
    anything else (sizes held in tensors only)."""
    import nestbatch  # (the package under test, imported where it is used)
    from nestbatch import Layout, NestedBatch

    if not samples:
        return NestedBatch.from_list(samples, k)
    shapes = torch.tensor([s.shape[:k] for s in samples])
    if how == "packed":
        return nestbatch.nested(samples, layout=Layout.PACKED, num_ragged_dims=k)
    if how == "padded":
        filler = True if samples[0].dtype == torch.bool else 7
        return NestedBatch.from_padded(reference_padded(samples, k, filler),
                                       shape_per_sample=shapes,
                                       padding_value=filler if declare_filler else None)
    values = torch.cat([s.reshape(-1, *s.shape[k:]) for s in samples])
    if how == "strided":
        values = torch.stack([values, values], -1)[..., 0]
    return NestedBatch.from_shapes(values, shapes)


def bits(t: Tensor) -> Tensor:
    """``t`` as integers of its width: equal bits, -0.0 included; every NaN one NaN (kernels
    set a NaN's sign and payload bits each their own way)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_floating_point():
        t = torch.where(t.isnan(), torch.full_like(t, math.nan), t)
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def same_values(a: Tensor, b: Tensor) -> bool:
    """Equal values (NaN equal to NaN; 0.0 equal to -0.0), dtypes and shapes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))
    return torch.equal(a, b)
