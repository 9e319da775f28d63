"""PyTorch3D's helpers: see :mod:`nestbatch.compat.pytorch3d` (this is their import path)."""
from nestbatch.compat.pytorch3d import *  # noqa: F403
from nestbatch.compat.pytorch3d import __all__  # noqa: F401
