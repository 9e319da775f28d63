"""The ``RaggedBatch`` API's import path: see :mod:`nestbatch.compat.batching_helpers` (code
written for the documented API changes only its import line to this module)."""
from nestbatch.compat.batching_helpers import *  # noqa: F403
from nestbatch.compat.batching_helpers import __all__  # noqa: F401
