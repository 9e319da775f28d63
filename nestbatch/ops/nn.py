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
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F

from nestbatch.batch import moved_ragged_error, storage_dim
from nestbatch.layouts import Layout
from nestbatch.ops.common import dim_kind, normalize_dim, replace_storage
from nestbatch.ops.registry import register

_ACTIVATIONS = (
    "relu", "relu6", "elu", "selu", "celu", "leaky_relu", "gelu", "silu", "mish", "softplus",
    "softsign", "hardtanh", "hardswish", "hardsigmoid", "logsigmoid", "tanhshrink",
    "softshrink", "hardshrink", "threshold", "prelu", "rrelu", "sigmoid", "tanh", "dropout",
    "alpha_dropout", "feature_alpha_dropout",
)


@register(*(getattr(F, name) for name in _ACTIVATIONS), layouts=(Layout.PACKED,),
          moved_ragged=True)
def _on_values(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """Activations and dropout: ``func`` of the packed values (``inplace`` honoured)."""
    batch = args[0]
    inplace = bool(kwargs.pop("inplace", False))
    if func in (F.dropout, F.alpha_dropout, F.feature_alpha_dropout) and len(args) > 3:
        inplace, args = bool(args[3]), args[:3]
    elif func in (F.relu, F.relu6, F.selu, F.silu, F.mish, F.hardswish, F.hardsigmoid,
                  F.elu, F.celu, F.leaky_relu, F.hardtanh, F.threshold) and \
            len(args) > 1 and isinstance(args[-1], bool):
        inplace, args = args[-1], args[:-1]
    result = batch.with_values(func(batch.values, *args[1:], **kwargs))
    return replace_storage(batch, result) if inplace else result


@register(F.glu, F.normalize, layouts=(Layout.PACKED,), moved_ragged=True)
def _along_feature_dim(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``glu`` / ``normalize`` along a feature dim (the ragged dims and the batch are refused)."""
    batch = args[0]
    position, default = (1, -1) if func is F.glu else (2, 1)
    if len(args) > position:
        dim, args = args[position], args[:position] + args[position + 1 :]
    else:
        dim = kwargs.pop("dim", default)
    dim = normalize_dim(batch, dim)
    kind, stored = storage_dim(batch, dim)
    if kind != "feature":
        raise ValueError(
            f"{func.__name__} along dim {dim} of a NestedBatch: only feature dims are supported "
            f"(dim {dim} is the {kind} dim); pass dim=-1 for the last feature dim"
        )
    return batch.with_values(func(batch.values, *args[1:], dim=stored, **kwargs))


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
    """``F.layer_norm`` / ``F.rms_norm`` over trailing feature dims (never the ragged ones)."""
    batch = args[0]
    shape = args[1] if len(args) > 1 else kwargs["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(shape) > len(batch.feature_shape):
        raise ValueError(
            f"normalized_shape={shape} extends into the ragged dims of a batch with feature "
            f"shape {tuple(batch.feature_shape)}; normalize over feature dims only"
        )
    if any(dim_kind(batch, batch.dim() - 1 - i) != "feature" for i in range(len(shape))):
        raise moved_ragged_error(
            batch, func.__name__, f"normalized_shape={shape} covers the ragged dim"
        )
    return batch.with_values(func(batch.values, *args[1:], **kwargs))


@register(F.embedding, layouts=(Layout.PACKED,), moved_ragged=True)
def _embedding(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.embedding`` / ``nn.Embedding`` of a batch of indices: adds an embedding feature dim."""
    batch = args[0]
    if batch.dtype.is_floating_point or batch.dtype.is_complex:
        raise TypeError(f"embedding indices must be an integer batch, got dtype {batch.dtype}")
    return batch.with_values(F.embedding(batch.values, *args[1:], **kwargs))
