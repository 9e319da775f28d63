"""Import path of the layout conversions (:mod:`nestbatch.conversions`, re-exported here) and of
kaolin's and PyTorch3D's batching helpers (``nestbatch.convert.kaolin`` / ``.pytorch3d``)."""
from nestbatch.conversions import *  # noqa: F403
from nestbatch.conversions import __all__  # noqa: F401
