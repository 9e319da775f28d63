"""nestbatch: PyTorch batches whose samples differ in size.

One front object, :class:`NestedBatch`, stores a batch as packed rows + offsets, padded data +
sizes, or a list of tensors, and converts lazily (and cached) between them. The padded-layout
:class:`RaggedBatch` API and its batched helper functions are exported here too.
"""

import torch

from nestbatch import compat, ops, torch_nested  # noqa: F401  (the registry and the vocabularies plug in)
from nestbatch.batch import NestedBatch
from nestbatch.compat.batching_helpers import (
    RaggedBatch,
    apply_mask_to_tensor,
    average_over_targets,
    batched_bool_indexing,
    batched_bool_indexing_write,
    batched_index_mapping,
    batched_indexing_access,
    batched_indexing_write,
    batched_inverse_indexing_access,
    combine_data,
    get_compact_from_named_tuple,
    get_compact_lists,
    get_indices_from_mask,
    get_mask_from_indices,
    squeeze_except_batch_and_sample,
    sum_over_targets,
)
from nestbatch.compat.collation import collate, pack
from nestbatch.compat.factories import as_nested, nested
from nestbatch.compat.torch_formats import (
    from_nested_tensor,
    from_packed_sequence,
    to_nested_tensor,
    to_packed_sequence,
)
from nestbatch.layouts import (
    Layout,
    NestedSize,
    Packed,
    Padded,
    RaggedSize,
    RowPartition,
    TensorList,
)
from nestbatch.ops.attention import sequence_attention
from nestbatch.ops.index_payloads import INDEX_FILLER, local_indices, packed_indices
from nestbatch.ops.interop import accept_nested_batches

__version__ = "0.1.0"

# ``torch.load`` (``weights_only=True``, its default) may rebuild saved batches and shapes:
# their classes hold only tensors, ints, tuples and devices, and build no code from the file.
torch.serialization.add_safe_globals(
    [NestedBatch, Packed, Padded, TensorList, RowPartition, RaggedBatch, NestedSize, RaggedSize]
)

__all__ = [
    "INDEX_FILLER",
    "Layout",
    "NestedBatch",
    "NestedSize",
    "Packed",
    "Padded",
    "RaggedBatch",
    "RaggedSize",
    "RowPartition",
    "TensorList",
    "accept_nested_batches",
    "apply_mask_to_tensor",
    "as_nested",
    "average_over_targets",
    "batched_bool_indexing",
    "batched_bool_indexing_write",
    "batched_index_mapping",
    "batched_indexing_access",
    "batched_indexing_write",
    "batched_inverse_indexing_access",
    "collate",
    "combine_data",
    "from_nested_tensor",
    "from_packed_sequence",
    "get_compact_from_named_tuple",
    "get_compact_lists",
    "get_indices_from_mask",
    "get_mask_from_indices",
    "local_indices",
    "nested",
    "pack",
    "packed_indices",
    "sequence_attention",
    "squeeze_except_batch_and_sample",
    "sum_over_targets",
    "to_nested_tensor",
    "to_packed_sequence",
    "torch_nested",
]
