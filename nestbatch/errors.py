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
    "RaggedIndexError",
    "RaggedTypeError",
    "RaggedValueError",
    "reference_compatible",
    "reference_compatible_class",
]


class RaggedValueError(ValueError, RuntimeError, AssertionError):
    """A ``ValueError`` of the ``RaggedBatch`` API (also a ``RuntimeError`` and an
    ``AssertionError``, as the reference raises)."""


class RaggedTypeError(TypeError, RuntimeError, AssertionError):
    """A ``TypeError`` of the ``RaggedBatch`` API (also a ``RuntimeError`` and an
    ``AssertionError``)."""


class RaggedIndexError(IndexError, RuntimeError, AssertionError):
    """An ``IndexError`` of the ``RaggedBatch`` API (also a ``RuntimeError`` and an
    ``AssertionError``)."""


_COMPATIBLE = ((IndexError, RaggedIndexError), (TypeError, RaggedTypeError),
               (ValueError, RaggedValueError))

F = TypeVar("F", bound=Callable[..., Any])


def reference_compatible(fn: F) -> F:
    """Decorator: ``ValueError`` / ``TypeError`` / ``IndexError`` raised in ``fn`` leave it as
    the matching class above (same message, traceback and cause)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ValueError, TypeError, IndexError) as error:
            if isinstance(error, (RuntimeError, AssertionError)):
                raise  # already catchable as the reference's
            kind = next(new for old, new in _COMPATIBLE if isinstance(error, old))
            converted = kind(*error.args)
            raise converted.with_traceback(error.__traceback__) from error.__cause__

    return wrapper  # type: ignore[return-value]


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
