"""`TensorMethods`: the Tensor-like surface of a :class:`~nestbatch.NestedBatch`.

Python operators (``+ - * / // % ** @``, comparisons, ``& | ^ ~``, unary ``-`` and ``abs``, the
in-place ``+=`` ...), indexing (``x[...]``) and Tensor methods (``x.exp()``, ``x.sum(1)``,
``x.softmax(1)``, ...). Every one calls the class's ``__torch_function__`` with the matching
``torch.Tensor`` method, so it runs through the same registry entry as ``torch.<op>(x)`` and
``tensor.<op>(x)``. This module sits below :mod:`nestbatch.batch` and imports nothing of
nestbatch.

``==`` returns a batch of bools (elementwise, as torch), so ``__hash__`` is the identity hash:
batches stay usable as dict keys and set members, compared by identity there.

In-place methods (``add_``, ``+=``, ``relu_``, ...) write into the batch's stored layout (the one
it was built in, so views of its samples see the change as with torch) and drop the other cached
layouts; the padding of a padded layout is left as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Number
from typing import Any

import torch
from torch import Tensor

_OPERAND_TYPES = (Number, Tensor)
_GETITEM = torch.Tensor.__getitem__  # the registry's key (bound at import: tools may patch it)


def _call(func: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
    cls = type(self)
    return cls.__torch_function__(func, (cls,), (self, *args), kwargs)


def _method(name: str) -> Callable:
    func = getattr(torch.Tensor, name)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _call(func, self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"Same as :meth:`torch.Tensor.{name}`, on the batch."
    return method


def _operator(name: str, reflected: bool = False) -> Callable:
    func = getattr(torch.Tensor, name)

    def operator(self: Any, other: Any) -> Any:
        if not (isinstance(other, _OPERAND_TYPES) or _is_batch(other)):
            return NotImplemented
        if reflected:
            # other <op> self: torch's function with the operands in their real order.
            return _call_swapped(func, self, other)
        return _call(func, self, other)

    operator.__name__ = f"__{'r' if reflected else ''}{name}__"
    order = "other <op> self" if reflected else "self <op> other"
    operator.__doc__ = f"``{order}`` with :meth:`torch.Tensor.{name}`."
    return operator


def _call_swapped(func: Callable, self: Any, other: Any) -> Any:
    other = torch.as_tensor(other) if isinstance(other, Number) else other
    cls = type(self)
    return cls.__torch_function__(func, (cls,), (other, self), {})


def _is_batch(x: Any) -> bool:
    return isinstance(x, TensorMethods)


class TensorMethods:
    """Mixin: operators and Tensor methods of a batch, routed through the op registry."""

    __hash__ = object.__hash__

    def __neg__(self) -> Any:
        return _call(torch.Tensor.neg, self)

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        return _call(torch.Tensor.abs, self)

    def __invert__(self) -> Any:
        return _call(torch.Tensor.bitwise_not, self)

    def __bool__(self) -> bool:
        """Refused, as for a tensor of several elements: ``a == b`` is a batch of bools."""
        raise RuntimeError(
            "Boolean value of a NestedBatch is ambiguous: compare whole batches with "
            "a.equal(b) / torch.equal(a, b) / torch.allclose(a, b), or reduce first "
            "((a == b).all())"
        )

    def __getitem__(self, index: Any) -> Any:
        """``x[index]``: see :mod:`nestbatch.selection` for the rules."""
        return _call(_GETITEM, self, index)


_BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
    "mod": "remainder", "pow": "pow", "matmul": "matmul", "and": "bitwise_and",
    "or": "bitwise_or", "xor": "bitwise_xor",
}
_COMPARISONS = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
_METHODS = (
    # elementwise
    "abs", "neg", "sgn", "sign", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt",
    "rsqrt", "square", "reciprocal", "sigmoid", "tanh", "sin", "cos", "tan", "atan", "erf",
    "floor", "ceil", "round", "trunc", "frac", "relu", "isnan", "isinf", "isfinite",
    "nan_to_num", "logical_not", "bitwise_not", "clamp", "clip", "clamp_min", "clamp_max",
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow",
    "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "lerp", "where", "masked_fill",
    "equal", "allclose",
    "float", "double", "half", "bfloat16", "long", "int", "short", "bool", "byte", "matmul",
    "bmm",
    # reductions
    "sum", "nansum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin",
    "logsumexp", "var", "std", "count_nonzero", "any", "all", "softmax", "log_softmax",
    # shape and structure
    "reshape", "view", "reshape_as", "view_as", "transpose", "swapaxes", "permute", "movedim",
    "moveaxis", "select", "unsqueeze", "squeeze", "flatten", "tile", "repeat",
)

for _name, _torch_name in (_BINARY | _COMPARISONS).items():
    setattr(TensorMethods, f"__{_name}__", _operator(_torch_name))
for _name, _torch_name in _BINARY.items():
    setattr(TensorMethods, f"__r{_name}__", _operator(_torch_name, reflected=True))
    inplace = getattr(torch.Tensor, _torch_name + "_", None)
    if inplace is not None:
        setattr(TensorMethods, f"__i{_name}__", _operator(_torch_name + "_"))
for _name in _METHODS:
    setattr(TensorMethods, _name, _method(_name))
    if hasattr(torch.Tensor, _name + "_"):
        setattr(TensorMethods, _name + "_", _method(_name + "_"))
del _name, _torch_name, inplace
