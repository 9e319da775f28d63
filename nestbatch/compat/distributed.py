"""Ragged batches across processes, on ``torch.distributed`` (any backend).

Data-parallel code gathers ragged outputs (per-rank predictions, detections, token lists) and
usually pads every sample to the global maximum first. Here every collective moves the packed
rows of the samples instead, in two steps:

1. the per-sample ragged shapes, the feature shape and the dtype, as one small object
   collective (their consistency across ranks is checked on every rank, so all raise together);
2. the packed values, as one tensor collective. Tensor collectives need one size on every rank,
   so each rank's packed rows are padded to the largest *rank's* row count (never samples to
   the longest sample), and the padding is dropped on arrival.

:func:`all_gather` is differentiable: the gradient of every gathered row goes back to the rank
that holds it (summed over the ranks that used it), as
``torch.distributed.nn.functional.all_gather`` does for dense tensors.

:func:`all_to_all` and the token-level :func:`dispatch` / :func:`combine` pad nothing: they move
fixed-size tensors of sizes first (every rank's counts with a description of its batch, so a
mismatch raises on every rank before any values move), then the rows in one
``all_to_all_single`` with uneven splits, as bytes. Both are differentiable (the backward is the
reverse exchange, as in ``torch.distributed.nn``).
"""

from __future__ import annotations

import itertools
import math
import operator
import zlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Packed, RowPartition

__all__ = ["TokenRoute", "all_gather", "all_to_all", "broadcast", "combine", "dispatch", "gather",
           "scatter"]


# ------------------------------------------------------------------------------- descriptions
def _describe(batch: NestedBatch) -> dict:
    """What the other ranks need to receive ``batch``: host shapes, feature shape, dtype."""
    if not isinstance(batch, NestedBatch):
        raise _not_a_batch(batch)
    if batch.ragged_dim != 1:
        raise ValueError("move the ragged dim back to dim 1 before a collective (transpose)")
    return {
        "shapes": [tuple(s) for s in batch.partition.host_shapes],  # a sync if device-only
        "k": batch.num_ragged_dims,
        "feature": tuple(batch.feature_shape),
        "dtype": str(batch.dtype),
        "grad": batch.requires_grad and torch.is_grad_enabled(),
    }


def _description(batch: Any) -> dict:
    """:func:`_describe`, or the error it raises as ``{"error": (kind, message)}``: sent to
    the other ranks with the descriptions, so that every rank raises it (a rank raising alone
    would leave the others waiting in the collective)."""
    try:
        return _describe(batch)
    except (TypeError, ValueError) as error:
        return _sent(error)


def _sent(error: TypeError | ValueError) -> dict:
    """``error`` as a description to send (:func:`_raise_sent_error` raises it)."""
    return {"error": (type(error).__name__, str(error))}


def _raise_sent_error(descriptions: Sequence[dict | None], owner: str = "rank {}") -> None:
    """Raise, on every rank, the first error a description carries (:func:`_description`)."""
    for i, d in enumerate(descriptions):
        if d is not None and "error" in d:
            kind, message = d["error"]
            raise (TypeError if kind == "TypeError" else ValueError)(
                f"{owner.format(i)}: {message}")


def _not_a_batch(batch: Any) -> TypeError:
    return TypeError(f"batch must be a NestedBatch, got {type(batch).__name__}")


def _check_agree(descriptions: Sequence[dict | None], owner: str = "rank {}") -> dict:
    """The common ``k`` / feature shape / dtype of the ranks' batches (raises on every rank;
    ``owner``: how the messages name batch ``i``).

    A rank with no sample has no feature shape to tell (``nested([])``): it takes the others'.
    """
    _raise_sent_error(descriptions, owner)
    present = [(r, d) for r, d in enumerate(descriptions) if d is not None]
    holding = [(r, d) for r, d in present if d["shapes"]]
    first_rank, first = (holding or present)[0]
    for rank, d in holding[1:]:
        for key in ("k", "feature", "dtype"):
            if d[key] != first[key]:
                raise ValueError(
                    f"{owner.format(rank)} holds a batch with {key}={d[key]!r} but "
                    f"{owner.format(first_rank)} with {key}={first[key]!r}: every rank must "
                    "hold the same kind of batch"
                )
    return first


