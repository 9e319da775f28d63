"""Hypothesis strategies and plain-loop references shared by the tests."""

from __future__ import annotations

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
