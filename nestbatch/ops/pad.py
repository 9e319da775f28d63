"""``F.pad`` on a :class:`~nestbatch.NestedBatch`: torch's padding applied to every sample
alone, the results batched.

``F.pad(batch, pad, mode, value)`` gives, for every sample, ``F.pad(sample.unsqueeze(0), pad,
mode, value)[0]``: torch's function on the dense tensor of the batch's shape, restricted to the
sample. ``pad``'s pairs count from the last dim backwards, over the batch's logical dims, and
torch's rules on the input's rank are the batch's: ``reflect``, ``replicate`` and ``circular``
pad the last 1 / 2 / 3 dims of a batch of 2-3 / 3-4 / 4-5 dims, the leading dims being torch's
batch and channel dims, so they never reach dim 0. Every padded dim may grow or shrink
(negative padding crops):

* **feature dims**: on the packed values ``(total, *feature)``: ``constant_pad_nd`` in constant
  mode (torch's own fill, so the same conversion of ``value`` to the dtype), else one
  ``index_select`` per dim of the mirrored / clamped / wrapped positions;
* **ragged dims**: every sample grows by ``left + right`` along the dim (its sizes become the
  old ones plus both pads: on the host where the host knew them), and the new packed rows are
  gathered in one ``index_select`` by per-row source rows computed from the new partition's
  ``row_ids`` and ``positions`` (``ragged_index`` for several ragged dims): a row inside the
  sample, its mirror (``reflect``), the nearest end (``replicate``), its wrap (``circular``), or
  a row of torch's filler (``constant``). No per-sample loop;
* **dim 0** (the batch): constant padding would add whole samples, whose ragged sizes nothing
  gives: a ``ValueError`` (zero padding of dim 0 is accepted, as torch accepts it).

Errors are torch's: the arguments (pad's length and type, the mode, a ``value`` for a mode that
takes none, the rank, the feature sizes) are checked by torch's own function on a ``meta``
tensor of one sample's shape (the per-mode builtins ``reflection_pad{n}d`` /
``replication_pad{n}d``, whose meta kernels skip it, get torch's rank check here). Every sample
at least as large as a safe size along every ragged dim is accepted (one ``min`` of the host
sizes); where some sample is smaller (a crop below zero, reflect padding not below the size, an
empty dim in reflect / replicate mode), torch is run on a ``meta`` tensor of every such distinct
sample shape, in order, and its error for the first it refuses is raised (a 2-d / 3-d reflect
or replicate padding accepts a dim of empty result where another padded dim is not empty, as
torch's). A dtype torch's reflect / replicate kernel lacks (``bool``) is refused by running
torch on a tiny tensor. Circular padding whose one side crops and whose other side wraps around
more than the elements left, for a non-empty result (torch's checks let it through; its kernel
fails with an overlap error or reads uninitialized memory), raises a ``RuntimeError``.

Syncs: none where the host knows the sizes. Where only the device knows them, one read of
whether every sample reaches the safe sizes, where some sample could fail them (reflect and
replicate mode, a negative constant padding of a ragged dim, circular padding of one), and, if
one does not, one read of all sizes to find it. Several ragged dims with device sizes read the
new total. A batch of ragged rank 2 and more is refused by the registry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch, storage_dim
from nestbatch.layouts import Layout, Packed, RowPartition
from nestbatch.ops.common import REQUIRED, bind_arguments
from nestbatch.ops.registry import register

# ==================================================================================== spellings
_MODES = ("reflect", "replicate", "circular", "constant")  # (the order of torch's mode enum)


class _Spelling(NamedTuple):
    """One registered function: its parameters after the input, and its fixed mode (None: the
    call's ``mode`` argument)."""

    params: tuple
    mode: str | None = None
    converts_to_float: bool = True  # (``value`` reaches the fill as a double)
    dims: int | None = None  # (the per-mode builtins: the number of dims they pad)


def _spellings() -> dict[Callable, _Spelling]:
    """Every function that reaches ``__torch_function__`` for a padding: ``F.pad`` (a Python
    function of its own), the builtins it calls, and the per-mode builtins behind them."""
    nn = torch._C._nn
    table = {
        F.pad: _Spelling((("pad", REQUIRED), ("mode", "constant"), ("value", None))),
        nn.pad: _Spelling((("pad", REQUIRED), ("mode", "constant"), ("value", None))),
        nn._pad_enum: _Spelling((("pad", REQUIRED), ("mode", REQUIRED), ("value", None))),
        torch.constant_pad_nd: _Spelling((("pad", REQUIRED), ("value", 0)), "constant",
                                         converts_to_float=False),
        nn._pad_circular: _Spelling((("pad", REQUIRED),), "circular"),
    }
    for n in (1, 2, 3):
        for kind, mode in (("reflection", "reflect"), ("replication", "replicate")):
            table[getattr(nn, f"{kind}_pad{n}d")] = _Spelling((("padding", REQUIRED),), mode,
                                                              dims=n)
    return table


_SPELLINGS = _spellings()

#: Dtypes torch's reflect / replicate kernels take on every device; for others torch is run on
#: a tiny tensor first, to raise its error (``bool``).
_KERNEL_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                            torch.complex64, torch.complex128, torch.int8, torch.uint8,
                            torch.int16, torch.int32, torch.int64})