def _local_rows(batch: NestedBatch, agreed: dict, rows: int, device: torch.device) -> Tensor:
    """This rank's packed values as the agreed kind, padded to ``rows`` rows, on ``device``."""
    values = batch.values.detach()
    if not values.numel():  # possibly an empty batch of unknown feature shape
        values = values.new_empty((0, *agreed["feature"]), dtype=_dtype(agreed["dtype"]))
    return _padded_rows(values.to(device), rows)


def _rows(description: dict) -> int:
    return sum(math.prod(shape) for shape in description["shapes"])


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def _device(group: Any) -> torch.device:
    """The device tensor collectives of ``group``'s backend take."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _padded_rows(values: Tensor, rows: int) -> Tensor:
    """``values`` with zero rows appended up to ``rows`` (one buffer for the collective)."""
    if values.shape[0] == rows:
        return values.contiguous()
    out = values.new_zeros((rows, *values.shape[1:]))
    out[: values.shape[0]] = values
    return out


def _batch(values: Tensor, description: dict, shapes: Sequence[tuple]) -> NestedBatch:
    partition = RowPartition.from_host_shapes(list(shapes), description["k"], values.device)
    return NestedBatch.trusted(Packed.trusted(values, partition))


# ------------------------------------------------------------------------------- all_gather
class _AllGather(torch.autograd.Function):
    """Packed rows of every rank, in rank order; backward sends each rank its rows' gradient."""

    @staticmethod
    def forward(ctx: Any, values: Tensor, local: Tensor, counts: tuple[int, ...], group: Any
                ) -> Tensor:
        # ``values`` carries the autograd link; ``local`` is them padded for the collective.
        ctx.counts, ctx.group = counts, group
        ctx.rank = dist.get_rank(group)
        if max(counts, default=0) == 0:
            return local.clone().to(values.device)  # no rank holds a row: nothing to send
        parts = [torch.empty_like(local) for _ in counts]
        dist.all_gather(parts, local, group=group)
        out = torch.cat([p[:n] for p, n in zip(parts, counts)])
        return out.to(values.device)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        counts, width = ctx.counts, max(ctx.counts, default=0)
        if width == 0:
            return grad[:0], None, None, None
        device = _device(ctx.group)
        slices = grad.to(device).split(list(counts))
        stacked = torch.stack([_padded_rows(s, width) for s in slices])
        # Every rank's gradient for every rank's rows, summed: the sum for this rank's rows.
        dist.all_reduce(stacked, group=ctx.group)
        mine = stacked[ctx.rank, : counts[ctx.rank]]
        return mine.to(grad.device), None, None, None


def all_gather(batch: NestedBatch, group: Any = None) -> NestedBatch:
    """The samples of every rank's ``batch``, in rank order, on every rank.

    Ranks may hold different numbers of samples (zero included), of any dtype and feature
    shape (the same on every rank) and with several ragged dims. Differentiable: the gradient
    reaching a gathered sample flows back to the rank that holds it.

    Parameters
    ----------
    batch : NestedBatch
        This rank's samples (ragged dim at dim 1).
    group : ProcessGroup, optional
        Default: the whole world.

    Returns
    -------
    NestedBatch
        On this rank's device, packed.
    """
    descriptions: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(descriptions, _description(batch), group=group)
    agreed = _check_agree(descriptions)
    counts = tuple(_rows(d) for d in descriptions)
    local = _local_rows(batch, agreed, max(counts, default=0), _device(group))
    values = batch.values
    if not values.numel() and (tuple(values.shape[1:]) != tuple(agreed["feature"])
                               or values.dtype != local.dtype):
        values = local[:0]  # (an empty batch of another kind: nested([]))
    if not values.requires_grad and any(d["grad"] for d in descriptions):
        # Every rank joins the all_reduce of the backward: its output needs a gradient too.
        values = values.detach().requires_grad_()
    values = _AllGather.apply(values, local, counts, group)
    shapes = [s for d in descriptions for s in d["shapes"]]
    return _batch(values, agreed, shapes)


