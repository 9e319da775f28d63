"""A batch's logical shape: :class:`NestedSize`, with a :class:`RaggedSize` at every ragged dim.

torch.nested answers ``nt.shape`` with a ``torch.Size`` holding a *nested int* (``j1``) at the
ragged dim: a symbolic size that compares equal only to the same ragged structure. Code written
for it reads ``b.shape[0]``, ``b.shape[-1:]``, ``b.size(-1)`` and passes ``b.size()[:2]`` back to
``view`` / ``reshape``. nestbatch answers the same way: the regular dims are ints, every ragged
dim is a :class:`RaggedSize`, which a reshape of the same batch takes where the ragged dim is
and which refuses to become an int (a size that differs per sample has no single value).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nestbatch.errors import NestedTypeError
from nestbatch.layouts.partition import RowPartition


class RaggedSize:
    """The size of one ragged dim of a batch: it differs per sample (torch.nested's ``j1``).

    Equal to the ragged size of the same dim of any batch with the same partition (the batch
    itself, the result of an elementwise op on it, ...), and of a batch whose sizes along that
    dim the host knows and finds equal (no sync); unequal to every int. Not an int: ``int()``,
    ``range()``, arithmetic, ordering and torch's size arguments refuse it (a
    :class:`~nestbatch.errors.NestedTypeError`: a ``TypeError``, also a ``RuntimeError``).

    Parameters
    ----------
    partition : RowPartition
        The batch's partition.
    index : int
        Which of its ragged dims, ``0 <= index < num_ragged_dims``.
    """

    __slots__ = ("_rows", "_index")

    def __init__(self, partition: RowPartition, index: int) -> None:
        self._rows = partition
        self._index = index

    @property
    def index(self) -> int:
        """Which ragged dim of the batch this is (0: the first)."""
        return self._index

    @property
    def sizes(self) -> Tensor:
        """``(B,)`` int64: every sample's size along this dim."""
        return self._rows.shape_per_sample[:, self._index]

    def _host_sizes(self) -> tuple[int, ...] | None:
        partition = self._rows
        if partition.ragged_rank > 1 or not partition.knows_host_shapes:
            return None
        return tuple(shape[self._index] for shape in partition.host_shapes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RaggedSize):
            return False  # as torch's nested ints: never equal to an int
        if self._index != other._index:
            return False
        if self._rows is other._rows:
            return True
        mine = self._host_sizes()
        return mine is not None and mine == other._host_sizes()

    def __hash__(self) -> int:
        return hash((self._index, self._rows.batch_size))

    def _no_single_size(self, *_: object) -> NestedTypeError:
        return NestedTypeError(
            f"{self!r} is the size of a ragged dim, which differs per sample and has no single "
            "int value; read its per-sample .sizes, or the batch's .lengths / .shape_per_sample "
            "(an nn.RNN / LSTM / GRU with batch_first=False reads its batch size as size(1): "
            "build it with batch_first=True, or call nestbatch.accept_nested_batches(module) "
            "once)"
        )

    def __index__(self) -> int:
        raise self._no_single_size()

    def __int__(self) -> int:
        raise self._no_single_size()

    def _refuse(self, *_: object) -> Any:
        raise self._no_single_size()

    # Arithmetic with a size that differs per sample has no single answer (torch.nested's
    # nested ints compute symbolically; nestbatch refuses, as a TypeError and a RuntimeError).
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _refuse
    __lt__ = __le__ = __gt__ = __ge__ = _refuse

    def __repr__(self) -> str:
        return f"j{self._index + 1}"


class NestedSize(tuple):
    """A batch's logical shape, as ``torch.Size``: ints, and a :class:`RaggedSize` at every
    ragged dim (``NestedSize([2, j1, 4])``). A slice that holds only ints is a ``torch.Size``
    (``b.shape[-1:]`` is what ``F.layer_norm`` takes)."""

    __slots__ = ()

    def __getitem__(self, index):  # type: ignore[override]
        item = tuple.__getitem__(self, index)
        if not isinstance(index, slice):
            return item
        if any(isinstance(size, RaggedSize) for size in item):
            return NestedSize(item)
        return torch.Size(item)

    def __repr__(self) -> str:
        return f"NestedSize([{', '.join(map(repr, self))}])"
