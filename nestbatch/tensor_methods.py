"""`TensorMethods`: the Tensor-like surface of a :class:`~nestbatch.NestedBatch`.

Python operators (``+ - * / // % ** @``, comparisons, ``& | ^ ~``, unary ``-`` and ``abs``, the
in-place ``+=`` ...) and indexing (``x[...]``, ``x[...] = v``). Each calls the class's
``__torch_function__``
with the matching ``torch.Tensor`` method, so it runs through the same registry entry as
``torch.<op>(x)``. The Tensor methods (``x.exp()``, ``x.sum(1)``, ``x.acos_()``, ...) are not
listed here: the op registry (:mod:`nestbatch.ops.registry`) makes one with
:func:`tensor_method` for every op it registers under a name ``torch.Tensor`` has. This module
sits below :mod:`nestbatch.batch` and imports nothing of nestbatch.

``==`` returns a batch of bools (elementwise, as torch), so ``__hash__`` is the identity hash:
batches stay usable as dict keys and set members, compared by identity there.

In-place methods (``add_``, ``+=``, ``relu_``, ...) write into the batch's stored layout (the one
it was built in, so views of its samples see the change as with torch) and drop the other cached
layouts; the padding of a padded layout keeps its filler.
"""

from __future__ import annotations

from collections.abc import Callable
from numbers import Number
from typing import Any

import torch
from torch import Tensor

# Concrete types first: ``isinstance`` tries them in order, and the ``Number`` ABC's check runs
# in Python (about 1 us on this path); batches are found before it.
_OPERAND_TYPES = (Tensor, int, float, complex)
_GETITEM = torch.Tensor.__getitem__  # the registry's key (bound at import: tools may patch it)
_SETITEM = torch.Tensor.__setitem__


def _call(func: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
    cls = type(self)
    return cls.__torch_function__(func, (cls,), (self, *args), kwargs)


def tensor_method(func: Callable, name: str) -> Callable:
    """A method ``batch.<name>(*args, **kwargs)`` running ``func(batch, *args, **kwargs)``
    through the class's ``__torch_function__`` (the op registry makes one per registered op)."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _call(func, self, *args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"NestedBatch.{name}"
    method.__doc__ = f"Same as :meth:`torch.Tensor.{name}`, on the batch."
    return method


def tensor_property(func: Callable, name: str) -> property:
    """A property ``batch.<name>`` running ``func(batch)`` (for ``real`` / ``imag``, which are
    properties of a tensor)."""
    return property(lambda self: _call(func, self), doc=f"Same as ``torch.Tensor.{name}``.")


def _operator(name: str, reflected: bool = False, dunder: str = "") -> Callable:
    func = getattr(torch.Tensor, name)
    # torch's own reflected operator (``Tensor.__rsub__``, ...): ``number <op> tensor`` is
    # defined by it (``2 / t`` is ``t.reciprocal() * 2``; the number stays a Python scalar).
    torch_reflected = getattr(torch.Tensor, f"__r{dunder}__", None) if reflected else None

    def operator(self: Any, other: Any) -> Any:
        if not (isinstance(other, _OPERAND_TYPES) or isinstance(other, TensorMethods)
                or isinstance(other, Number)):
            if getattr(other, "ndim", None) != 0 or not hasattr(other, "item"):
                return NotImplemented
            # A NumPy scalar (np.bool_ is no Number) or 0-d array: host memory, no device read
            # (tensors, 0-d ones included, were taken above).
            other = other.item()
        if reflected:
            if torch_reflected is not None and not isinstance(other, (Tensor, TensorMethods)) \
                    and not torch.compiler.is_compiling():
                # (Traced, torch's reflected operator on a batch made in the graph does not
                # trace: the forward op on the swapped operands below does.)
                return _call(torch_reflected, self, other)
            # other <op> self: torch's function with the operands in their real order.
            other = torch.as_tensor(other) if isinstance(other, Number) else other
            return type(self).__torch_function__(func, (type(self),), (other, self), {})
        return _call(func, self, other)

    operator.__name__ = f"__{'r' if reflected else ''}{name}__"
    order = "other <op> self" if reflected else "self <op> other"
    operator.__doc__ = f"``{order}`` with :meth:`torch.Tensor.{name}`."
    return operator


class TensorMethods:
    """Mixin: operators and Tensor methods of a batch, routed through the op registry."""

    __hash__ = object.__hash__
    #: NumPy defers to the batch's operators (``np.float64(2) * batch`` is ``batch.__rmul__``)
    #: instead of making an array of it.
    __array_ufunc__ = None

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

    def __contains__(self, element: Any) -> bool:
        """``element in x``: whether any element of the samples equals it, as a tensor's."""
        if not isinstance(element, Tensor | Number | TensorMethods):
            raise RuntimeError(
                "Tensor.__contains__ only supports Tensor or scalar, but you passed in a "
                f"{type(element)}."
            )
        return bool((self == element).any())

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: samples of several shapes make no one array (NumPy would make one of
        objects, or, where the samples happen to agree, a dense one)."""
        raise TypeError(
            "a NestedBatch has no single NumPy array: use [t.numpy() for t in batch.unbind()], "
            "or batch.to_padded_tensor(value).numpy()"
        )

    def __getitem__(self, index: Any) -> Any:
        """``x[index]``: see :mod:`nestbatch.ops.indexing` for the rules."""
        return _call(_GETITEM, self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        """``x[index] = value``: writes what ``x[index]`` reads (see
        :mod:`nestbatch.ops.indexing`)."""
        _call(_SETITEM, self, index, value)


_BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
    "mod": "remainder", "pow": "pow", "matmul": "matmul", "and": "bitwise_and",
    "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "bitwise_left_shift",
    "rshift": "bitwise_right_shift",
}
_COMPARISONS = {"eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}

for _name, _torch_name in (_BINARY | _COMPARISONS).items():
    setattr(TensorMethods, f"__{_name}__", _operator(_torch_name))
for _name, _torch_name in _BINARY.items():
    setattr(TensorMethods, f"__r{_name}__", _operator(_torch_name, reflected=True, dunder=_name))
    inplace = getattr(torch.Tensor, _torch_name + "_", None)
    if inplace is not None:
        setattr(TensorMethods, f"__i{_name}__", _operator(_torch_name + "_"))
del _name, _torch_name, inplace
