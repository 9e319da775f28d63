"""nn layers on the packed values: Linear, LayerNorm / RMSNorm, Dropout, activations, Embedding.

These act on the feature dims only, so they run on the packed values ``(total, *feature)``: no
compute is spent on padding, and ``nn.Linear(...)(x)``, ``nn.LayerNorm(...)(x)``,
``nn.GELU()(x)``, ``nn.Embedding(...)(ids)`` work on a batch unchanged (the modules call these
functionals). ``inplace=True`` writes into the batch's stored layout (see
:func:`nestbatch.ops.common.replace_storage`).

With the ragged dim moved (:attr:`~nestbatch.NestedBatch.ragged_dim`), the dims these act on must
still be feature dims: ``linear`` needs a feature last dim, ``layer_norm`` / ``rms_norm`` need
the normalized trailing dims to come after the ragged dim; otherwise a ``ValueError`` says to
transpose the ragged dim back first.

The rest of the module's functions read a sample as torch reads a tensor, so their dims may
include the ragged one: channel dropouts (every sample's draws, on the packed rows or the padded
samples), ``batch_norm`` / ``group_norm`` / ``instance_norm`` of ``(B, C, j)`` batches (all the
samples' elements, or every sample's own), ``cosine_similarity`` / ``pairwise_distance`` (over
the ragged dim one value per sample).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import (
    NestedBatch,
    after_stored_write,
    moved_ragged_error,
    stored_layout,
    with_ragged_dim,
)
from nestbatch.layouts import Layout, Packed
from nestbatch.ops.common import (
    REQUIRED,
    argument,
    bind_arguments,
    dim_kind,
    feature_values_dim,
    normalize_dim,
    replace_storage,
    values_dim,
    wrap_padded,
)
from nestbatch.ops.registry import register
from nestbatch.ops.segment import WIDENED_DTYPES, segment_reduce

_ACTIVATIONS = (
    "relu", "relu6", "elu", "selu", "celu", "leaky_relu", "gelu", "silu", "mish", "softplus",
    "softsign", "hardtanh", "hardswish", "hardsigmoid", "logsigmoid", "tanhshrink",
    "softshrink", "hardshrink", "threshold", "rrelu", "sigmoid", "tanh", "dropout",
    "alpha_dropout",
)


#: The ``torch.*`` spellings of activations (without ``F``'s ``inplace`` argument).
_TORCH_ACTIVATIONS = ("celu", "selu", "threshold", "rrelu", "dropout", "alpha_dropout")


#: ``F``'s in-place spellings, each with the function it is with ``inplace=True``.
_INPLACE_SPELLINGS = {F.relu_: F.relu, F.elu_: F.elu, F.leaky_relu_: F.leaky_relu,
                      F.hardtanh_: F.hardtanh, F.threshold_: F.threshold, F.rrelu_: F.rrelu,
                      F.celu_: F.celu, F.selu_: F.selu}


@register(*(getattr(F, name) for name in _ACTIVATIONS),
          *(getattr(torch, name) for name in _TORCH_ACTIVATIONS), *_INPLACE_SPELLINGS,
          layouts=(Layout.PACKED,), moved_ragged=True)
def _on_values(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """Activations and dropout: ``func`` of the packed values (``inplace`` honoured: torch's
    in-place kernel on stored packed rows, else the result written into the stored layout)."""
    batch = args[0]
    inplace = bool(kwargs.pop("inplace", False))
    if func in _INPLACE_SPELLINGS:
        func, inplace = _INPLACE_SPELLINGS[func], True
    if func in (F.dropout, F.alpha_dropout) and len(args) > 3:
        inplace, args = bool(args[3]), args[:3]
    elif func in (F.relu, F.relu6, F.selu, F.silu, F.mish, F.hardswish, F.hardsigmoid,
                  F.elu, F.celu, F.leaky_relu, F.hardtanh, F.threshold) and \
            len(args) > 1 and isinstance(args[-1], bool):
        inplace, args = args[-1], args[:-1]
    if not inplace:
        return batch.with_values(func(batch.values, *args[1:], **kwargs))
    stored = stored_layout(batch)
    if isinstance(stored, Packed):
        # torch's in-place kernel on the stored rows: its autograd keeps what its backward
        # needs (an out-of-place result copied over its own input would invalidate that input,
        # which the backward of silu, elu, ... reads).
        func(stored.values, *args[1:], inplace=True, **kwargs)
        after_stored_write(batch)
        return batch
    # Computed on a copy of the rows (the cached rows are rewritten by the write below, and the
    # op's backward may read its input), then written into the stored layout.
    result = batch.with_values(func(batch.values.clone(), *args[1:], **kwargs))
    return replace_storage(batch, result)


#: Dropouts that draw once per channel (dims 0 and 1 of their input) and share the draw
#: along the dims after: ``F``'s, each with the default of its ``training`` argument, and
#: torch's (``train`` required), the in-place ones with their out-of-place function.
_CHANNEL_DROPOUTS = {F.dropout1d: True, F.dropout2d: True, F.dropout3d: True,
                     F.feature_alpha_dropout: False}
_TORCH_CHANNEL_DROPOUTS = {torch.feature_dropout: torch.feature_dropout,
                           torch.feature_alpha_dropout: torch.feature_alpha_dropout,
                           torch.feature_dropout_: torch.feature_dropout,
                           torch.feature_alpha_dropout_: torch.feature_alpha_dropout}


@register(*_CHANNEL_DROPOUTS, *_TORCH_CHANNEL_DROPOUTS, layouts=(Layout.PACKED,),
          moved_ragged=True)
def _channel_dropout(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``dropout1d`` / ``2d`` / ``3d``, ``feature_dropout``, ``feature_alpha_dropout``: torch's
    draws for every sample alone (as ``prelu`` reads channels: dim 1 of each sample), one per
    channel of the sample, or per (sample dim 0, channel) where torch takes the sample as a
    batch of its own (``dropout1d`` of 3-d samples, ``dropout2d``, ``dropout3d`` of 5-d ones,
    ``feature_*``). torch's checks of ``p`` and of a sample's number of dims (and its warnings)
    run on an empty tensor of a sample's rank first.

    With the one ragged dim first in every sample, the packed rows ``(total, *feature)`` are
    the samples stacked along their dim 0, of a sample's rank: torch's call on them draws
    exactly so (no padding). Otherwise the padded samples ``(B, *sample)`` are stacked along
    the batch dim (dims 0 and 1 merged where torch takes a sample as batched), and the
    padding's draws are dropped with it."""
    batch = args[0]
    call, training, inplace = _channel_call(func, args[1:], kwargs)
    rank = batch.dim() - 1  # (a sample's)
    call(torch.empty((0,) * rank, dtype=batch.dtype, device=batch.device), False)
    if not training:
        return batch
    if batch.num_ragged_dims == 1 and batch.ragged_dim == 1:
        stored = stored_layout(batch)
        if inplace and isinstance(stored, Packed):  # (torch's in-place kernel on the rows)
            call(stored.values, True)
            after_stored_write(batch)
            return batch
        result = batch.with_values(call(batch.values, False))
    else:
        padded = batch.padded(0.0).data
        dense = padded.movedim(1, batch.ragged_dim) if batch.num_ragged_dims == 1 else padded
        if _sample_is_batched(func, rank):
            out = call(dense.flatten(0, 1), False).unflatten(0, dense.shape[:2])
        else:
            out = call(dense, False)
        if batch.num_ragged_dims == 1:
            out = out.movedim(batch.ragged_dim, 1)
        result = wrap_padded(out, batch.partition, batch.ragged_dim)
    return replace_storage(batch, result) if inplace else result