# ------------------------------------------------------------------------- rooted collectives
def broadcast(batch: NestedBatch | None, src: int, group: Any = None) -> NestedBatch:
    """``src``'s batch on every rank (``batch`` is ignored on the other ranks; may be None)."""
    rank = dist.get_rank(group)
    box = [_description(batch) if rank == src else None]
    dist.broadcast_object_list(box, src=_global(src, group), group=group)
    description = box[0]
    _raise_sent_error([description], f"rank {src}")
    device = _device(group)
    if rank == src:
        values = batch.values.detach().to(device).contiguous()
    else:
        values = torch.empty((_rows(description), *description["feature"]),
                             dtype=_dtype(description["dtype"]), device=device)
    if values.numel():
        dist.broadcast(values, src=_global(src, group), group=group)
    target = batch.device if rank == src else device
    return _batch(values.to(target), description, description["shapes"])


def scatter(batches: Sequence[NestedBatch] | None, src: int, group: Any = None
            ) -> NestedBatch:
    """Batch ``i`` of ``src``'s list on rank ``i`` (``batches`` is ignored elsewhere).

    Parameters
    ----------
    batches : sequence of NestedBatch
        On ``src``: one batch per rank, all of the same kind (dtype, feature shape, ragged dims).
    src : int
        The rank holding them.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    descriptions: list = [None] * world
    if rank == src:
        if not isinstance(batches, Sequence) or len(batches) != world:
            got = len(batches) if isinstance(batches, Sequence) else type(batches).__name__
            raise ValueError(f"batches must hold one batch per rank ({world}), got {got}")
        descriptions = [_description(b) for b in batches]
        try:
            agreed = _check_agree(descriptions, "batches[{}]")
            descriptions = [{**agreed, "shapes": d["shapes"]} for d in descriptions]
        except (TypeError, ValueError) as error:  # (sent: every rank raises it)
            descriptions = [_sent(error)] * world
    box: list = [None]
    dist.scatter_object_list(box, descriptions if rank == src else None,
                             src=_global(src, group), group=group)
    _raise_sent_error(box, f"rank {src}")
    counts_box = [[_rows(d) for d in descriptions] if rank == src else None]
    dist.broadcast_object_list(counts_box, src=_global(src, group), group=group)
    counts = counts_box[0]
    description, width = box[0], max(counts, default=0)
    device = _device(group)
    out = torch.empty((width, *description["feature"]), dtype=_dtype(description["dtype"]),
                      device=device)
    parts = ([_local_rows(b, description, width, device) for b in batches]
             if rank == src else None)
    dist.scatter(out, parts, src=_global(src, group), group=group)
    return _batch(out[: counts[rank]], description, description["shapes"])


def gather(batch: NestedBatch, dst: int, group: Any = None) -> NestedBatch | None:
    """Every rank's samples, in rank order, on ``dst`` (None on the other ranks)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    descriptions: list = [None] * world
    dist.all_gather_object(descriptions, _description(batch), group=group)  # (all learn the sizes)
    agreed = _check_agree(descriptions)
    counts = [_rows(d) for d in descriptions]
    width, device = max(counts, default=0), _device(group)
    local = _local_rows(batch, agreed, width, device)
    parts = [torch.empty_like(local) for _ in range(world)] if rank == dst else None
    dist.gather(local, parts, dst=_global(dst, group), group=group)
    if rank != dst:
        return None
    values = torch.cat([p[:n] for p, n in zip(parts, counts)]).to(batch.device)
    return _batch(values, agreed, [s for d in descriptions for s in d["shapes"]])


def _global(rank: int, group: Any) -> int:
    """The global rank of ``group``'s rank ``rank`` (what the rooted collectives take)."""
    return rank if group is None else dist.get_global_rank(group, rank)


# ------------------------------------------------------------------------ all_to_all: sizes
# The first exchange sends every rank one row of these ints: the count of samples (or tokens)
# it gets, whether the sender's arguments were valid, and the kind of the sender's batch. So
# every rank sees every rank's kind and all raise the same error before any values move (a rank
# raising alone would leave the others waiting in the collective).
_COUNT, _STATUS, _HOLDING, _K, _DTYPE, _NDIM, _NUMEL, _SHAPE_CRC = range(8)
_BAD_INPUT, _BAD_COUNTS, _BAD_DESTINATION = 1, 2, 3
_PROBLEMS = {_BAD_INPUT: "a batch (or tokens) that cannot move", _BAD_COUNTS: "invalid send_counts",
             _BAD_DESTINATION: "destinations outside the group"}
#: Every dtype of torch in a fixed order: a dtype travels as its index.
_DTYPES = tuple(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))


