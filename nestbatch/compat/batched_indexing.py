"""The per-sample indexing primitives on normalized tensors (``(B, N, *D)`` data, ``(B, M)``
indices, ``(B,)`` sizes), in pure PyTorch.

They are the references of the ``nestbatch::*`` operators and live in
:mod:`nestbatch.kernels.torch_impl`; this module keeps their public import path.
"""

from nestbatch.kernels.torch_impl import (
    bool_compaction,
    fill_padding,
    index_mapping,
    indexing_access,
    indexing_write,
    indices_to_mask,
    inverse_indexing_access,
    mask_to_indices,
)

__all__ = [
    "bool_compaction",
    "fill_padding",
    "index_mapping",
    "indexing_access",
    "indexing_write",
    "indices_to_mask",
    "inverse_indexing_access",
    "mask_to_indices",
]
