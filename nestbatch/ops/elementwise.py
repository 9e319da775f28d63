"""Elementwise ops: unary math, binary arithmetic and comparisons, ``where``, ``masked_fill``.

Layouts: packed (preferred) and padded. An op runs on the packed values ``(total, *feature)``,
so no compute is spent on padding; operands broadcast as in
:mod:`nestbatch.ops.broadcasting`. When a batch is stored padded only and the op has no tensor
operand (``x.exp()``, ``x * 2``), it runs on the padded data instead and the result stays padded
(its padding then holds no particular value: ``exp(0) = 1``).

A batch whose ragged dim was moved (:attr:`~nestbatch.NestedBatch.ragged_dim`) keeps it there;
the broadcasting rules for it are in :mod:`nestbatch.ops.broadcasting`.

In-place forms (``add_``, ``x += y``, ``clamp_``, ``fill_``, ``zero_``, ``copy_``, ...) run
torch's in-place op on the stored packed rows (or padded data, the padding put back), else
compute the result out of place and write it into the batch's stored layout (see
:func:`nestbatch.ops.common.replace_storage`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import (
    NestedBatch,
    after_stored_write,
    cached_layout,
    map_stored,
    storage_dim,
    stored_layout,
)
from nestbatch.layouts import Layout, Packed, Padded
from nestbatch.ops.broadcasting import broadcast_error, feature_ndim, packed_operand
from nestbatch.ops.common import (
    PACKED_OR_PADDED,
    argument,
    check_same_structure,
    first_batch,
    is_batch,
    replace_storage,
    torch_funcs,
    wrap_padded,
)
from nestbatch.ops.registry import nested_arguments, register

UNARY = (
    "abs", "absolute", "neg", "negative", "positive", "sgn", "sign", "signbit", "logical_not",
    "bitwise_not", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "square", "reciprocal", "sigmoid", "tanh", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "floor", "ceil",
    "round", "trunc", "frac", "relu", "isnan", "isinf", "isfinite", "isneginf", "isposinf",
    "nan_to_num", "logit", "lgamma", "digamma", "deg2rad", "rad2deg", "sinc", "conj", "real",
    "imag", "angle", "clamp", "clip", "clamp_min", "clamp_max", "float", "double", "half",
    "bfloat16", "long", "int", "short", "char", "byte", "bool", "arccos", "arcsin", "arctan",
    "arccosh", "arcsinh", "arctanh", "fix", "i0", "isreal", "resolve_conj", "resolve_neg",
    "cfloat", "cdouble", "chalf", "conj_physical",
)
#: Elementwise functions of a tensor and an order (``mvlgamma(x, p)``; ``polygamma(n, x)``,
#: whose method takes ``x.polygamma(n)``).
WITH_ORDER = ("mvlgamma", "polygamma")
#: ``torch.special``'s elementwise functions of one tensor (aliases and kin of the above).
SPECIAL_UNARY = (
    "expit", "erf", "erfc", "erfinv", "exp2", "expm1", "log1p", "round", "ndtr", "ndtri", "i0",
    "i0e", "i1", "i1e", "digamma", "psi", "gammaln", "sinc", "logit", "entr", "log_ndtr",
    "erfcx", "airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1",
    "modified_bessel_i0", "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
    "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0",
)
#: ``torch.special``'s elementwise functions of two operands, and of a tensor and an order.
SPECIAL_BINARY = (
    "xlogy", "xlog1py", "zeta", "gammainc", "gammaincc", "chebyshev_polynomial_t",
    "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
    "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p",
)
SPECIAL_WITH_ORDER = ("multigammaln", "polygamma")
BINARY = (
    "add", "sub", "subtract", "rsub", "mul", "multiply", "div", "divide", "true_divide",
    "floor_divide", "remainder", "fmod", "pow", "float_power", "atan2", "arctan2", "hypot",
    "maximum", "minimum", "fmax", "fmin", "copysign", "xlogy", "heaviside", "eq", "ne", "lt",
    "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal", "not_equal", "isclose",
    "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
    "lerp", "addcmul", "addcdiv", "where", "masked_fill", "bitwise_left_shift",
    "bitwise_right_shift", "logaddexp", "logaddexp2", "ldexp", "igamma", "igammac", "nextafter",
)
#: Elementwise functions of two integer tensors (their values, not special values, are fuzzed:
#: some torch builds crash the process on lcm of the dtype's minimum and -1).
INTEGER_BINARY = ("gcd", "lcm")
DUNDERS = (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
    "__rpow__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__",
    "__lshift__", "__rshift__", "__rlshift__", "__rrshift__",
    "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__neg__", "__abs__", "__invert__",
)
INPLACE_DUNDERS = (
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
    "__iand__", "__ior__", "__ixor__",
)


def elementwise(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` on the packed values of every batch operand (padded data if scalars only)."""
    if layout is Layout.PACKED:
        fast = _same_structure_operands(args, kwargs)
        if fast is not None:
            ref, values = fast
            return ref.with_values(func(*values, **kwargs))
    batches = nested_arguments(args, kwargs)
    ref = batches[0]
    others = [a for a in (*args, *kwargs.values()) if a is not ref]
    # (A Python number first, torch.sub(3, x), is handed to torch as it is: a tensor made of
    # it would round it to the default dtype and promote as a 0-d tensor, not as a number.)
    dense = [o for o in others if is_batch(o) or (isinstance(o, Tensor) and o.dim() > 0)]
    if layout is Layout.PADDED and not dense and not _divides_integers(func, ref):
        padded = ref.padded(None)
        data = _without_padding_gradient(padded)
        new_args = tuple(data if a is ref else a for a in args)
        new_kwargs = {key: data if v is ref else v for key, v in kwargs.items()}
        return wrap_padded(func(*new_args, **new_kwargs), padded.partition, ref.ragged_dim)
    nf = feature_ndim(batches)
    new_args = [packed_operand(a, ref, nf) for a in args]
    new_kwargs = {key: packed_operand(v, ref, nf) for key, v in kwargs.items()}
    try:
        out = func(*new_args, **new_kwargs)
    except RuntimeError as exc:
        if "must match the size" in str(exc) or "broadcast" in str(exc):
            raise broadcast_error(exc, ref, others) from exc
        raise
    return ref.with_values(out)