def _kind_row(status: int, holding: bool, k: int, dtype: torch.dtype, feature: Sequence[int]
              ) -> list[int]:
    """This rank's row of the first exchange (the count is set per destination). The feature
    shape travels as its length, element count and CRC: fixed size, whatever its length."""
    feature = tuple(feature)
    return [0, status, int(holding), k, _DTYPES.index(dtype), len(feature), math.prod(feature),
            zlib.crc32(repr(feature).encode())]


def _exchange_kinds(counts: Tensor, row: list[int], group: Any, status: Tensor | None = None
                    ) -> tuple[list[list[int]], list[int], int]:
    """Send ``counts[j]`` and ``row`` to rank ``j``: every rank's row, as this rank got it.

    ``counts`` (world,) int64 on any device; ``status``, when given, a 0-d tensor overriding
    ``row``'s (computed on the device: no host read before the exchange). Returns the rows
    received (one per source rank), ``counts`` and the status sent, read in one host read: a
    sync on CUDA, of known size.
    """
    device = _device(group)
    send = torch.tensor(row, dtype=torch.int64).to(device).repeat(counts.shape[0], 1)
    send[:, _COUNT] = counts.to(device)
    if status is not None:
        send[:, _STATUS] = status.to(device)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    host = torch.cat([received.flatten(), send[:, _COUNT], send[:1, _STATUS]]).tolist()
    width, world = send.shape[1], send.shape[0]
    rows = [host[i * width: (i + 1) * width] for i in range(world)]
    return rows, host[world * width: -1], host[-1]


def _agree(rows: list[list[int]], error: Exception | None, what: str, feature: Sequence[int]
           ) -> int:
    """The source rank whose kind every rank's batch has (or the same error on every rank).

    A rank's own invalid arguments raise its own error; the others name that rank. Ranks with
    no sample (``_HOLDING`` 0: ``nested([])`` has no feature shape to tell) take the others'.
    """
    if error is not None:
        raise error
    for source, row in enumerate(rows):
        if row[_STATUS]:
            raise ValueError(f"{what}: rank {source} passed {_PROBLEMS[row[_STATUS]]} (its own "
                             "error says which); no rank moved anything")
    holding = [s for s, row in enumerate(rows) if row[_HOLDING]] or [0]
    first = rows[holding[0]]
    for source in holding[1:]:
        row = rows[source]
        if row[_DTYPE] != first[_DTYPE]:
            theirs, ours = _DTYPES[row[_DTYPE]], _DTYPES[first[_DTYPE]]
            raise ValueError(f"{what}: rank {source} holds dtype={theirs} but rank {holding[0]} "
                             f"dtype={ours}: every rank must hold the same kind of batch")
        if row[_K] != first[_K]:
            raise ValueError(f"{what}: rank {source} holds {row[_K]} ragged dims but rank "
                             f"{holding[0]} {first[_K]}: every rank must hold the same kind")
        if row[_NDIM:] != first[_NDIM:]:
            raise ValueError(
                f"{what}: rank {source} holds another feature shape ({row[_NDIM]} dims, "
                f"{row[_NUMEL]} elements a row) than rank {holding[0]} ({first[_NDIM]} dims, "
                f"{first[_NUMEL]} elements a row; this rank's: {tuple(feature)}): every rank "
                "must hold the same kind of batch")
    return holding[0]


# ----------------------------------------------------------------------- all_to_all: values
def _as_bytes(rows: Tensor) -> Tensor:
    """``rows (n, *feature)`` as ``(n, bytes a row)`` uint8, a view when contiguous.

    The values move as bytes: an all-to-all only copies, and gloo has no all-to-all for some
    dtypes (int16, uint16, float8 on torch 2.13: "Invalid scalar type"); bool, complex and the
    rest move the same way on every backend.
    """
    rows = rows.contiguous()
    numel = math.prod(rows.shape[1:])
    if numel == 0:
        return rows.new_empty((rows.shape[0], 0), dtype=torch.uint8)
    return rows.view(rows.shape[0], numel).view(torch.uint8)


def _from_bytes(buffer: Tensor, feature: Sequence[int], dtype: torch.dtype) -> Tensor:
    """``buffer (n, bytes a row)`` uint8 as ``(n, *feature)`` of ``dtype`` (a view)."""
    if buffer.shape[1] == 0:
        return buffer.new_empty((buffer.shape[0], *feature), dtype=dtype)
    return buffer.view(dtype).view(buffer.shape[0], *feature)


