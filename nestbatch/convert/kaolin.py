"""kaolin's batching functions: see :mod:`nestbatch.compat.kaolin` (this is their import path)."""
from nestbatch.compat.kaolin import *  # noqa: F403
from nestbatch.compat.kaolin import __all__  # noqa: F401
