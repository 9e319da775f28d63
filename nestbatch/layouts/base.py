"""`RaggedLayout`: what every layout of a ragged batch exposes."""

from __future__ import annotations

import enum

import torch
from torch import Tensor

from nestbatch.kernels.torch_versions import DYNAMO_HASHES_IDENTITY_ENUMS
from nestbatch.layouts.partition import RowPartition


class Layout(enum.Enum):
    """The storage layouts of a ragged batch."""

    # Members are singletons compared by identity: hash them by identity too (in C), not by
    # name in Python as Enum does; layouts are dict keys on every dispatch.
    if DYNAMO_HASHES_IDENTITY_ENUMS:
        __hash__ = object.__hash__

    LIST = "list"
    PACKED = "packed"
    PADDED = "padded"


class RaggedLayout:
    """Common surface of :class:`Packed`, :class:`Padded` and :class:`TensorList`.

    A layout is immutable: its tensors and its :class:`RowPartition` are fixed at construction,
    and derived metadata comes from the shared partition, computed once.

    A plain base class, not an ``abc.ABC``: ``isinstance`` against an ABC costs a Python-level
    ``__instancecheck__`` (about 0.5 us), and the hot paths ask it several times a call.
    """

    partition: RowPartition

    @property
    def batch_size(self) -> int:
        """Number of samples ``B``."""
        return self.partition.batch_size

    def __len__(self) -> int:
        return self.partition.batch_size

    @property
    def num_ragged_dims(self) -> int:
        """Number of ragged dims ``k`` of every sample."""
        return self.partition.num_ragged_dims

    @property
    def shape_per_sample(self) -> Tensor:
        """``(B, k)`` int64: the ragged shape of every sample."""
        return self.partition.shape_per_sample

    @property
    def lengths(self) -> Tensor:
        """``(B,)`` int64: elements of every sample along its (flattened) ragged dims."""
        return self.partition.lengths

    @property
    def offsets(self) -> Tensor:
        """``(B + 1,)`` int64: start of every sample in the packed rows, then the total."""
        return self.partition.offsets

    # Defined by every layout (declared here, not stubbed: a plain base class has no abstract
    # methods to enforce them).
    #: Shape of the regular dims after the ragged ones.
    feature_shape: torch.Size
    #: Element dtype.
    dtype: torch.dtype
    #: Whether a stored tensor is the output of an op autograd recorded (has a ``grad_fn``): such
    #: a layout is not cached on its batch (see :meth:`nestbatch.NestedBatch.packed`).
    recorded_by_autograd: bool

    @property
    def device(self) -> torch.device:
        """Device of the data."""
        return self.partition.device

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_size={self.batch_size}, num_ragged_dims="
            f"{self.num_ragged_dims}, feature_shape={tuple(self.feature_shape)}, "
            f"dtype={self.dtype}, device={self.device})"
        )
