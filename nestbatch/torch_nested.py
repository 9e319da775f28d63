"""torch.nested's functions under their names, importable as torch.nested is
(``import nestbatch.torch_nested as nested``): see :mod:`nestbatch.compat.torch_nested`."""
from nestbatch.compat.torch_nested import *  # noqa: F403
from nestbatch.compat.torch_nested import __all__  # noqa: F401