def _exchange_rows(rows: Tensor, send: Sequence[int], recv: Sequence[int], group: Any
                   ) -> Tensor:
    """``rows (sum(send), *feature)``: ``send[j]`` rows to rank ``j``; returns the
    ``(sum(recv), *feature)`` rows received, by source rank, on ``rows``' device."""
    device = _device(group)
    buffer = _as_bytes(rows.detach().to(device))
    out = buffer.new_empty((sum(recv), buffer.shape[1]))
    dist.all_to_all_single(out, buffer, list(recv), list(send), group=group)
    return _from_bytes(out, rows.shape[1:], rows.dtype).to(rows.device)


class _AllToAll(torch.autograd.Function):
    """Rows to every rank by uneven splits; the backward sends the gradient back the same way."""

    @staticmethod
    def forward(ctx: Any, rows: Tensor, send: tuple[int, ...], recv: tuple[int, ...],
                group: Any) -> Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _exchange_rows(rows, send, recv, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        # The reverse exchange (itself differentiable, for double backward).
        return _AllToAll.apply(grad, ctx.recv, ctx.send, ctx.group), None, None, None


def _one_rank(group: Any) -> bool:
    """Whether ``group`` has a single rank: then the exchanges are local no-ops."""
    return dist.get_world_size(group) == 1


# ------------------------------------------------------------------------------- all_to_all
def _check_send(batch: Any, send_counts: Any, world: int
                ) -> tuple[list[int], int, Exception | None]:
    """``send_counts`` as ints, with the status and error (None) of the local arguments. A
    tensor of counts is read on the host: ``world`` ints, a sync if it lives on a GPU (the
    counts size the exchange, so the host needs them)."""
    if not isinstance(batch, NestedBatch):
        return [0] * world, _BAD_INPUT, _not_a_batch(batch)
    if batch.ragged_dim != 1 or batch.partition.ragged_rank != 1:
        return [0] * world, _BAD_INPUT, ValueError(
            "batch must have its ragged dims at dim 1 and ragged rank 1, got ragged_dim="
            f"{batch.ragged_dim}, ragged rank {batch.partition.ragged_rank} (transpose back)")
    try:
        listed = send_counts.tolist() if isinstance(send_counts, Tensor) else send_counts
        counts = [_count(c) for c in listed]
    except TypeError:
        return [0] * world, _BAD_COUNTS, TypeError(
            f"send_counts must be a sequence of ints (one per rank), got {send_counts!r}")
    problem = None
    if len(counts) != world:
        problem = f"one count per rank of the group ({world}), got {len(counts)}"
    elif min(counts, default=0) < 0:
        problem = f"counts >= 0, got {counts}"
    elif sum(counts) != batch.batch_size:
        problem = f"counts summing to the batch size {batch.batch_size}, got {counts}"
    if problem is not None:
        return [0] * world, _BAD_COUNTS, ValueError(f"send_counts must hold {problem}")
    return counts, 0, None


def _count(value: Any) -> int:
    """``value`` as an int if it is one (numpy's and torch's included; not bool, not float)."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a count")
    return operator.index(value)


def _exchange_shapes(shapes: Tensor, counts: list[int], feature: tuple[int, ...],
                     rows: list[list[int]], source: int, group: Any
                     ) -> tuple[Tensor, tuple[int, ...]]:
    """Send the ragged shapes ``(B, k)`` of the samples for every rank (then this rank's feature
    shape) as one ``all_to_all_single`` of ints; returns the shapes received ``(n, k)``, on the
    host, and ``source``'s feature shape (what a rank with no sample of its own adopts). The
    shapes are read to the host once (a sync on CUDA, of a size known from the first exchange):
    the received batch's partition needs them."""
    k, dims = shapes.shape[1], torch.tensor(feature, dtype=torch.int64)
    bounds = [0, *itertools.accumulate(counts)]
    send = torch.cat([piece for a, b in itertools.pairwise(bounds)
                      for piece in (shapes[a:b].flatten(), dims)])
    send_splits = [count * k + len(feature) for count in counts]
    recv_splits = [row[_COUNT] * row[_K] + row[_NDIM] for row in rows]
    device = _device(group)
    received = torch.empty(sum(recv_splits), dtype=torch.int64, device=device)
    dist.all_to_all_single(received, send.to(device), recv_splits, send_splits, group=group)
    pieces = received.cpu().split(recv_splits)  # the second host read, of known size
    agreed = tuple(pieces[source][rows[source][_COUNT] * rows[source][_K]:].tolist())
    got = [piece[: row[_COUNT] * row[_K]] for piece, row in zip(pieces, rows)]
    return torch.cat(got).view(-1, rows[source][_K]), agreed


def _host_shapes(batch: NestedBatch) -> Tensor:
    """``(B, k)`` int64 on the host: the ragged shape of every sample (a sync if the sizes live
    only on the device)."""
    partition = batch.partition
    if batch.num_ragged_dims == 1:
        return torch.tensor(partition.host_lengths, dtype=torch.int64).view(-1, 1)
    return torch.tensor(partition.host_shapes, dtype=torch.int64).view(-1, batch.num_ragged_dims)


def _rows_by_rank(lengths: Tensor, counts: Sequence[int]) -> list[int]:
    """Packed rows of every rank's run of samples: ``lengths (n,)`` summed by ``counts``
    (``lengths`` is a host tensor, the shapes :func:`_exchange_shapes` read: no sync)."""
    ends = torch.tensor([0, *itertools.accumulate(counts)], dtype=torch.int64)
    cumulative = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    return cumulative[ends].diff().tolist()


def all_to_all(batch: NestedBatch, send_counts: Sequence[int] | Tensor, group: Any = None, *,
               return_counts: bool = False) -> NestedBatch | tuple[NestedBatch, tuple[int, ...]]:
    """Send this rank's samples in runs to every rank; return what every rank sent here.

    Rank ``r`` sends its first ``send_counts[0]`` samples to rank 0, the next
    ``send_counts[1]`` to rank 1, and so on. The result holds the samples received, by source
    rank, then in the order the source held them. Ranks may send any counts (zero included), of
    any dtype and feature shape (the same on every rank) and with several ragged dims.

    Two small exchanges of ints of known size carry the counts, a description of every rank's
    batch and the samples' ragged shapes; then the packed rows move in one
    ``all_to_all_single`` with uneven splits: no padding, no pickling. Differentiable: the
    gradient of a received sample goes back to the rank that sent it (the reverse exchange).

    Parameters
    ----------
    batch : NestedBatch
        This rank's ``B`` samples of shapes ``(*ragged_shape_i, *feature)`` (ragged dims at dim
        1, ragged rank 1). Its sizes are read on the host: a sync if they live only on the
        device.
    send_counts : sequence of int or Tensor
        ``(world,)``: how many samples go to every rank, summing to ``B`` (a tensor is read on
        the host).
    group : ProcessGroup, optional
        Default: the whole world. In a group of one rank ``batch`` itself is returned.
    return_counts : bool, default False
        Also return the samples received from every rank: the ``send_counts`` of the reverse
        exchange (``all_to_all(received, counts)`` gives ``batch`` back).

    Returns
    -------
    NestedBatch or (NestedBatch, tuple of int)
        The samples received, packed, on ``batch``'s device; with ``return_counts``, also the
        ``(world,)`` counts received from every rank.

    Raises
    ------
    TypeError, ValueError
        On every rank, before any values move, when a rank's ``send_counts`` has the wrong
        length, a negative count or a sum other than its batch size, or when the ranks' batches
        differ in dtype, ragged dims or feature shape (a rank without samples takes the others').

    Notes
    -----
    On CUDA with NCCL, two host reads of known size (the counts, then the shapes) are the only
    syncs. The values move as bytes, so every dtype moves on every backend.
    """
    world = dist.get_world_size(group)
    counts, status, error = _check_send(batch, send_counts, world)
    shapes, feature = torch.zeros(0, 1, dtype=torch.int64), ()
    if _one_rank(group):
        if error is not None:
            raise error
        return (batch, (batch.batch_size,)) if return_counts else batch
    if error is None:
        row = _kind_row(0, batch.batch_size > 0, batch.num_ragged_dims, batch.dtype,
                        batch.feature_shape)
        shapes, feature = _host_shapes(batch), tuple(batch.feature_shape)
    else:  # still takes part in the first exchange, so that every rank raises
        row = _kind_row(status, False, 1, torch.uint8, ())
    rows, _, _ = _exchange_kinds(torch.tensor(counts, dtype=torch.int64), row, group)
    source = _agree(rows, error, "all_to_all", feature)
    got, feature = _exchange_shapes(shapes, counts, feature, rows, source, group)
    dtype = _DTYPES[rows[source][_DTYPE]]
    values = batch.values
    if values.dtype != dtype or tuple(values.shape[1:]) != feature:  # no sample: adopt the kind
        values = values.new_empty((0, *feature), dtype=dtype)
    recv_counts = tuple(row[_COUNT] for row in rows)
    offsets, bounds = batch.partition.host_offsets, [0, *itertools.accumulate(counts)]
    send_rows = tuple(offsets[b] - offsets[a] for a, b in itertools.pairwise(bounds))
    recv_rows = tuple(_rows_by_rank(got.prod(1), recv_counts))
    moved = _AllToAll.apply(values, send_rows, recv_rows, group)
    partition = RowPartition.from_host_shape_tensor(got, moved.device)
    out = NestedBatch.trusted(Packed.trusted(moved, partition))
    return (out, recv_counts) if return_counts else out


# -------------------------------------------------------------------- dispatch and combine
class TokenRoute:
    """Where :func:`dispatch` sent every token: what :func:`combine` needs to bring results back.

    Attributes
    ----------
    order : Tensor or None
        ``(N,)`` int64: the tokens sorted (stably) by destination rank; None in a group of one
        rank, where nothing moves.
    send_counts : tuple of int
        ``(world,)``: the tokens this rank sent to every rank.
    recv_counts : tuple of int
        ``(world,)``: the tokens this rank received from every rank (the received rows hold
        them by source rank, each source's in its original order).
    group : ProcessGroup or None
        The group of the exchange.
    """

    __slots__ = ("group", "order", "recv_counts", "send_counts")

    def __init__(self, order: Tensor | None, send_counts: tuple[int, ...],
                 recv_counts: tuple[int, ...], group: Any) -> None:
        self.order, self.group = order, group
        self.send_counts, self.recv_counts = send_counts, recv_counts

    def __repr__(self) -> str:
        return (f"TokenRoute(send_counts={self.send_counts}, recv_counts={self.recv_counts})")

    def send(self, tensor: Tensor) -> Tensor:
        """Another per-token tensor ``(N, ...)`` (expert ids, gate weights) along the same
        route: row ``i`` arrives where token ``i`` did. No size exchange; differentiable."""
        _check_rows(tensor, sum(self.send_counts), "tensor", "one row per token sent")
        if self.order is None:
            return tensor
        return _AllToAll.apply(tensor.index_select(0, self.order), self.send_counts,
                               self.recv_counts, self.group)

    def combine(self, results: Tensor) -> Tensor:
        """:func:`combine` ``(results, self)``."""
        _check_rows(results, sum(self.recv_counts), "results", "one row per token received")
        if self.order is None:
            return results
        back = _AllToAll.apply(results, self.recv_counts, self.send_counts, self.group)
        # Row j of ``back`` is token order[j]: put it back in place (differentiable, O(N)).
        return torch.zeros_like(back).index_copy(0, self.order, back)


def _check_rows(tensor: Any, rows: int, name: str, what: str) -> None:
    if not isinstance(tensor, Tensor) or tensor.dim() < 1 or tensor.shape[0] != rows:
        got = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor).__name__
        raise ValueError(f"{name} must have {rows} rows ({what}), got {got}")


