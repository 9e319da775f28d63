"""nestbatch: PyTorch batches whose samples differ in size.

One front object, :class:`NestedBatch`, stores a batch as packed rows + offsets, padded data +
sizes, or a list of tensors, and converts lazily (and cached) between them.
"""

from nestbatch.batch import NestedBatch
from nestbatch.factories import as_nested, nested
from nestbatch.layouts import Layout, Packed, Padded, RowPartition, TensorList

__version__ = "0.1.0"

__all__ = [
    "Layout",
    "NestedBatch",
    "Packed",
    "Padded",
    "RowPartition",
    "TensorList",
    "as_nested",
    "nested",
]
