"""Import path kept for :mod:`nestbatch.ops.index_payloads`."""
from nestbatch.ops.index_payloads import *  # noqa: F403
