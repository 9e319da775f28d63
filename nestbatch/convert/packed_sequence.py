"""Conversions between the packed layout and ``torch.nn.utils.rnn.PackedSequence``.

A :class:`~torch.nn.utils.rnn.PackedSequence` stores its rows time-major: all samples' step 0
(longest sample first), then all step-1 rows, and so on. Sample order is restored with its
``sorted_indices`` / ``unsorted_indices``. Both directions here are one gather over the rows, built
from the partition's cached ``row_ids`` / ``positions``, and are differentiable.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from nestbatch.layouts import Packed, RowPartition


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
    unless the batch already knows them there.
    """
    partition = packed.partition
    _check_one_ragged_dim(partition, "to_packed_sequence")
    host_lengths = torch.tensor(partition.host_lengths, dtype=torch.int64)
    if host_lengths.numel() == 0 or bool((host_lengths == 0).any()):
        raise ValueError(
            "PackedSequence needs at least one sample and no zero-length sample, got lengths "
            f"{host_lengths.tolist()}; run the RNN on the NestedBatch itself to keep empty samples"
        )
    order = _order(host_lengths)
    device = packed.values.device
    # Row j of the PackedSequence is step t of the r-th longest sample.
    steps = torch.repeat_interleave(torch.arange(order.batch_sizes.numel()), order.batch_sizes)
    ranks = torch.arange(steps.numel()) - order.step_starts[steps]
    source = partition.offsets.cpu()[order.sorted_indices[ranks]] + steps
    data = packed.values[source.to(device)]
    return PackedSequence(
        data,
        order.batch_sizes,
        order.sorted_indices.to(device),
        order.unsorted_indices.to(device),
    )


def packed_sequence_to_packed(sequence: PackedSequence) -> Packed:
    """Convert a ``PackedSequence`` (sorted or not) to a :class:`Packed` batch in sample order.

    Parameters
    ----------
    sequence : PackedSequence
        ``data (total, *feature)`` time-major, ``batch_sizes`` on the CPU.

    Returns
    -------
    Packed
        Samples in the order ``pad_packed_sequence`` would return them, lengths known on the host
        (derived from the CPU ``batch_sizes``: no device sync).
    """
    if not isinstance(sequence, PackedSequence):
        raise TypeError(f"sequence must be a PackedSequence, got {type(sequence).__name__}")
    batch_sizes = sequence.batch_sizes.cpu().to(torch.int64)
    num_samples = int(batch_sizes[0]) if batch_sizes.numel() else 0
    sorted_lengths = (batch_sizes[None, :] > torch.arange(num_samples)[:, None]).sum(1)
    unsorted = sequence.unsorted_indices
    rank = torch.arange(num_samples) if unsorted is None else unsorted.cpu().to(torch.int64)
    lengths = sorted_lengths[rank]
    host_shapes = [(n,) for n in lengths.tolist()]
    partition = RowPartition.from_host_shapes(host_shapes, 1, torch.device("cpu"))
    step_starts = torch.cumsum(batch_sizes, 0) - batch_sizes
    # Row p of sample i sits at step p, after the rank(i) longer samples of that step.
    source = step_starts[partition.positions] + rank[partition.row_ids]
    data = sequence.data
    values = data[source.to(data.device)]
    return Packed(values, partition=partition.to(data.device))


class _Order:
    """Longest-first order of a batch's samples, and the PackedSequence step sizes."""

    def __init__(self, sorted_indices: Tensor, batch_sizes: Tensor) -> None:
        self.sorted_indices = sorted_indices
        self.unsorted_indices = torch.empty_like(sorted_indices)
        self.unsorted_indices[sorted_indices] = torch.arange(sorted_indices.numel())
        self.batch_sizes = batch_sizes
        self.step_starts = torch.cumsum(batch_sizes, 0) - batch_sizes


def _order(host_lengths: Tensor) -> _Order:
    # Stable sort keeps equal-length samples in their original order, as pack_sequence does.
    sorted_lengths, sorted_indices = torch.sort(host_lengths, descending=True, stable=True)
    max_len = int(sorted_lengths[0])
    batch_sizes = (sorted_lengths[None, :] > torch.arange(max_len)[:, None]).sum(1)
    return _Order(sorted_indices, batch_sizes)


def _check_one_ragged_dim(partition: RowPartition, what: str) -> None:
    if partition.num_ragged_dims != 1:
        raise ValueError(
            f"{what} needs one ragged dim (sequences of shape (L_i, *feature)), got a batch with "
            f"{partition.num_ragged_dims} ragged dims"
        )