#: Ops that raise on an integer zero (torch's ``ZeroDivisionError``): never run over the
#: padding of an integer batch, whose filler may be 0.
_DIVISIONS = frozenset({
    "floor_divide", "remainder", "fmod", "div", "divide", "true_divide", "__floordiv__",
    "__rfloordiv__", "__mod__", "__rmod__", "__truediv__", "__rtruediv__", "__rdiv__",
    "floor_divide_", "remainder_", "fmod_", "div_", "divide_", "true_divide_",
    "__ifloordiv__", "__imod__", "__idiv__",
})


def _divides_integers(func: Any, batch: NestedBatch) -> bool:
    return getattr(func, "__name__", "") in _DIVISIONS and not (
        batch.dtype.is_floating_point or batch.dtype.is_complex)


def _same_structure_operands(args: tuple, kwargs: dict) -> tuple[NestedBatch, list] | None:
    """The common case, found in one pass: batches sharing one partition object, ragged dim 1,
    the same feature dims, beside scalars only (no keyword tensors). Returns the first batch
    and the arguments with every batch replaced by its packed values; None otherwise (the
    general path then broadcasts and checks)."""
    ref = None
    values = []
    for a in args:
        if isinstance(a, NestedBatch):
            if a.ragged_dim != 1:
                return None
            stored = a.packed().values
            if ref is None:
                ref, ref_ndim = a, stored.dim()
            elif a.partition is not ref.partition or stored.dim() != ref_ndim:
                return None  # (one partition: the same dims exactly when the values' are)
            values.append(stored)
        elif isinstance(a, Tensor) and a.dim() > 0:
            return None
        else:
            values.append(a)
    if ref is None or any(isinstance(v, Tensor | NestedBatch) for v in kwargs.values()):
        return None
    return ref, values


