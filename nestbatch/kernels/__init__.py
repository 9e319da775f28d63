"""Compiled kernels for the padded-layout hot paths, as ``torch.library`` operators.

The entry points callers use (:mod:`nestbatch.kernels.api`) validate their arguments
(:mod:`nestbatch.kernels.checks`: ``TypeError`` / ``ValueError`` / ``IndexError`` before any
kernel runs) and call the ``nestbatch::*`` operators of :mod:`nestbatch.kernels.operators`
through :mod:`nestbatch.kernels.dispatch`: a CUDA kernel from ``csrc/`` on CUDA tensors (built
on first use, see :mod:`nestbatch.kernels.extension`), the CPU implementation of
:mod:`nestbatch.kernels.cpu` on host tensors, and the pure-PyTorch implementation of
:mod:`nestbatch.kernels.torch_impl` elsewhere (fake tensors, traced graphs, the fallback). All
paths give identical results. This package imports nothing else of nestbatch; this module only
re-exports.

The indexing functions have the signatures of their counterparts in
:mod:`nestbatch.compat.batched_indexing` (plus keyword-only extras), so a call site switches by
changing the module it calls.

Host synchronizations: none in the operators. The wrappers read the device once where the
result needs it: the bounds check of ``check_bounds=True`` (one flag per call; pass
``check_bounds=False`` where the caller already validated), and the output width of
:func:`mask_to_indices` / :func:`bool_compaction` when ``max_count`` is not given.
"""

from nestbatch.kernels.api import (
    bool_compaction,
    fill_padding,
    index_mapping,
    indexing_access,
    indexing_write,
    indices_to_mask,
    inverse_indexing_access,
    mask_to_indices,
    packed_to_padded,
    padded_to_packed,
)
from nestbatch.kernels.dispatch import call, call_validating, runs_compiled, runs_on_host
from nestbatch.kernels.extension import extension_status, load_extension

__all__ = [
    "bool_compaction",
    "call",
    "call_validating",
    "extension_status",
    "fill_padding",
    "index_mapping",
    "indexing_access",
    "indexing_write",
    "indices_to_mask",
    "inverse_indexing_access",
    "load_extension",
    "mask_to_indices",
    "packed_to_padded",
    "padded_to_packed",
    "runs_compiled",
    "runs_on_host",
]
