"""Collectives over ragged batches: see :mod:`nestbatch.compat.distributed` (this is their
import path)."""

from nestbatch.compat.distributed import *  # noqa: F403
from nestbatch.compat.distributed import __all__  # noqa: F401
