"""Conversions between the nestbatch layouts and ``torch.nested`` nested tensors.

A jagged nested tensor (``layout=torch.jagged``) is the packed layout under another name: its
``values()`` are the packed rows and its ``offsets()`` the row offsets. Both directions share
storage and are differentiable. Strided nested tensors are accepted as input (as a list of views).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nestbatch.layouts import Packed, RaggedLayout, RowPartition, TensorList


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
