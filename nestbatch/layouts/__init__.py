"""The three layouts of a ragged batch and the metadata they share.

* :class:`Packed`: ``values (total, *feature)`` + ``offsets (B + 1,)``; elementwise ops and
  segment reductions.
* :class:`Padded`: ``data (B, *padded_shape, *feature)`` + sizes, mask derived; batched matmul,
  attention.
* :class:`TensorList`: a list of ``B`` tensors; construction and per-sample Python code.
"""

from nestbatch.layouts.base import Layout, RaggedLayout
from nestbatch.layouts.packed import Packed
from nestbatch.layouts.padded import Padded
from nestbatch.layouts.partition import RowPartition
from nestbatch.layouts.sizes import NestedSize, RaggedSize
from nestbatch.layouts.tensor_list import TensorList

__all__ = [
    "Layout", "NestedSize", "Packed", "Padded", "RaggedLayout", "RaggedSize", "RowPartition",
    "TensorList",
]
