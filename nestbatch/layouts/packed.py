"""`Packed`: the rows of all samples concatenated, plus offsets (TF ``values`` + ``row_splits``)."""

from __future__ import annotations

import torch
from torch import Tensor

from nestbatch.checks import (
    as_offsets,
    check_integer_tensor,
    check_non_negative,
    check_offsets_on_device,
    check_one_of,
    check_values,
)
from nestbatch.layouts.base import RaggedLayout
from nestbatch.layouts.partition import RowPartition


class Packed(RaggedLayout):
    """A ragged batch stored as one ``values`` tensor and row offsets.

    Parameters
    ----------
    values : Tensor
        ``(total, *feature)``: the samples' ragged dims flattened (row-major) and concatenated.
    offsets : Tensor, optional
        ``(B + 1,)`` integer: sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``. Give this or
        ``shape_per_sample`` (or a ``partition``).
    shape_per_sample : Tensor, optional
        ``(B, k)`` integer: the ragged shape of every sample, for ``k >= 1`` ragged dims (images of
        different height and width have ``k = 2``).
    partition : RowPartition, optional
        An existing partition to share (no checks are run on it).
    validate : bool, default True
        Check offsets / shapes against ``values``. This reads device values (a synchronization);
        pass False for trusted input on a hot path.

    Raises
    ------
    TypeError
        If ``offsets`` is not an integer tensor.
    ValueError
        If offsets do not start at 0, decrease, or do not end at ``len(values)``; if shapes are
        negative or do not add up to ``len(values)``.
    """

    def __init__(
        self,
        values: Tensor,
        offsets: Tensor | None = None,
        *,
        shape_per_sample: Tensor | None = None,
        partition: RowPartition | None = None,
        validate: bool = True,
    ) -> None:
        check_values(values)
        check_one_of(offsets=offsets, shape_per_sample=shape_per_sample, partition=partition)
        if offsets is not None:
            partition = _partition_from_offsets(offsets, values, validate)
        elif shape_per_sample is not None:
            partition = _partition_from_shapes(shape_per_sample, values, validate)
        self.values = values
        self.partition = partition.to(values.device)
        self.partition.note_total(values.shape[0])

    @classmethod
    def trusted(cls, values: Tensor, partition: RowPartition) -> Packed:
        """A layout over ``values`` that ``partition`` (on their device) is known to describe.

        No checks: for nestbatch's conversions and ops, which build both from a valid batch.
        """
        packed = cls.__new__(cls)
        packed.values = values
        packed.partition = partition
        return packed

    @property
    def feature_shape(self) -> torch.Size:
        """Shape of the regular dims after the ragged ones."""
        return self.values.shape[1:]

    @property
    def dtype(self) -> torch.dtype:
        """Element dtype."""
        return self.values.dtype

    @property
    def recorded_by_autograd(self) -> bool:
        """Whether a stored tensor has a ``grad_fn`` (see :class:`RaggedLayout`)."""
        return self.values.grad_fn is not None

    @property
    def row_ids(self) -> Tensor:
        """``(total,)`` int64: the sample of every row of ``values``."""
        return self.partition.row_ids


def _partition_from_offsets(offsets: Tensor, values: Tensor, validate: bool) -> RowPartition:
    host = offsets.is_cpu and not values.is_cpu  # sizes on the host, data on a device
    offsets = as_offsets(offsets, offsets.device if host else values.device)
    if validate:
        check_offsets_on_device(offsets, values.shape[0])  # (host work for host offsets)
    if host:
        return RowPartition.from_host_lengths_tensor(offsets.diff(), values.device)
    return RowPartition.from_offsets(offsets)


def _partition_from_shapes(shapes: Tensor, values: Tensor, validate: bool) -> RowPartition:
    check_integer_tensor(shapes, "shape_per_sample", 2, "(B, k)")
    host = shapes.is_cpu and not values.is_cpu  # sizes on the host, data on a device
    shapes = shapes.to(device=shapes.device if host else values.device, dtype=torch.int64)
    if validate:  # one read (host work for host shapes)
        check_non_negative(shapes, "shape_per_sample", total=values.shape[0])
    if host:
        return RowPartition.from_host_shape_tensor(shapes, values.device)
    return RowPartition.from_shapes(shapes)
