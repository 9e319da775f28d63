"""Torch functions on a :class:`~nestbatch.NestedBatch`.

Importing this package imports every module that registers implementations in
:mod:`nestbatch.ops.registry`; :func:`dispatch` is what ``NestedBatch.__torch_function__`` calls.
"""

import importlib
import pkgutil

from nestbatch.ops.registry import dispatch, register


def _import_implementations() -> None:
    # Every module of this package registers its ops when imported; a new module needs no edit.
    for module in pkgutil.iter_modules(__path__):
        if module.name != "registry":
            importlib.import_module(f"{__name__}.{module.name}")


_import_implementations()

__all__ = ["dispatch", "register"]
