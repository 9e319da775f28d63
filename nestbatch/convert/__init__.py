"""The import path of nestbatch's converters to other libraries' formats (kaolin's and
PyTorch3D's batching helpers: ``nestbatch.convert.kaolin``, ``nestbatch.convert.pytorch3d``);
they live in :mod:`nestbatch.compat`. The layout conversions are :mod:`nestbatch.conversions`
(re-exported here for code written against this path)."""

from nestbatch.conversions import *  # noqa: F403
from nestbatch.conversions import __all__  # noqa: F401
