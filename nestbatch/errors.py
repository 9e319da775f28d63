"""Exception types of the ``RaggedBatch`` API that code written against the reference catches.

nestbatch raises ``ValueError`` / ``TypeError`` / ``IndexError`` with messages that name the
argument, the expected and the actual. The reference implementation of the ``RaggedBatch`` API
checks its arguments with ``assert`` (``AssertionError``) and lets torch's own checks fail
(``RuntimeError``), so code moving over from it catches those. Every error that
:mod:`nestbatch.compat.batching_helpers` and :class:`~nestbatch.RaggedBatch` raise for bad input is
therefore one of the classes below: still the clear nestbatch type, and also a ``RuntimeError``
and an ``AssertionError``.

========================  ===========================  =========================================
nestbatch raises          also caught by               where the reference raises
========================  ===========================  =========================================
``RaggedValueError``      ``ValueError``,              ``AssertionError`` (shape, size, dim
                          ``RuntimeError``,            checks), ``RuntimeError`` (torch's shape
                          ``AssertionError``           checks), ``ValueError`` (a few)
``RaggedTypeError``       ``TypeError``, same two      ``AssertionError`` / ``RuntimeError``
                                                       (wrong dtype, wrong kind of argument)
``RaggedIndexError``      ``IndexError``, same two     ``RuntimeError`` (an index out of range
                                                       inside a kernel or ``gather``)
========================  ===========================  =========================================
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "NestedIndexError",
    "NestedTypeError",
    "NestedValueError",
    "RaggedIndexError",
    "RaggedTypeError",
    "RaggedValueError",
    "converted",
    "reference_compatible",
    "torch_compatible",
    "reference_compatible_class",
]


class NestedValueError(ValueError, RuntimeError):
    """A ``ValueError`` of a torch function on a batch, also a ``RuntimeError``: torch and
    torch.nested raise ``RuntimeError`` for bad arguments to their ops."""


class NestedTypeError(TypeError, RuntimeError):
    """A ``TypeError`` of a torch function on a batch, also a ``RuntimeError``: torch.nested
    raises a ``RuntimeError`` (or its subclass for ops it lacks) for an op or input it refuses."""


class NestedIndexError(IndexError, RuntimeError):
    """An ``IndexError`` of a torch function on a batch, also a ``RuntimeError``."""


class RaggedValueError(NestedValueError, AssertionError):
    """A ``ValueError`` of the ``RaggedBatch`` API (also a ``RuntimeError`` and an
    ``AssertionError``, as the reference raises)."""


class RaggedTypeError(NestedTypeError, AssertionError):
    """A ``TypeError`` of the ``RaggedBatch`` API (also a ``RuntimeError`` and an
    ``AssertionError``)."""


class RaggedIndexError(NestedIndexError, AssertionError):
    """An ``IndexError`` of the ``RaggedBatch`` API (also a ``RuntimeError`` and an
    ``AssertionError``)."""


_COMPATIBLE = ((IndexError, RaggedIndexError), (TypeError, RaggedTypeError),
               (ValueError, RaggedValueError))

F = TypeVar("F", bound=Callable[..., Any])


def _converting(table: tuple) -> Callable[[F], F]:
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (ValueError, TypeError, IndexError) as error:
                raise converted(error, table) from error.__cause__

        return wrapper  # type: ignore[return-value]

    return decorate


_TORCH_COMPATIBLE = ((IndexError, NestedIndexError), (TypeError, NestedTypeError),
                     (ValueError, NestedValueError))

#: Decorator: ``ValueError`` / ``TypeError`` / ``IndexError`` raised in the function leave it as
#: the matching ``Ragged*`` class above (same message, traceback and cause).
reference_compatible = _converting(_COMPATIBLE)

#: Decorator: the same as the matching ``Nested*`` class (for torch.nested's constructors).
torch_compatible = _converting(_TORCH_COMPATIBLE)


def converted(error: Exception, table: tuple = _TORCH_COMPATIBLE) -> Exception:
    """``error`` (a ``ValueError`` / ``TypeError`` / ``IndexError``) as the class of its kind in
    ``table`` (default: the ``Nested*`` classes, also ``RuntimeError`` as torch's errors), with
    its message and traceback; ``error`` itself when it already is a ``RuntimeError`` and the
    table adds nothing more."""
    kind = next(new for old, new in table if isinstance(error, old))
    if isinstance(error, kind):
        return error
    return kind(*error.args).with_traceback(error.__traceback__)


def reference_compatible_class(cls: type) -> type:
    """Apply :func:`reference_compatible` to every method of ``cls`` (plain, class and static
    methods, property setters) and to its constructor and item access; private methods are
    left bare (they serve the public ones, which convert what they raise)."""
    for name, value in list(vars(cls).items()):
        if name.startswith("_") and name not in ("__init__", "__getitem__", "__setitem__"):
            continue
        if isinstance(value, staticmethod):
            setattr(cls, name, staticmethod(reference_compatible(value.__func__)))
        elif isinstance(value, classmethod):
            setattr(cls, name, classmethod(reference_compatible(value.__func__)))
        elif isinstance(value, property) and (value.fset or value.fdel):
            # Getters read state and raise nothing for input: left bare (they are hot).
            setattr(cls, name, property(
                value.fget,
                *(None if f is None else reference_compatible(f)
                  for f in (value.fset, value.fdel)),
                value.__doc__,
            ))
        elif callable(value):
            setattr(cls, name, reference_compatible(value))
    return cls
