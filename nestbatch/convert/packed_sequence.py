"""Conversions between the packed layout and ``torch.nn.utils.rnn.PackedSequence``.

A :class:`~torch.nn.utils.rnn.PackedSequence` stores its rows time-major: all samples' step 0
(longest sample first), then all step-1 rows, and so on. Sample order is restored with its
``sorted_indices`` / ``unsorted_indices``. Both directions here are one gather over the rows and
are differentiable.

The row order is a function of the lengths alone, which a ``PackedSequence`` keeps on the host
(``batch_sizes`` is a CPU tensor): :class:`TimeMajorOrder` computes it there, and the device sees
one host-to-device copy of every index it needs at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from nestbatch.layouts import Packed, RowPartition


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


def packed_to_packed_sequence(packed: Packed) -> PackedSequence:
    """Convert a :class:`Packed` batch with one ragged dim to a ``PackedSequence``.

    Parameters
    ----------
    packed : Packed
        ``B`` samples of shapes ``(L_i, *feature)``, every ``L_i >= 1``.

    Returns
    -------
    PackedSequence
        ``data (total, *feature)`` time-major, ``batch_sizes (max_len,)`` int64 on the CPU,
        ``sorted_indices`` / ``unsorted_indices (B,)`` on the data's device; unpacking it gives the
        samples in their original order.

    Raises
    ------
    ValueError
        With several ragged dims, or a zero-length sample (``PackedSequence`` cannot hold one; an
        RNN called on the ``NestedBatch`` itself handles them).

    Notes
    -----
    ``batch_sizes`` lives on the CPU, so the lengths are needed on the host: read once (a sync)
    unless the batch already knows them there. Then one host-to-device copy of the indices and
    one gather of the rows.
    """
    partition = packed.partition
    _check_one_ragged_dim(partition, "to_packed_sequence")
    lengths = partition.host_lengths
    if not lengths or 0 in lengths:
        raise ValueError(
            "PackedSequence needs at least one sample and no zero-length sample, got lengths "
            f"{list(lengths)}; run the RNN on the NestedBatch itself to keep empty samples"
        )
    return TimeMajorOrder(lengths, packed.values.device).sequence(packed.values)


def packed_sequence_to_packed(sequence: PackedSequence) -> Packed:
    """Convert a ``PackedSequence`` (sorted or not) to a :class:`Packed` batch in sample order.

    Parameters
    ----------
    sequence : PackedSequence
        ``data (total, *feature)`` time-major, ``batch_sizes`` on the CPU.

    Returns
    -------
    Packed
        Samples in the order ``pad_packed_sequence`` would return them. No device sync: with
        ``unsorted_indices`` on the host (or none) the lengths are known on the host; with
        ``unsorted_indices`` on a device, the lengths are computed there (their total and
        maximum are known on the host from ``batch_sizes``).
    """
    if not isinstance(sequence, PackedSequence):
        raise TypeError(f"sequence must be a PackedSequence, got {type(sequence).__name__}")
    batch_sizes = sequence.batch_sizes.cpu().to(torch.int64)
    num_samples = int(batch_sizes[0]) if batch_sizes.numel() else 0
    sorted_lengths = (batch_sizes[None, :] > torch.arange(num_samples)[:, None]).sum(1)
    data, unsorted = sequence.data, sequence.unsorted_indices
    step_starts = torch.cumsum(batch_sizes, 0) - batch_sizes
    if unsorted is None or unsorted.is_cpu:
        rank = torch.arange(num_samples) if unsorted is None else unsorted.to(torch.int64)
        lengths = sorted_lengths[rank]
        partition = RowPartition.from_host_lengths(lengths.tolist(), torch.device("cpu"))
    else:
        # Ranks on the device: the lengths are gathered there, never read back.
        rank = unsorted.to(torch.int64)
        lengths = sorted_lengths.to(data.device, non_blocking=True)[rank]
        partition = RowPartition.from_lengths(lengths, max_len=batch_sizes.numel())
        partition.note_total(data.shape[0])
        step_starts = step_starts.to(data.device, non_blocking=True)
    # Row p of sample i sits at step p, after the rank(i) longer samples of that step.
    source = step_starts[partition.positions] + rank[partition.row_ids]
    values = data.index_select(0, source.to(data.device))
    return Packed(values, partition=partition.to(data.device))


def _check_one_ragged_dim(partition: RowPartition, what: str) -> None:
    if partition.num_ragged_dims != 1:
        raise ValueError(
            f"{what} needs one ragged dim (sequences of shape (L_i, *feature)), got a batch with "
            f"{partition.num_ragged_dims} ragged dims"
        )
