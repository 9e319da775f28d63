"""The time-major row order of packed sequences (``torch.nn.utils.rnn.PackedSequence``'s).

A ``PackedSequence`` stores its rows time-major: all samples' step 0 (longest sample first),
then all step-1 rows, and so on. The order is a function of the lengths alone, which a
``PackedSequence`` keeps on the host (``batch_sizes`` is a CPU tensor): :class:`TimeMajorOrder`
computes it there, and the device sees one host-to-device copy of every index it needs at once.
The RNN kernels on a batch (:mod:`nestbatch.ops.interop`) and the ``PackedSequence`` conversions
(:mod:`nestbatch.compat.torch_formats`) run on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence


class TimeMajorOrder:
    """The row order of a ``PackedSequence`` of samples of the given (host) lengths.

    Parameters
    ----------
    lengths : sequence of int
        ``B >= 1`` sample lengths, every one ``>= 1``.
    device : torch.device
        Where the indices go (in one host-to-device copy).
    extra : sequence of Tensor
        Further 1-d int64 host indices a caller wants on the device in the same copy
        (:attr:`extra` holds them there, in order).

    Attributes
    ----------
    batch_sizes : Tensor
        ``(max_len,)`` int64 on the CPU: samples still running at every step.
    sorted_indices, unsorted_indices : Tensor
        ``(B,)`` int64 on ``device``: longest first (stable, as ``pack_sequence``), and back.
    rows : Tensor
        ``(total,)`` int64 on ``device``: row ``j`` of the ``PackedSequence`` is packed row
        ``rows[j]``.
    packed_rows : Tensor
        ``(total,)`` int64 on ``device``: packed row ``i`` is ``PackedSequence`` row
        ``packed_rows[i]`` (the inverse of :attr:`rows`).
    """

    def __init__(self, lengths: Sequence[int], device: torch.device,
                 extra: Sequence[Tensor] = ()) -> None:
        host_lengths = torch.tensor(lengths, dtype=torch.int64)
        # Stable sort keeps equal-length samples in their original order, as pack_sequence does.
        sorted_lengths, sorted_indices = torch.sort(host_lengths, descending=True, stable=True)
        max_len = int(sorted_lengths[0])
        self.batch_sizes = (sorted_lengths[None, :] > torch.arange(max_len)[:, None]).sum(1)
        unsorted_indices = torch.empty_like(sorted_indices)
        unsorted_indices[sorted_indices] = torch.arange(sorted_indices.numel())
        step_starts = torch.cumsum(self.batch_sizes, 0) - self.batch_sizes
        # Row j is step t of the r-th longest sample.
        steps = torch.repeat_interleave(torch.arange(max_len), self.batch_sizes)
        ranks = torch.arange(steps.numel()) - step_starts[steps]
        offsets = torch.cumsum(host_lengths, 0) - host_lengths
        rows = offsets[sorted_indices[ranks]] + steps
        packed_rows = torch.empty_like(rows)
        packed_rows[rows] = torch.arange(rows.numel())
        host = (sorted_indices, unsorted_indices, rows, packed_rows, *extra)
        on_device = _to_device_at_once(host, device)
        self.sorted_indices, self.unsorted_indices, self.rows, self.packed_rows = on_device[:4]
        self.extra = on_device[4:]

    def sequence(self, values: Tensor) -> PackedSequence:
        """``PackedSequence`` of packed ``values (total, *feature)`` (one gather)."""
        return PackedSequence(
            values.index_select(0, self.rows), self.batch_sizes, self.sorted_indices,
            self.unsorted_indices,
        )


def _to_device_at_once(host: Sequence[Tensor], device: torch.device) -> tuple[Tensor, ...]:
    """1-d int64 host tensors on ``device``: one copy of their concatenation, split in views."""
    if device.type == "cpu":
        return tuple(host)
    joined = torch.cat(host).to(device, non_blocking=True)
    return tuple(joined.split([t.numel() for t in host]))