def _check_tokens(rows: Any, destination: Any) -> Exception | None:
    """The error of invalid local arguments of :func:`dispatch` (None if valid)."""
    if not isinstance(rows, Tensor) or rows.dim() < 1:
        got = tuple(rows.shape) if isinstance(rows, Tensor) else type(rows).__name__
        return TypeError(f"tokens must be a Tensor (N, *feature) or a NestedBatch, got {got}")
    if (not isinstance(destination, Tensor) or destination.dtype.is_floating_point
            or destination.dtype.is_complex or destination.dtype == torch.bool
            or tuple(destination.shape) != (rows.shape[0],)):
        got = (f"{destination.dtype} of shape {tuple(destination.shape)}"
               if isinstance(destination, Tensor) else type(destination).__name__)
        return ValueError(f"destination must be an integer tensor of shape ({rows.shape[0]},) "
                          f"(a rank per token), got {got}")
    if destination.device != rows.device:
        return ValueError(f"destination must be on the tokens' device {rows.device}, got "
                          f"{destination.device}")
    return None


def dispatch(tokens: Tensor | NestedBatch, destination: Tensor, group: Any = None
             ) -> tuple[Tensor, TokenRoute]:
    """Send every token to the rank ``destination`` names (experts' dispatch); see
    :func:`combine` for the way back.

    The tokens are sorted stably by destination (``argsort``, ``index_select``), counted per
    rank (``bincount``) and moved in one ``all_to_all_single`` with uneven splits, after one
    fixed-size exchange of the counts. O(tokens) device work, no per-token Python;
    differentiable (the backward sends the gradients back).

    Parameters
    ----------
    tokens : Tensor or NestedBatch
        ``(N, *feature)``, or a batch whose packed rows are the tokens (``packed().values``).
        The same feature shape and dtype on every rank; ``N`` may differ, zero included.
    destination : Tensor
        ``(N,)`` integer, on the tokens' device: the rank of every token (an expert's id
        mapped to the rank that holds it, e.g. ``expert // experts_per_rank``).
    group : ProcessGroup, optional
        Default: the whole world. In a group of one rank nothing moves (``tokens`` come back
        as they are; ``destination`` is not read).

    Returns
    -------
    received : Tensor
        ``(M, *feature)``: the tokens sent here, by source rank, each source's in its order.
    route : TokenRoute
        For :func:`combine`, and :meth:`TokenRoute.send` to move more per-token tensors.

    Raises
    ------
    TypeError, ValueError
        On every rank, before any token moves, when a rank's ``destination`` is not ``(N,)``
        integers in ``[0, world)`` or the ranks' tokens differ in feature shape or dtype.

    Notes
    -----
    One host read of ``world`` counts per call (a sync on CUDA, of known size): the split sizes
    of the exchange.
    """
    rows = tokens.packed().values if isinstance(tokens, NestedBatch) else tokens
    error = _check_tokens(rows, destination)
    if _one_rank(group):
        if error is not None:
            raise error
        return rows, TokenRoute(None, (rows.shape[0],), (rows.shape[0],), group)
    world = dist.get_world_size(group)
    if error is None:
        # Destinations outside [0, world) counted at both ends: checked with the counts, after
        # the exchange, so there is no host read before it.
        # (int64 first: a uint8 destination would wrap -1 around)
        binned = torch.bincount(destination.long().clamp(-1, world) + 1, minlength=world + 2)
        counts, outside = binned[1:-1], binned[0] + binned[-1]
        status, feature = torch.where(outside > 0, _BAD_DESTINATION, 0), tuple(rows.shape[1:])
        row = _kind_row(0, True, 0, rows.dtype, feature)
    else:
        counts, status, feature = torch.zeros(world, dtype=torch.int64), None, ()
        row = _kind_row(_BAD_INPUT, False, 0, torch.uint8, feature)
    received, send_counts, sent_status = _exchange_kinds(counts, row, group, status)
    if error is None and sent_status == _BAD_DESTINATION:
        error = ValueError(f"destination must hold ranks of the group, in [0, {world}); "
                           f"{len(destination) - sum(send_counts)} are outside")
    _agree(received, error, "dispatch", feature)
    order = torch.argsort(destination, stable=True)
    route = TokenRoute(order, tuple(send_counts), tuple(row[_COUNT] for row in received), group)
    return route.send(rows), route


def combine(results: Tensor, route: TokenRoute) -> Tensor:
    """The results of the dispatched tokens back on the ranks they came from, in their order.

    Parameters
    ----------
    results : Tensor
        ``(M, *out_feature)``: a row per token received by :func:`dispatch`, in the received
        order (``out_feature`` may differ from the tokens' feature shape; the same on every
        rank, as the experts' outputs are: no size is exchanged here).
    route : TokenRoute
        What :func:`dispatch` returned.

    Returns
    -------
    Tensor
        ``(N, *out_feature)``: row ``i`` is the result of this rank's token ``i`` (for tokens
        given as a batch, ``batch.with_values(out)`` puts them back in it). Differentiable: the
        backward sends the gradient to the ranks that computed the rows.
    """
    return route.combine(results)