def _channel_call(func: Any, rest: tuple, kwargs: dict) -> tuple[Any, bool, bool]:
    """``call(dense, in_place)``, the channel dropout's call on a dense tensor; whether it
    trains; and whether it was asked in place."""
    if func in _CHANNEL_DROPOUTS:
        given = dict(zip(("p", "training", "inplace"), rest), **kwargs)
        inplace = bool(given.pop("inplace", False))
        training = bool(given.get("training", _CHANNEL_DROPOUTS[func]))
        return lambda dense, in_place: func(dense, inplace=in_place, **given), training, inplace
    train = rest[1] if len(rest) > 1 else kwargs.get("train")
    out_of_place = _TORCH_CHANNEL_DROPOUTS[func]
    in_place_func = getattr(torch, out_of_place.__name__ + "_")

    def call(dense: Tensor, in_place: bool) -> Tensor:
        return (in_place_func if in_place else out_of_place)(dense, *rest, **kwargs)

    return call, bool(train), func is not out_of_place


def _sample_is_batched(func: Any, rank: int) -> bool:
    """Whether torch takes a sample of ``rank`` dims as a batch of its own (its dim 0 the
    batch, dim 1 the channels), drawing per (dim 0, dim 1): ``dropout1d`` of 3 dims,
    ``dropout3d`` of 5; ``dropout2d`` and the ``feature_*`` functions always (torch's rule)."""
    if func is F.dropout1d:
        return rank == 3
    if func is F.dropout3d:
        return rank == 5
    return True