@register(*torch_funcs(*UNARY, *BINARY, *INTEGER_BINARY, *WITH_ORDER),
          *(getattr(torch.Tensor, d) for d in DUNDERS),
          *(getattr(torch.special, name)
            for name in (*SPECIAL_UNARY, *SPECIAL_BINARY, *SPECIAL_WITH_ORDER)),
          layouts=PACKED_OR_PADDED, prefer=Layout.PACKED, moved_ragged=True, nested=True)
def _elementwise(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    if func is torch.where and len(args) + len(kwargs) == 1:
        raise ValueError(
            "torch.where(condition) with one argument returns indices, which are ragged; use "
            "condition.values.nonzero() on the packed rows"
        )
    return elementwise(layout, func, args, kwargs)


_INPLACE_NAMES = (*(name + "_" for name in (*UNARY, *BINARY, *INTEGER_BINARY, *WITH_ORDER)),
                  *INPLACE_DUNDERS)
_INPLACE = tuple(getattr(torch.Tensor, n) for n in _INPLACE_NAMES if hasattr(torch.Tensor, n))
#: torch's function spellings of the in-place ops (``torch.sigmoid_(b)``).
_TORCH_INPLACE = tuple(getattr(torch, n) for n in _INPLACE_NAMES
                       if not n.startswith("__") and callable(getattr(torch, n, None)))


@register(*_INPLACE, *_TORCH_INPLACE, torch.Tensor.zero_, torch.Tensor.fill_,
          torch.Tensor.copy_,
          layouts=PACKED_OR_PADDED,
          prefer=Layout.PACKED, moved_ragged=True, nested=True)
def _elementwise_inplace(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``b.add_(x)``, ``b += x``, ``b.exp_()``, ``b.fill_(v)``, ``b.copy_(src)``, ...: torch's
    in-place op itself, so torch's rules (result dtype, broadcasting into the target's shape)
    decide what runs.

    On the stored tensors where the operands line up with them: one launch on packed rows; on
    padded data, batch operands are padded as it is, and two more ops put the filler back in
    the padding when it has one. Otherwise (a list layout, a per-sample operand of a padded
    batch) on a copy of the packed rows, written back
    (:func:`~nestbatch.ops.common.replace_storage`).
    """
    target = args[0] if args else None
    if not is_batch(target):
        # A RuntimeError, as torch's for an output that cannot hold the result: Python turns a
        # TypeError from ``d += batch`` into a silent ``d = d + batch``.
        raise RuntimeError(
            f"Tensor.{func.__name__}: a dense tensor of shape {tuple(target.shape)} cannot hold "
            "the result with a NestedBatch operand in place (the result is ragged); use the "
            "out-of-place op (d = d + batch)"
        )
    stored = stored_layout(target)
    if isinstance(stored, Padded) and not _divides_integers(func, target):
        operands = _padded_operands(target, stored, args[1:], kwargs)
        if operands is not None:
            if stored.data.requires_grad and torch.is_grad_enabled():
                # The padding takes no gradient, as in _without_padding_gradient.
                stored.data.masked_fill_(~expand_mask(stored.mask, stored.data), 0)
            func(stored.data, *operands[0], **operands[1])
            if stored.padding_value is not None:  # the contract: the padding keeps its filler
                stored.data.masked_fill_(~expand_mask(stored.mask, stored.data),
                                         stored.padding_value)
            after_stored_write(target)
            return target
    nf = feature_ndim(nested_arguments(args, kwargs))
    operands = [packed_operand(a, target, nf) for a in args[1:]]
    extra = {key: packed_operand(v, target, nf) for key, v in kwargs.items()}
    if isinstance(stored, Packed):
        func(stored.values, *operands, **extra)
        after_stored_write(target)
        return target
    values = target.packed().values.clone()
    func(values, *operands, **extra)
    return replace_storage(target, target.with_values(values))


def _padded_operands(target: NestedBatch, stored: Padded, args: tuple,
                     kwargs: dict) -> tuple[list, dict] | None:
    """The operands of an in-place op run on ``stored.data``, the target's padded data: batches
    padded as it is (a cached layout of that shape, or one conversion), scalars and tensors over
    the feature dims as they are. None when an operand does not line up with the padded data
    (a per-sample tensor, a batch presenting other dims): the general path handles it."""
    converted: list = []
    for x in (*args, *kwargs.values()):
        if is_batch(x):
            if x.ragged_dim != target.ragged_dim or x.dim() != target.dim():
                return None
            check_same_structure(target, x, "the two batches of an elementwise op")
            padded = cached_layout(x, Layout.PADDED)
            if (padded is None or stored.padding_side != "right"
                    or padded.padded_shape != stored.padded_shape):
                padded = x.padded(0.0, tuple(stored.padded_shape),
                                  padding_side=stored.padding_side)
            x = _without_padding_gradient(padded)
        elif isinstance(x, Tensor) and x.dim() > 0 and (
                target.ragged_dim != 1 or x.dim() > len(target.feature_shape)):
            return None
        converted.append(x)
    return converted[: len(args)], dict(zip(kwargs, converted[len(args):]))


def _without_padding_gradient(padded: Padded) -> Tensor:
    """``padded.data``, with its padding set to 0 where autograd records the op run on it.

    Whatever the padding holds (junk, or 0 where the op's derivative is infinite: ``sqrt``),
    the op's backward gives it 0 times that derivative, NaN, which would reach whatever made
    the padded data (a ``Linear``'s weight). ``masked_fill`` gives the padding no gradient.
    """
    data = padded.data
    if data.requires_grad and torch.is_grad_enabled():
        return data.masked_fill(~expand_mask(padded.mask, data), 0)
    return data


def expand_mask(mask: Tensor, data: Tensor) -> Tensor:
    """``mask`` viewed with trailing size-1 dims, to broadcast against ``data``."""
    return mask.view(*mask.shape, *([1] * (data.dim() - mask.dim())))


@register(*torch_funcs("empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
                       "randn_like", "randint_like"),
          layouts=PACKED_OR_PADDED, prefer=Layout.PACKED, moved_ragged=True, nested=True)
def _like(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """A new batch of the same structure, the ``*_like`` of the packed values (or padded data)."""
    batch = first_batch(args)
    if layout is Layout.PADDED:
        padded = batch.padded(None)
        out = func(padded.data, *args[1:], **kwargs)
        partition = padded.partition  # (moved along where device= moved the data)
        if out.device != padded.data.device:
            partition = partition.to(out.device)
        return wrap_padded(out, partition, batch.ragged_dim)
    return batch.with_values(func(batch.packed().values, *args[1:], **kwargs))


@register(*(getattr(torch.Tensor, "new_" + kind) for kind in
            ("empty", "zeros", "ones", "full", "tensor", "empty_strided")),
          layouts=tuple(Layout), moved_ragged=True, nested=True)
def _new_tensor(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Tensor:
    """``Tensor.new_zeros(size)`` and the other ``new_*`` methods: as torch's, a plain tensor of
    the given size (or data) with the batch's dtype and device unless told otherwise (a batch's
    own structure is made by the ``*_like`` functions)."""
    batch = args[0]
    probe = torch.empty(0, dtype=batch.dtype, device=batch.device)  # (allocates no bytes)
    return func(probe, *args[1:], **kwargs)


@register(*torch_funcs("frexp"), layouts=(Layout.PACKED,), moved_ragged=True, nested=True)
def _frexp(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.frexp``: the mantissa and the exponent, each a batch of this structure (one op
    on the packed values; torch's dtype checks)."""
    batch = args[0]
    mantissa, exponent = func(batch.packed().values, *args[1:], **kwargs)
    return torch.return_types.frexp((batch.with_values(mantissa), batch.with_values(exponent)))


@register(*torch_funcs("tril", "triu", "tril_", "triu_"), layouts=(Layout.PACKED,),
          moved_ragged=True)
def _triangle(layout: Layout, func: Any, args: tuple, kwargs: dict) -> NestedBatch:
    """``tril`` / ``triu(input, diagonal=0)`` (``tril_`` / ``triu_`` in place) of every sample's
    last two dims, as torch's: the elements at (row, column) with ``column - row <=
    diagonal`` (``tril``; ``>=`` for ``triu``) kept, the others zero. Where both dims are
    feature dims, torch's own function of the packed rows; where one of them is the ragged dim,
    its index is every packed row's position in its sample, and the kept elements are chosen
    by one comparison (no padding, no read of the device)."""
    batch, name = args[0], func.__name__.rstrip("_")
    diagonal = argument(args, kwargs, 1, "diagonal", 0)
    if batch.dim() < 3:  # (samples of fewer than 2 dims: torch refuses such an input)
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    in_place = func.__name__.endswith("_")
    rows, cols = storage_dim(batch, batch.dim() - 2), storage_dim(batch, batch.dim() - 1)
    if rows[0] == "feature" and cols[0] == "feature":
        out = getattr(torch, name)(batch.packed().values, diagonal)
        return replace_storage(batch, batch.with_values(out)) if in_place \
            else batch.with_values(out)
    if batch.num_ragged_dims != 1 or batch.partition.ragged_rank != 1:
        raise ValueError(f"{name} of a sample's last two dims where both or an outer level are "
                         "ragged is not supported: only one of them may be the ragged dim")
    lower, ragged_rows = name == "tril", rows[0] == "ragged"
    stored = stored_layout(batch)
    if in_place and isinstance(stored, Packed):  # (one write into the stored rows)
        stored.values.masked_fill_(_outside_triangle(batch, ragged_rows, diagonal, lower), 0)
        after_stored_write(batch)
        return batch
    values = batch.packed().values
    outside = _outside_triangle(batch, ragged_rows, diagonal, lower)
    out = batch.with_values(torch.where(outside, torch.zeros((), dtype=values.dtype), values))
    return replace_storage(batch, out) if in_place else out


def _outside_triangle(batch: NestedBatch, ragged_rows: bool, diagonal: int, lower: bool
                      ) -> Tensor:
    """Bool, broadcasting against the packed values ``(total, *feature)``: whether an element
    is outside the triangle (zeroed). The ragged index is the row's position in its sample;
    the other index runs along the last stored dim (the sample's other last dim)."""
    features = batch.feature_shape
    position = batch.partition.positions.view(-1, *[1] * len(features))
    other = torch.arange(features[-1], device=position.device)
    row, col = (position, other) if ragged_rows else (other, position)
    return (col - row > diagonal) if lower else (col - row < diagonal)


@register(torch.clone, torch.detach, torch.Tensor.contiguous, torch.Tensor.clone,
          torch.Tensor.detach, layouts=(Layout.LIST, Layout.PACKED, Layout.PADDED),
          moved_ragged=True, nested=True)
def _copy(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Any:
    """``clone`` / ``detach`` / ``contiguous`` of the stored layout (structure kept)."""
    batch = args[0]
    if func in (torch.detach, torch.Tensor.detach):
        return batch.detach()
    if func is torch.Tensor.contiguous:
        return batch.contiguous()
    return map_stored(batch, lambda t: torch.clone(t, **kwargs))