class _Request(NamedTuple):
    """A checked call: the mode, the fill value as torch fills it, and the non-zero pads of
    every kind of dim (``{dim: (left, right)}``: stored feature dims of the packed values,
    ragged dims ``0..k-1``)."""

    mode: str
    fill: Any
    feature: dict[int, tuple[int, int]]
    ragged: dict[int, tuple[int, int]]


@register(*_SPELLINGS, layouts=(Layout.PACKED,), moved_ragged=True)
def _pad(layout: Layout, func: Callable, args: tuple, kwargs: dict) -> NestedBatch:
    """A padding of a batch (see the module's docstring)."""
    batch = args[0]
    name = getattr(func, "__name__", "pad")
    if not isinstance(batch, NestedBatch):
        raise TypeError(f"{name} of a NestedBatch pads the batch given as its input (the first "
                        f"argument), got {type(batch).__name__} there")
    params = bind_arguments(name, (("input", REQUIRED), *_SPELLINGS[func].params), args, kwargs)
    mode = _mode(func, params)
    if mode in ("reflect", "replicate") and batch.dtype not in _KERNEL_DTYPES:
        _check_dtype(batch, mode)  # (first: torch's meta kernels raise another type)
    _check_arguments(batch, func, args, kwargs, params)
    request = _request(batch, mode, _SPELLINGS[func], params)
    _check_feature_wrap(batch, request)
    _check_sizes(batch, request, func, args, kwargs)
    return _padded_batch(batch, request)


# ==================================================================================== arguments
def _pads(params: dict) -> Sequence:
    return params["pad"] if "pad" in params else params["padding"]


def _check_arguments(batch: NestedBatch, func: Callable, args: tuple, kwargs: dict,
                     params: dict) -> None:
    """torch's checks that no size of a sample decides (the pad's type and length, the mode, a
    value, the rank, the feature sizes): torch's function on a ``meta`` tensor of one sample's
    shape with the batch dim kept, every ragged size large enough for any padding."""
    pads = _pads(params)
    ints = pads if isinstance(pads, Sequence) else ()
    room = 1 + sum(abs(p) for p in ints if isinstance(p, int))
    shape = [room if s is None else s for s in batch.sample_shape]
    n = _SPELLINGS[func].dims
    if n is not None and (batch.dim() not in (n + 1, n + 2) or len(ints) != 2 * n):
        # (torch's checks of a per-mode builtin, which its meta kernel lacks)
        raise RuntimeError(
            f"{getattr(func, '__name__', 'pad')} pads {n}-d: it takes a padding of {2 * n} ints "
            f"and a NestedBatch of {n + 1} or {n + 2} dims (its batch dim kept, as torch's "
            f"{n + 1}D or {n + 2}D (batch mode) tensor), got a padding {tuple(ints)} and "
            f"{batch.dim()} dims"
        )
    _run_on_meta(batch, func, args, kwargs, shape)


