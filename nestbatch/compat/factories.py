"""`nested` and `as_nested`: the two ways to make a :class:`~nestbatch.NestedBatch`.

As ``torch.tensor`` / ``torch.as_tensor``: :func:`nested` copies into a new leaf batch,
:func:`as_nested` keeps the given storage and autograd history where it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.checks import check_tensor_sequence
from nestbatch.compat.torch_formats import from_nested_tensor, from_packed_sequence
from nestbatch.errors import torch_compatible
from nestbatch.layouts import Layout, Packed, RowPartition, TensorList
from nestbatch.ops.structure import cat_samples


@torch_compatible
def nested(
    tensors: Sequence[Tensor | Sequence],
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    requires_grad: bool = False,
    pin_memory: bool = False,
    layout: Layout | torch.layout = Layout.PACKED,
    num_ragged_dims: int = 1,
) -> NestedBatch:
    """A new batch holding a copy of ``tensors`` (like ``torch.nested.nested_tensor``).

    Parameters
    ----------
    tensors : sequence of Tensor or of nested Python sequences
        Samples of shapes ``(*ragged_shape_i, *feature_shape)`` with the same number of dims.
        A sample given as Python data (``[[1., 2.], [3.]]``: two samples) is read by
        ``torch.as_tensor`` (in ``dtype`` when given), as torch.nested reads it.
        A sample with no element is a zero-size sample whatever its shape or dtype
        (``torch.tensor([[]])`` beside ``(n, 4)`` samples is a ``(0, 4)`` sample).
    dtype, device : optional
        Convert every sample; required if the samples' dtypes or devices differ.
    requires_grad : bool, default False
        Make the copy a leaf that requires gradients.
    pin_memory : bool, default False
        Put the copy in pinned host memory (for a CPU batch copied to a GPU later).
    layout : Layout or torch.jagged, default Layout.PACKED
        Layout to store the copy in (packed: one contiguous buffer). ``torch.jagged``, the
        argument torch.nested code passes, is the packed layout.
    num_ragged_dims : int, default 1
        How many leading dims of every sample are ragged. With one, the ragged dim is the one
        dim whose sizes differ among the samples, as torch.nested finds it (samples
        ``(3, L_i, 5)`` make a batch ``(B, 3, j1, 5)``, :attr:`~NestedBatch.ragged_dim` 2;
        stored with the ragged dim first); the first when all agree.

    Returns
    -------
    NestedBatch
        Detached from the inputs' autograd history. Samples that are batches of ragged rank
        ``r`` (the same feature shape and dtype) give a batch of ragged rank ``r + 1``: sample
        ``i`` is the batch ``tensors[i]``, its samples the rows of the new outermost level.
    """
    if isinstance(tensors, (list, tuple)) and tensors \
            and all(isinstance(t, NestedBatch) for t in tensors):
        batch = nest(list(tensors)).to(dtype=dtype or tensors[0].dtype,
                                        device=device or tensors[0].device).detach().clone()
        return batch.requires_grad_() if requires_grad else batch
    layout = layout_arg(layout)
    check_tensor_sequence(tensors, items=False)
    detached = [_sample(item, i, dtype) for i, item in enumerate(tensors)]
    ragged = _ragged_dim_of(detached) if num_ragged_dims == 1 else 0
    if ragged:  # stored ragged dim first, presented where the samples have it
        detached = [t.movedim(ragged, 0) for t in detached]
    samples = TensorList(detached, num_ragged_dims, dtype=dtype, device=device)
    batch = NestedBatch(samples, ragged + 1).to(layout)
    if layout is Layout.LIST:
        batch = batch.clone()
    if pin_memory:
        batch = batch.pin_memory()
    if requires_grad:
        batch.requires_grad_()
    return batch


def _ragged_dim_of(samples: list[Tensor]) -> int:
    """The one dim of the samples whose sizes differ when it is not their first (samples
    ``(3, L_i, 5)``: 1), as torch.nested finds its ragged dim; else 0 (the first)."""
    shapes = {tuple(t.shape) for t in samples if t.numel()}
    if len(shapes) < 2 or len({len(shape) for shape in shapes}) > 1:
        return 0
    differ = [d for d, sizes in enumerate(zip(*shapes)) if len(set(sizes)) > 1]
    return differ[0] if len(differ) == 1 else 0


def _sample(item: Any, index: int, dtype: torch.dtype | None) -> Tensor:
    if isinstance(item, Tensor):
        return item.detach()
    try:
        return torch.as_tensor(item, dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"tensors[{index}] must be a tensor or (nested lists of) numbers, got "
            f"{type(item).__name__}: {error}"
        ) from None


def layout_arg(layout: Any) -> Layout:
    """A ``layout=`` argument as a :class:`Layout` (``torch.jagged``: packed)."""
    if isinstance(layout, Layout):
        return layout
    if layout is torch.jagged:
        return Layout.PACKED  # torch.nested's jagged layout: values and offsets
    raise ValueError(
        f"layout must be a nestbatch Layout or torch.jagged, got {layout} (torch.nested's "
        "strided layout is padded storage here: Layout.PADDED)"
    )


def nest(batches: list[NestedBatch]) -> NestedBatch:
    """The batch of ragged rank ``r + 1`` whose sample ``i`` is ``batches[i]`` (each of ragged
    rank ``r``, one feature shape and dtype; shares nothing: their rows are joined).

    Raises
    ------
    ValueError
        For batches of other ragged ranks, feature shapes or dtypes, or a moved ragged dim.
    """
    first = batches[0]
    for i, b in enumerate(batches):
        if (b.partition.ragged_rank, b.num_ragged_dims, b.feature_shape, b.dtype, b.ragged_dim) \
                != (first.partition.ragged_rank, first.partition.ragged_rank,
                    first.feature_shape, first.dtype, 1):
            raise ValueError(
                f"tensors[{i}]: batches nest when they all have one ragged rank (rectangular "
                "samples ragged in several dims do not), one feature shape and one dtype, with "
                f"the ragged dim at dim 1; got ragged rank {b.partition.ragged_rank}, feature "
                f"shape {tuple(b.feature_shape)} and {b.dtype} beside "
                f"{first.partition.ragged_rank}, {tuple(first.feature_shape)} and {first.dtype}"
            )
    rows = cat_samples(batches)
    outer = RowPartition.from_host_lengths([b.batch_size for b in batches], rows.device)
    partition = RowPartition.nested([outer, *rows.partition.levels])
    return NestedBatch(Packed(rows.packed().values, partition=partition))


@torch_compatible
def as_nested(
    data: Any,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    num_ragged_dims: int = 1,
) -> NestedBatch:
    """View ``data`` as a batch, keeping its storage and autograd history where possible.

    Parameters
    ----------
    data : NestedBatch, list of Tensor, Tensor, PackedSequence, nested tensor, RaggedBatch, layout
        What to wrap. A list is kept as a list (no copy); a tensor ``(B, L, *feature)`` is ``B``
        samples of length ``L`` (a view when it is contiguous), as torch.nested wraps it.
    dtype, device : optional
        Convert to these.
    num_ragged_dims : int, default 1
        Ragged dims of a list's samples.
    """
    batch = _wrap(data, num_ragged_dims, dtype, device)
    if dtype is not None or device is not None:
        batch = batch.to(device=device or batch.device, dtype=dtype or batch.dtype)
    return batch


def _wrap(data: Any, num_ragged_dims: int, dtype: Any, device: Any) -> NestedBatch:
    if isinstance(data, NestedBatch):
        return data
    if isinstance(data, (Packed, TensorList)) or type(data).__name__ == "Padded":
        return NestedBatch(data)
    if isinstance(data, torch.nn.utils.rnn.PackedSequence):
        return from_packed_sequence(data)
    if isinstance(data, Tensor) and data.is_nested:
        return from_nested_tensor(data)
    if isinstance(data, Tensor):
        # As torch.nested.as_nested_tensor: the rows along dim 0 are samples of one length.
        if data.dim() < 2:
            raise ValueError(
                "Expected tensor argument to have dim at least 2 (as_nested of a tensor: samples "
                f"along dim 0, their ragged dim 1), got shape {tuple(data.shape)}"
            )
        return NestedBatch.from_lengths(data.flatten(0, 1), [data.shape[1]] * data.shape[0])
    if type(data).__name__ == "RaggedBatch":
        return NestedBatch.from_ragged_batch(data)
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes, Tensor)):
        return NestedBatch.from_list(
            list(check_tensor_sequence(data)), num_ragged_dims, dtype=dtype, device=device
        )
    raise TypeError(
        "as_nested takes a NestedBatch, a list of tensors, a tensor, a PackedSequence, a nested "
        f"tensor, a RaggedBatch or a layout object, got {type(data).__name__}"
    )
