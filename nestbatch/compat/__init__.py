"""The compat wing: other vocabularies and formats on top of the front object and its ops.

The ``RaggedBatch`` API (:mod:`~nestbatch.compat.ragged_batch`,
:mod:`~nestbatch.compat.batching_helpers`), kaolin's and PyTorch3D's batching helpers,
TensorFlow's ragged vocabulary, torch's other ragged formats (``PackedSequence``,
``torch.nested``), DataLoader collation and ``torch.distributed`` collectives. Nothing below
this package imports it.
"""
