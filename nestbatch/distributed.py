"""Import path of :mod:`nestbatch.compat.distributed` (collectives over ragged batches)."""
from nestbatch.compat.distributed import *  # noqa: F403
from nestbatch.compat.distributed import __all__  # noqa: F401
