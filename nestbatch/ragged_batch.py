"""Import path kept for :mod:`nestbatch.compat.ragged_batch` (``RaggedBatch``)."""
from nestbatch.compat.ragged_batch import *  # noqa: F403
