"""Row partitions in TensorFlow's other encodings (row starts, row limits, trailing padding).

``tf.RaggedTensor`` can be built from ``row_splits`` (our ``offsets``), ``row_lengths``
(``lengths``), ``value_rowids`` (``row_ids``), ``row_starts``, ``row_limits`` or a padded tensor;
the functions here turn the last three into offsets / lengths for the ``NestedBatch`` constructors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from nestbatch.checks import as_index_tensor, check_tensor, host_ints


def offsets_from_row_starts(
    row_starts: Tensor | Sequence[int], num_values: int
) -> Tensor | list[int]:
    """Offsets ``(B + 1,)`` from the start of every row ``(B,)`` (TF ``row_starts``).

    ``row_starts`` is ``offsets[:-1]``; the last offset is the number of values. Host starts
    give host offsets (a list: checked on the host, no device involved), a tensor a tensor.
    """
    if not isinstance(row_starts, Tensor):
        return [*host_ints(row_starts, "row_starts"), num_values]
    starts = as_index_tensor(row_starts, "row_starts", row_starts.device)
    return torch.cat([starts, starts.new_tensor([num_values])])


def offsets_from_row_limits(row_limits: Tensor | Sequence[int]) -> Tensor | list[int]:
    """Offsets ``(B + 1,)`` from the end of every row ``(B,)`` (TF ``row_limits``).

    ``row_limits`` is ``offsets[1:]``; the first offset is 0. Host limits give host offsets.
    """
    if not isinstance(row_limits, Tensor):
        return [0, *host_ints(row_limits, "row_limits")]
    limits = as_index_tensor(row_limits, "row_limits", row_limits.device)
    return torch.cat([limits.new_zeros(1), limits])


def lengths_without_trailing_padding(data: Tensor, padding: float) -> Tensor:
    """Lengths ``(B,)`` of the rows of ``data (B, N, *feature)`` once trailing padding is cut.

    A slot is padding when all its feature entries equal ``padding``; only padding at the end of
    a row is cut (TF ``RaggedTensor.from_tensor(x, padding=...)``). No sync: the lengths stay on
    the data's device.
    """
    check_tensor(data, "data")
    if data.dim() < 2:
        raise ValueError(f"data must have shape (B, N, *feature), got {tuple(data.shape)}")
    is_pad = (data == padding).reshape(*data.shape[:2], -1).all(-1)
    trailing = is_pad.flip(1).to(torch.int64).cumprod(1).sum(1)
    return data.shape[1] - trailing
