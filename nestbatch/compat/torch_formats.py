"""A :class:`~nestbatch.NestedBatch` to and from torch's other ragged formats: ``PackedSequence``
and ``torch.nested`` tensors.

Functions rather than methods: torch code builds these formats with functions
(``pack_sequence``, ``torch.nested.nested_tensor``), and a batch is not the place to look for
every format it converts to. :func:`nestbatch.as_nested` takes either format too.

A jagged nested tensor (``layout=torch.jagged``) is the packed layout under another name: its
``values()`` are the packed rows and its ``offsets()`` the row offsets. Both directions share
storage and are differentiable. Strided nested tensors are accepted as input (as a list of
views). A ``PackedSequence`` holds the rows time-major
(:class:`~nestbatch.conversions.time_major.TimeMajorOrder`): both directions are one gather.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

from nestbatch.batch import NestedBatch, moved_ragged_error
from nestbatch.conversions.time_major import TimeMajorOrder
from nestbatch.layouts import Packed, RaggedLayout, RowPartition, TensorList

__all__ = ["from_nested_tensor", "from_packed_sequence", "to_nested_tensor", "to_packed_sequence"]



def from_packed_sequence(sequence: PackedSequence) -> NestedBatch:
    """Batch of the sequences of a ``PackedSequence`` (sorted or not), in sample order.

    The lengths come from its CPU ``batch_sizes``, so no device sync; one gather of the rows.
    """
    if not isinstance(sequence, PackedSequence):
        raise TypeError(f"sequence must be a PackedSequence, got {type(sequence).__name__}")
    return NestedBatch(packed_sequence_to_packed(sequence))


def to_packed_sequence(batch: NestedBatch) -> PackedSequence:
    """``batch`` as a ``PackedSequence`` (unsorted: sample order is kept by its indices).

    Needs one ragged dim at dim 1 and no zero-length sample; reads the lengths on the host once
    if only the device has them (``batch_sizes`` lives on the CPU).
    """
    _check_batch(batch, "to_packed_sequence")
    return packed_to_packed_sequence(batch.packed())


def from_nested_tensor(nt: Tensor, num_ragged_dims: int | None = None) -> NestedBatch:
    """Batch of a ``torch.nested`` tensor; a contiguous jagged one shares its storage.

    ``num_ragged_dims`` applies to a strided nested tensor (default: inferred from the sample
    shapes); a jagged one has one ragged dim.
    """
    return NestedBatch(nested_tensor_to_layout(nt, num_ragged_dims))


def to_nested_tensor(batch: NestedBatch) -> Tensor:
    """A jagged ``torch.nested`` tensor sharing ``batch``'s packed values (one ragged dim, at
    dim 1)."""
    _check_batch(batch, "to_nested_tensor")
    return packed_to_nested_tensor(batch.packed())


def _check_batch(batch: object, what: str) -> None:
    if not isinstance(batch, NestedBatch):
        raise TypeError(f"{what} takes a NestedBatch, got {type(batch).__name__}")
    if batch.ragged_dim != 1:
        raise moved_ragged_error(batch, what)


def packed_to_nested_tensor(packed: Packed) -> Tensor:
    """A jagged nested tensor viewing a :class:`Packed` batch's values and offsets.

    Parameters
    ----------
    packed : Packed
        ``B`` samples of shapes ``(L_i, *feature)`` (one ragged dim).

    Returns
    -------
    Tensor
        Nested, ``layout=torch.jagged``, shape ``(B, j, *feature)``; ``values()`` is
        ``packed.values`` (same storage) and ``offsets()`` the batch's offsets.

    Raises
    ------
    ValueError
        With several ragged dims: a jagged nested tensor has exactly one (use
        ``torch.nested.as_nested_tensor(batch.tolist(), layout=torch.strided)`` for images).

    Notes
    -----
    The largest and smallest lengths are handed to torch when known on the host, so torch need
    not compute them on the device later.
    """
    partition = packed.partition
    if partition.num_ragged_dims != 1:
        raise ValueError(
            "a jagged nested tensor has one ragged dim, got a batch with "
            f"{partition.num_ragged_dims}; use a strided nested tensor for several"
        )
    sizes = {}
    if partition.knows_host_shapes and partition.batch_size:
        lengths = partition.host_lengths
        sizes = {"min_seqlen": min(lengths), "max_seqlen": max(lengths)}
    return torch.nested.nested_tensor_from_jagged(packed.values, partition.offsets, **sizes)


def nested_tensor_to_layout(nt: Tensor, num_ragged_dims: int | None = None) -> RaggedLayout:
    """A layout holding the samples of a nested tensor.

    Parameters
    ----------
    nt : Tensor
        A nested tensor. Jagged: its ragged dim must be dim 1 (samples ``(L_i, *feature)``).
        Strided: samples of any shapes with the same number of dims.
    num_ragged_dims : int, optional
        For a strided nested tensor, how many leading dims of every sample are ragged. Default:
        up to the last dim whose size differs between samples (at least 1).

    Returns
    -------
    RaggedLayout
        :class:`Packed` sharing the jagged tensor's values when they are contiguous, else a
        gather of its rows (a jagged tensor with holes); a :class:`TensorList` of views for a
        strided one.

    Raises
    ------
    TypeError
        If ``nt`` is not a nested tensor.
    ValueError
        If a jagged tensor's ragged dim is not dim 1.
    """
    if not isinstance(nt, Tensor) or not nt.is_nested:
        raise TypeError(f"nt must be a nested tensor, got {type(nt).__name__}")
    if nt.layout == torch.jagged:
        return _jagged_to_packed(nt)
    samples = list(nt.unbind())
    if num_ragged_dims is None:
        num_ragged_dims = _infer_ragged_dims([t.shape for t in samples])
    return TensorList(samples, num_ragged_dims, dtype=nt.dtype, device=nt.device)


def _jagged_to_packed(nt: Tensor) -> Packed:
    ragged_idx = getattr(nt, "_ragged_idx", 1)
    if ragged_idx != 1:
        raise ValueError(
            f"the jagged nested tensor's ragged dim is dim {ragged_idx}; nestbatch needs it at "
            "dim 1 (transpose it back first)"
        )
    values, offsets, lengths = nt.values(), nt.offsets(), nt.lengths()
    if lengths is None:
        return Packed(values, partition=RowPartition.from_offsets(offsets))
    # Rows of a non-contiguous jagged tensor start at offsets[i] and run lengths[i]: gather them.
    partition = RowPartition.from_lengths(lengths.to(torch.int64))
    source = offsets.to(torch.int64)[partition.row_ids] + partition.positions
    return Packed(values[source], partition=partition)


def _infer_ragged_dims(shapes: list[torch.Size]) -> int:
    if not shapes:
        return 1
    varying = [d for d in range(len(shapes[0])) if len({s[d] for s in shapes}) > 1]
    return max(varying, default=0) + 1


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