@register(torch.native_dropout, layouts=(Layout.PACKED,), moved_ragged=True)
def _native_dropout(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.native_dropout``: the output and the keep-mask, each a batch of this structure
    (one draw per element: on the packed values)."""
    batch = args[0]
    output, mask = func(batch.values, *args[1:], **kwargs)
    return batch.with_values(output), batch.with_values(mask)


@register(F.prelu, layouts=(Layout.PACKED,), moved_ragged=True)
def _prelu(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.prelu`` / ``nn.PReLU``: one weight for every element, or one per channel, which is
    dim 1 of each sample as torch's (dim 2 of the batch; it must be a feature dim)."""
    batch = args[0]
    weight = args[1] if len(args) > 1 else kwargs["weight"]
    stored = 1
    if isinstance(weight, Tensor) and weight.numel() > 1 and batch.dim() > 2:
        if dim_kind(batch, 2) != "feature":
            raise ValueError(
                f"prelu with {weight.numel()} weights applies them along dim 1 of each sample "
                f"(torch's channel dim), which is ragged in this batch of shape {batch.shape}; "
                "put the channels in dim 2 of the batch, or pass one weight"
            )
        stored = values_dim(batch, 2)
    # (A 1-d sample has one channel: torch refuses more weights, and so does F.prelu here.)
    values = batch.values.movedim(stored, 1) if stored != 1 else batch.values
    out = F.prelu(values, weight)
    return batch.with_values(out.movedim(1, stored) if stored != 1 else out)


@register(F.glu, F.normalize, layouts=(Layout.PACKED,), moved_ragged=True)
def _along_feature_dim(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``glu`` / ``normalize`` along a feature dim (the ragged dims and the batch are refused)."""
    batch = args[0]
    position, default = (1, -1) if func is F.glu else (2, 1)
    if len(args) > position:
        dim, args = args[position], args[:position] + args[position + 1 :]
    else:
        dim = kwargs.pop("dim", default)
    if func is F.normalize and (not isinstance(dim, int) or dim_kind(
            batch, normalize_dim(batch, dim)) == "ragged"):
        return _normalize(batch, dim, *args[1:], **kwargs)
    stored = feature_values_dim(batch, dim, func.__name__)
    return batch.with_values(func(batch.values, *args[1:], dim=stored, **kwargs))


def _normalize(batch: NestedBatch, dim: Any, p: float = 2.0, eps: float = 1e-12,
               out: None = None) -> NestedBatch:
    """``F.normalize`` over the ragged dim or several dims, as torch's: the batch over its
    norm there (``torch.linalg.vector_norm``, kept dims), clamped below at ``eps`` (``out=``
    is refused by the registry: no tensor holds a ragged result)."""
    rd = batch.ragged_dim
    if rd != 1:
        # The norm, kept dims, is dense: it broadcasts back over the samples with the ragged
        # dim at dim 1 (TF's rule), so the batch goes there and back (two views).
        swap = {1: rd, rd: 1}
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        moved = tuple(swap.get(normalize_dim(batch, d), normalize_dim(batch, d)) for d in dims)
        return _normalize(batch.transpose(1, rd), moved, p, eps).transpose(1, rd)
    return batch / torch.linalg.vector_norm(batch, p, dim, keepdim=True).clamp_min(eps)


@register(torch.cosine_similarity, layouts=(Layout.PACKED,), moved_ragged=True)
def _cosine_similarity(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.cosine_similarity(x1, x2, dim=1, eps=1e-8)`` as torch composes it: the operands
    broadcast, each over its 2-norm along ``dim`` (clamped below at ``eps`` outside autograd),
    the product summed along ``dim`` — over a feature dim a batch, over the ragged dim one
    value per sample (``(B, *feature)``)."""
    x1, x2, dim, eps = bind_arguments(
        "cosine_similarity", (("x1", REQUIRED), ("x2", REQUIRED), ("dim", 1), ("eps", 1e-8)),
        args, kwargs).values()
    batch = x1 if isinstance(x1, NestedBatch) else x2
    moved = batch.ragged_dim
    if moved != 1 and isinstance(dim, int) and normalize_dim(batch, dim) == moved:
        # Over a moved ragged dim: the norms (one per sample and feature) broadcast back over
        # the samples only with the ragged dim at dim 1, so the operands go there and the
        # result's dims back (dense operands of fewer dims span dims after it: unmoved).
        there = [x.transpose(1, moved) if x.dim() == batch.dim() else x for x in (x1, x2)]
        return _cosine_similarity(layout, func, (*there, 1, eps), {}).movedim(moved - 1, 1)
    if any(isinstance(x, Tensor) and x.dim() == 0 for x in (x1, x2)):
        # (a 0-d tensor ranks below a batch, as below any tensor with dims: torch's rule; a
        # batch stands as a 1-d tensor of its dtype)
        common = torch.result_type(*(torch.empty(1, dtype=x.dtype, device=x.device)
                                     if isinstance(x, NestedBatch) else x for x in (x1, x2)))
    else:  # (what torch.compile traces: result_type of a batch it cannot)
        common = torch.promote_types(x1.dtype, x2.dtype)
    if not common.is_floating_point:
        raise RuntimeError(
            f"expected common dtype to be floating point, yet common dtype is {common}")
    # (integers and bools are cast, as torch's: vector_norm takes neither)
    x1, x2 = (x if x.dtype.is_floating_point or x.dtype.is_complex else x.to(common)
              for x in (x1, x2))
    x1, x2 = torch.broadcast_tensors(x1, x2)
    # Cloned, then clamped in place outside autograd: torch's (the norm's backward reads it)
    norms = [torch.linalg.vector_norm(x, 2, dim=dim, keepdim=True).clone() for x in (x1, x2)]
    with torch.no_grad():
        for norm in norms:
            norm.clamp_min_(eps)
    return ((x1 / norms[0]) * (x2 / norms[1])).sum(dim)


@register(F.pairwise_distance, torch.pairwise_distance, layouts=(Layout.PACKED,),
          moved_ragged=True)
def _pairwise_distance(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.pairwise_distance(x1, x2, p=2, eps=1e-6, keepdim=False)`` as torch composes it:
    the ``p``-norm of ``x1 - x2 + eps`` along the last dim of the two (a batch over feature
    dims; one value per sample when the last dim is ragged)."""
    x1, x2, p, eps, keepdim = bind_arguments(
        "pairwise_distance", (("x1", REQUIRED), ("x2", REQUIRED), ("p", 2.0), ("eps", 1e-6),
                              ("keepdim", False)), args, kwargs).values()
    last = max(x1.dim(), x2.dim()) - 1
    return torch.norm(x1 - x2 + eps, p, last, keepdim)




@register(F.batch_norm, layouts=(Layout.PACKED,), moved_ragged=True)
def _batch_norm(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.batch_norm`` (``nn.BatchNorm1d`` / ``2d`` / ``3d``) of a batch whose dim 1 holds the
    channels and whose ragged dim is a spatial one (``(B, C, j)``, from ``x.transpose(1, 2)`` of
    a ``(B, j, C)`` batch): torch's batch norm of the packed rows ``(total, C, ...)``, so every
    channel's statistics (and the running ones, with their count) are over every element of
    every sample, padding excluded, as torch's of all the samples' elements together."""
    batch = _channels_first(args[0], "batch_norm")
    return batch.with_values(func(batch.values, *args[1:], **kwargs))


def _channels_first(batch: NestedBatch, name: str) -> NestedBatch:
    """``batch`` if its dim 1 (torch's channels) is a feature dim and its one ragged dim a
    spatial dim after it (``(B, C, j)``), else the ``ValueError`` of the norms."""
    if batch.num_ragged_dims != 1 or batch.ragged_dim < 2:
        raise ValueError(
            f"{name} of a NestedBatch of shape {tuple(batch.shape)}: its dim 1 (the "
            "channels) must be a feature dim and its one ragged dim a spatial dim after it; "
            "for (B, j, C) samples, normalize x.transpose(1, 2)")
    return batch


@register(F.instance_norm, F.group_norm, layouts=(Layout.PACKED,), moved_ragged=True)
def _per_sample_norm(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.instance_norm`` / ``F.group_norm`` (their ``nn`` modules too) of a batch with the
    channels at dim 1 and a ragged spatial dim (``(B, C, j)``): every sample normalized over
    its own elements, per channel / per group of channels, as torch normalizes each sample
    (biased variance, ``eps`` inside the root, then the per-channel affine). Composed of the
    batch's reductions over its ragged and feature dims, so the last bits can differ from
    torch's fused kernel. ``instance_norm``'s running statistics are updated as torch's: the
    mean over the samples of each one's mean and unbiased variance (of its own count)."""
    batch = _channels_first(args[0], func.__name__)
    rows = with_ragged_dim(batch, 1)  # (B, j, C, *rest): the stored order, channels a feature
    _check_sample_counts(func, rows, args, kwargs)
    if func is F.group_norm:
        _, groups, weight, bias, eps = bind_arguments(
            "group_norm", (("input", REQUIRED), ("num_groups", REQUIRED), ("weight", None),
                           ("bias", None), ("eps", 1e-5)), args, kwargs).values()
        normalized = _normalized_groups(rows, groups, eps, None)
    else:
        _, mean, var, weight, bias, use_input_stats, momentum, eps = bind_arguments(
            "instance_norm", (("input", REQUIRED), ("running_mean", None),
                              ("running_var", None), ("weight", None), ("bias", None),
                              ("use_input_stats", True), ("momentum", 0.1), ("eps", 1e-5)),
            args, kwargs).values()
        if use_input_stats:
            normalized = _normalized_groups(rows, rows.size(2), eps, (mean, var, momentum))
        else:
            normalized = (rows - _channels(mean, rows)) / torch.sqrt(_channels(var, rows) + eps)
    return with_ragged_dim(_affine(normalized, weight, bias), batch.ragged_dim)


def _check_sample_counts(func: Any, rows: NestedBatch, args: tuple, kwargs: dict) -> None:
    """torch's refusal of a sample too small to normalize (its ``ValueError``, for the first
    such sample): ``instance_norm`` with input statistics needs more than one spatial element,
    ``group_norm`` more than one value. Reads the lengths where only the device has them (the
    shortest first: one sync)."""
    if func is F.instance_norm and not argument(args, kwargs, 5, "use_input_stats", True):
        return
    per_row = math.prod(rows.feature_shape[1:]) * (rows.size(2) if func is F.group_norm else 1)
    partition = rows.partition
    if rows.batch_size == 0 or (not partition.knows_host_shapes
                                and int(partition.lengths.min()) * per_row > 1):
        return
    small = next((n for n in partition.host_lengths if n * per_row <= 1), None)
    if small is not None:
        size = torch.Size([1, rows.size(2), small, *rows.feature_shape[1:]])
        what = "spatial element" if func is F.instance_norm else "value per channel"
        raise ValueError(f"Expected more than 1 {what} when training, got input size {size}")


def _normalized_groups(rows: NestedBatch, groups: int, eps: float,
                       stats: tuple | None) -> NestedBatch:
    """``(x - mean) / sqrt(var + eps)`` of every sample and group of ``C / groups`` channels
    of ``rows`` ``(B, j, C, *rest)``, the statistics over the group's channels and every
    spatial element of the sample."""
    channels = rows.size(2)
    if groups < 1 or channels % groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by "
                           f"num_groups, but got {channels} channels and num_groups={groups}")
    grouped = rows.unflatten(2, (groups, channels // groups))
    dims = (1, *range(3, grouped.dim()))  # (the ragged dim, the group's channels, the rest)
    mean = grouped.mean(dim=dims, keepdim=True)  # (B, 1, G, 1, ...): one per sample, group
    centered = grouped - mean
    var = (centered * centered).mean(dim=dims, keepdim=True)
    if stats is not None:
        _update_running(stats, mean, var, rows)
    return (centered / torch.sqrt(var + eps)).flatten(2, 3)


def _update_running(stats: tuple, mean: Tensor, var: Tensor, rows: NestedBatch) -> None:
    """``instance_norm``'s running statistics, as torch's: ``(1 - momentum)`` of them plus
    ``momentum`` times the mean over the samples of every sample's mean and unbiased variance
    (each sample's count its own)."""
    running_mean, running_var, momentum = stats
    if running_mean is None and running_var is None:
        return
    count = rows.lengths.to(var.dtype) * math.prod(rows.feature_shape[1:])
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(momentum * mean.flatten(1).mean(0))
        if running_var is not None:
            unbiased = var.flatten(1) * (count / (count - 1)).unsqueeze(1)
            running_var.mul_(1 - momentum).add_(momentum * unbiased.mean(0))


def _channels(value: Tensor | None, rows: NestedBatch) -> Tensor | None:
    """A per-channel ``(C,)`` tensor viewed to broadcast over the channels, dim 2 of ``rows``
    ``(B, j, C, *rest)``."""
    if value is None:
        return None
    return value.view(-1, *[1] * (rows.dim() - 3))


def _affine(rows: NestedBatch, weight: Tensor | None, bias: Tensor | None) -> NestedBatch:
    """``rows * weight + bias`` per channel, as torch's norms end."""
    if weight is not None:
        rows = rows * _channels(weight, rows)
    if bias is not None:
        rows = rows + _channels(bias, rows)
    return rows


@register(F.linear, layouts=(Layout.PACKED,), moved_ragged=True)
def _linear(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.linear`` / ``nn.Linear`` on the packed values ``(total, *feature, in)``."""
    batch = args[0]
    if not batch.feature_shape:
        raise ValueError(
            "linear needs a feature dim: the batch's samples have only ragged dims "
            f"(feature shape {tuple(batch.feature_shape)})"
        )
    if dim_kind(batch, batch.dim() - 1) != "feature":
        raise moved_ragged_error(batch, "linear", "it contracts the last dim, which is ragged")
    return batch.with_values(F.linear(batch.values, *args[1:], **kwargs))


@register(F.layer_norm, F.rms_norm, layouts=(Layout.PACKED,), moved_ragged=True)
def _norm(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.layer_norm`` / ``F.rms_norm`` over trailing feature dims, or over whole samples
    (``normalized_shape=b.shape[1:]``, the ragged dims included, as torch.nested's)."""
    batch = args[0]
    shape = args[1] if len(args) > 1 else kwargs["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(shape) >= batch.dim():
        raise ValueError(
            f"{func.__name__}: normalized_shape={shape} covers the batch dim of a batch of "
            f"shape {batch.shape}; a sample is normalized at most over all its dims"
        )
    if len(shape) > len(batch.feature_shape):
        return _norm_samples(batch, func, shape, *args[2:], **kwargs)
    if any(dim_kind(batch, batch.dim() - 1 - i) != "feature" for i in range(len(shape))):
        raise moved_ragged_error(
            batch, func.__name__, f"normalized_shape={shape} covers the ragged dim"
        )
    return batch.with_values(func(batch.values, *args[1:], **kwargs))


def _norm_samples(batch: NestedBatch, func: Any, shape: tuple, weight: Tensor | None = None,
                  bias: Tensor | None = None, eps: float | None = None, **kwargs: Any) -> Any:
    """Normalize every sample over all its elements (layer norm: centered, biased variance).

    On the packed rows: segment sums (of squares; for layer norm also of the values and of the
    centered squares) and a gather of the per-sample statistics by row (the row ids need the
    total number of rows, read once if only the device knows it). In half precision in float32,
    as torch computes. Where the squares overflow, the result follows torch's ``E[x^2] -
    E[x]^2`` (NaN, or 0); one case still differs: torch also gives NaN when the sum of a
    sample's values is near the dtype's maximum (``[3e38, -3e38]``), where this gives 0.
    """
    kwargs.pop("normalized_shape", None)
    weight, bias = kwargs.pop("weight", weight), kwargs.pop("bias", bias)
    eps = kwargs.pop("eps", eps)
    if shape != tuple(batch.shape[1:]) or batch.ragged_dim != 1:
        raise ValueError(
            f"{func.__name__}: normalized_shape={shape} must be the feature dims or all the "
            f"dims of a sample (batch.shape[1:] = {batch.shape[1:]}, with this batch's own "
            "ragged sizes)"
        )
    if weight is not None or (func is F.layer_norm and bias is not None):
        raise ValueError(
            f"{func.__name__} over the ragged dim takes no weight or bias (their shape would "
            "be the ragged size); apply them to the result"
        )
    values = batch.values
    if not values.dtype.is_floating_point:  # (torch's kernels have none for other dtypes)
        raise NotImplementedError(f'"{func.__name__}" not implemented for {values.dtype}')
    rows = values.reshape(values.shape[0], math.prod(values.shape[1:]))  # (no -1: 0 rows)
    wide = rows.to(WIDENED_DTYPES.get(rows.dtype, rows.dtype))  # half precision: in float32
    if eps is None:  # torch's defaults; rms_norm's is its compute dtype's epsilon
        eps = 1e-5 if func is F.layer_norm else torch.finfo(wide.dtype).eps
    count = (batch.lengths * rows.shape[1]).to(wide.dtype)
    row_ids = batch.row_ids
    squares = segment_reduce(wide.square().sum(-1), batch, "sum") / count
    if func is F.layer_norm:
        mean = segment_reduce(wide.sum(-1), batch, "sum") / count
        wide = wide - mean[row_ids, None]
        variance = segment_reduce(wide.square().sum(-1), batch, "sum") / count
        # torch's kernel takes E[x^2] - E[x]^2: where E[x^2] overflows, so does its variance
        # (inf, or NaN when E[x]^2 does too), and its result (0, or NaN): so does this one.
        variance = torch.where(squares.isinf(), squares - mean.square(), variance)
    else:
        variance = squares  # (rms_norm: the mean square)
    out = wide * torch.rsqrt(variance + eps)[row_ids, None]
    if func is F.layer_norm:
        out = out + 0.0  # torch's kernel adds its (zero) bias last: it never returns -0.0
    return batch.with_values(out.to(values.dtype).reshape(values.shape))


@register(F.embedding, layouts=(Layout.PACKED,), moved_ragged=True)
def _embedding(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.embedding`` / ``nn.Embedding`` of a batch of indices: adds an embedding feature dim."""
    batch = args[0]
    if batch.dtype.is_floating_point or batch.dtype.is_complex:
        raise TypeError(f"embedding indices must be an integer batch, got dtype {batch.dtype}")
    return batch.with_values(F.embedding(batch.values, *args[1:], **kwargs))
