"""Import path kept for :mod:`nestbatch.compat.torch_formats` (PackedSequence, torch.nested)."""
from nestbatch.compat.torch_formats import *  # noqa: F403