def _run_on_meta(batch: NestedBatch, func: Callable, args: tuple, kwargs: dict,
                 sample: Sequence[int]) -> None:
    """``func`` with the call's arguments on a ``meta`` tensor ``(1, *sample)``: raises what
    torch raises for such a sample (and costs no memory, no launch)."""
    probe = torch.empty((1, *sample), dtype=batch.dtype, device="meta")
    func(probe, *args[1:], **kwargs)


def _mode(func: Callable, params: dict) -> Any:
    """The call's mode as a string (as given where it is no mode: torch's check refuses it)."""
    mode = _SPELLINGS[func].mode or params["mode"]
    if type(mode) is int and 0 <= mode < len(_MODES):  # (``_pad_enum``'s int)
        return _MODES[mode]
    return mode


def _request(batch: NestedBatch, mode: str, spelling: _Spelling, params: dict) -> _Request:
    """The checked call's fill and pads of every dim.

    Raises
    ------
    ValueError
        For a non-zero padding of dim 0 (the batch).
    """
    value = params.get("value")
    if spelling.converts_to_float:
        value = 0.0 if value is None else float(value)  # (F.pad's value is a double)
    pads = [int(p) for p in _pads(params)]
    feature: dict[int, tuple[int, int]] = {}
    ragged: dict[int, tuple[int, int]] = {}
    for i in range(len(pads) // 2):
        dim, pair = batch.dim() - 1 - i, (pads[2 * i], pads[2 * i + 1])
        if pair == (0, 0):
            continue
        kind, stored = storage_dim(batch, dim)
        if kind == "feature":
            feature[stored] = pair
        elif kind == "ragged":
            ragged[stored - 1] = pair
        else:
            raise ValueError(
                f"padding dim 0 (the batch) of a NestedBatch by {pair}: it would add or remove "
                "whole samples, whose ragged sizes nothing gives; pad the samples' dims only "
                "(pad of length at most 2 * (batch.dim() - 1)), or use torch.cat / indexing "
                "to add or drop samples"
            )
    return _Request(mode, value, feature, ragged)


def _check_dtype(batch: NestedBatch, mode: str) -> None:
    """torch's error for a dtype its ``mode`` kernel lacks on the batch's device: torch's
    padding of a tiny tensor."""
    F.pad(torch.zeros(1, 1, 2, dtype=batch.dtype, device=batch.device), (1, 1), mode)


# ======================================================================================= sizes
def _safe_size(pair: tuple[int, int] | None, mode: str) -> int:
    """A size of a ragged dim from which on torch accepts ``mode``'s padding by ``pair`` (None:
    not padded) in every sample (what torch does below it, its own check of the sample says:
    the 2-d / 3-d kernels want one padded dim of a non-empty result, not each)."""
    left, right = pair or (0, 0)
    cropped = max(-left, 0) + max(-right, 0)
    if mode == "constant":  # (torch crops first, by both negative pads)
        return cropped
    if mode == "reflect":  # (no empty dim; pads below the size; a non-empty result)
        return max(1, left + 1, right + 1, 1 - left - right)
    if mode == "replicate":
        return max(1, 1 - left - right)
    return max(left, right, -(left + right), cropped + max(left, right, 0))  # (see _wraps)


def _wraps_past_the_crop(size: int, pair: tuple[int, int]) -> bool:
    """Whether circular padding by ``pair`` crops one side of a dim of ``size`` and wraps the
    other around more than the elements left, for a non-empty result: torch's checks let it
    through, and its kernel then fails with an overlap error or reads uninitialized memory."""
    left, right = pair
    kept = size - max(-left, 0) - max(-right, 0)
    return max(left, right) > kept and size + left + right != 0


def _check_sizes(batch: NestedBatch, request: _Request, func: Callable, args: tuple,
                 kwargs: dict) -> None:
    """Raise torch's error for the first sample torch refuses (where some sample could be):
    torch's function on a ``meta`` tensor of every distinct shape below the safe sizes."""
    partition = batch.partition
    safe = [_safe_size(request.ragged.get(d), request.mode)
            for d in range(batch.num_ragged_dims)]
    if batch.batch_size == 0 or max(safe) <= 0 or _all_at_least(partition, safe):
        return
    seen = set()
    for shape in partition.host_shapes:  # (reads device sizes once: an error is likely)
        if shape in seen or all(n >= m for n, m in zip(shape, safe)):
            continue
        seen.add(shape)
        sizes = iter(shape)
        _run_on_meta(batch, func, args, kwargs,
                     [next(sizes) if s is None else s for s in batch.sample_shape])
        if request.mode == "circular" and any(
                _wraps_past_the_crop(shape[d], pair) for d, pair in request.ragged.items()):
            raise _wrap_error(request.ragged, shape)


def _all_at_least(partition: RowPartition, least: list[int]) -> bool:
    """Whether every sample's size along every ragged dim ``d`` is at least ``least[d]``: on
    the host where it knows the sizes, else one read of the device."""
    if partition.knows_host_shapes and partition.num_ragged_dims == 1:
        return min(partition.host_lengths) >= least[0]  # (C speed: the common case)
    if partition.knows_host_shapes:
        return all(min(sizes) >= m for sizes, m in zip(zip(*partition.host_shapes), least))
    shapes = partition.shape_per_sample
    return bool((shapes >= torch.tensor(least, device=shapes.device)).all())


def _check_feature_wrap(batch: NestedBatch, request: _Request) -> None:
    """Refuse a circular padding of a feature dim that crops one side and wraps the other
    around more than the elements left (:func:`_wraps_past_the_crop`)."""
    if request.mode != "circular":
        return
    for dim, pair in request.feature.items():
        size = batch.feature_shape[dim - 1]
        if _wraps_past_the_crop(size, pair):
            raise _wrap_error({dim: pair}, (size,))


def _wrap_error(pads: dict[int, tuple[int, int]], sizes: Sequence[int]) -> RuntimeError:
    return RuntimeError(
        f"circular padding {dict(pads)} ({{dim: (left, right)}}, stored dims) of a NestedBatch "
        f"where a dim has size {tuple(sizes)}: after the crop on one side, the other side would "
        "wrap around more than the elements left (torch's kernel refuses this with an overlap "
        "error, or reads uninitialized memory)"
    )


# ===================================================================================== padding
def _padded_batch(batch: NestedBatch, request: _Request) -> NestedBatch:
    """``batch`` padded as ``request`` says (its sizes checked): feature dims on the packed
    values, ragged dims by one gather of the packed rows.

    Parameters
    ----------
    batch : NestedBatch
        ``B`` samples ``(*ragged_i, *feature)`` stored, values ``(total, *feature)``.
    request : _Request
        The mode, the fill and the non-zero pads.

    Returns
    -------
    NestedBatch
        Samples grown by ``left + right`` along every padded dim, the ragged dim where
        ``batch`` presents it.
    """
    values = batch.packed().values
    if request.feature:
        values = _pad_features(values, request)
    if not request.ragged:
        if not request.feature:
            values = values.clone()  # (torch's pad returns a copy, never the input)
        return batch.with_values(values)
    old = batch.partition
    new = _grown(old, request.ragged, batch.packed().values.shape[0])
    source, filler = _source_rows(old, new, request.ragged, request.mode)
    if filler is not None:
        # torch's own fill (its conversion of the value, and its error): of one element, as
        # torch's pad of an empty tensor converts no value.
        row = torch.constant_pad_nd(values.new_empty((1,)), (1, 0), request.fill)[:1]
        values = torch.cat([values, row.expand(1, *values.shape[1:])])
        source = torch.where(filler, values.shape[0] - 1, source)
    out = values.index_select(0, source)
    # (Trusted: rows gathered for a partition of the grown samples of a valid batch.)
    return NestedBatch.trusted(Packed.trusted(out, new), batch.ragged_dim)


def _pad_features(values: Tensor, request: _Request) -> Tensor:
    """The packed values ``(total, *feature)`` padded along their feature dims."""
    if request.mode == "constant":
        last = values.dim() - 1
        flat = [0] * 2 * (last - min(request.feature) + 1)
        for dim, (left, right) in request.feature.items():
            flat[2 * (last - dim)], flat[2 * (last - dim) + 1] = left, right
        return torch.constant_pad_nd(values, flat, request.fill)
    for dim, (left, right) in request.feature.items():
        size = values.shape[dim]
        offset = torch.arange(size + left + right, device=values.device) - left
        values = values.index_select(dim, _source(offset, size, left, right, request.mode))
    return values


def _source(offset: Tensor, size: Tensor | int, left: int, right: int, mode: str) -> Tensor:
    """The position in the old dim that every new position reads in a non-constant ``mode``
    (torch's kernels' index arithmetic; constant: ``offset`` itself).

    Parameters
    ----------
    offset : Tensor
        ``(n,)`` int64: every new position less ``left`` (its place relative to the old start).
    size : Tensor or int
        The old size: ``(n,)`` (the sample of every position) or one int.
    """
    if mode == "reflect":  # (a pad below the size: one reflection at most)
        return torch.where(offset < 0, -offset,
                           torch.where(offset >= size, 2 * (size - 1) - offset, offset))
    if mode == "replicate":
        return torch.where(offset >= size, size - 1, offset.clamp(min=0))
    if mode == "circular":  # (torch wraps around what the crops leave)
        crop_left = max(-left, 0)
        kept = size - crop_left - max(-right, 0)
        kept = kept.clamp(min=1) if isinstance(kept, Tensor) else max(kept, 1)
        return crop_left + torch.remainder(offset - crop_left, kept)
    return offset


def _grown(old: RowPartition, ragged: dict[int, tuple[int, int]], total: int) -> RowPartition:
    """``old`` (``total`` rows) with every sample's size along ragged dim ``d`` grown by
    ``left + right``: on the host where the host knows the sizes."""
    k, device = old.num_ragged_dims, old.device
    growth = [sum(ragged.get(d, (0, 0))) for d in range(k)]
    if k == 1:
        if old.knows_host_shapes:
            new = RowPartition.from_host_lengths([n + growth[0] for n in old.host_lengths],
                                                 device)
        else:
            new = RowPartition.from_lengths(old.lengths + growth[0])
        new.note_total(total + old.batch_size * growth[0])  # (no read of the device sizes)
        return new
    if old.knows_host_shapes:
        host = tuple(tuple(n + g for n, g in zip(s, growth)) for s in old.host_shapes)
        return RowPartition.from_host_shapes(host, k, device)
    return RowPartition.from_shapes(old.shape_per_sample + torch.tensor(growth, device=device))


def _source_rows(old: RowPartition, new: RowPartition, ragged: dict[int, tuple[int, int]],
                 mode: str) -> tuple[Tensor, Tensor | None]:
    """The old packed row every new packed row reads, and (constant mode, where a sample
    grows) which new rows are filler instead.

    A sample's rows are its ragged dims flattened row-major, so a row's place is the sample's
    offset plus its multi-index times the old strides; along a padded dim the index is mapped
    back by :func:`_source`.
    """
    sample = new.row_ids
    if old.num_ragged_dims == 1:
        index, sizes, strides = new.ragged_index, (old.lengths[sample],), (1,)
    else:
        shapes = old.shape_per_sample[sample]
        index, sizes = new.ragged_index, shapes.unbind(1)
        strides = [shapes[:, d + 1:].prod(1) for d in range(old.num_ragged_dims)]
    source = old.offsets[:-1][sample]
    filler = None
    for d, (at, size, stride) in enumerate(zip(index, sizes, strides)):
        if d in ragged:
            left, right = ragged[d]
            offset = at - left
            at = _source(offset, size, left, right, mode)
            if mode == "constant" and max(left, right) > 0:
                outside = (offset < 0) | (offset >= size)
                filler = outside if filler is None else filler | outside
        source = source + at * stride
    return source, filler
