"""What differs between the torch releases nestbatch supports, in one place.

nestbatch supports torch 2.11 to 2.14 (``pyproject.toml``; ``scripts/test_matrix.sh`` runs the
suite on each). Every behaviour or API that differs inside that range is a named flag here,
with the release it changed in; the code asks the flag, never the version.
"""

from __future__ import annotations

import torch

#: The installed torch's (major, minor).
TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])

#: torch.compile (dynamo) traces the hash of an enum whose ``__hash__`` is ``object.__hash__``
#: (a C slot, faster than ``Enum.__hash__``); before 2.13 it refuses a user-defined object with
#: an overridden ``__hash__``, so the enum keeps ``Enum.__hash__`` there.
DYNAMO_HASHES_IDENTITY_ENUMS = TORCH >= (2, 13)
