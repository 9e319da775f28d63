"""The compat wing: other vocabularies and formats on top of the front object and its ops.

The ``RaggedBatch`` API (:mod:`~nestbatch.compat.ragged_batch`,
:mod:`~nestbatch.compat.batching_helpers`), kaolin's and PyTorch3D's batching helpers,
TensorFlow's ragged vocabulary, torch's other ragged formats (``PackedSequence``,
``torch.nested``), DataLoader collation and ``torch.distributed`` collectives. Nothing below
this package imports it.

The batch's own class body speaks torch; the other vocabularies it answers to are attached
here, in one place: TensorFlow's names (:data:`nestbatch.compat.tensorflow.METHODS`) and the
``RaggedBatch`` conversions (:data:`nestbatch.compat.ragged_batch.METHODS`).
"""

from nestbatch.batch import NestedBatch
from nestbatch.compat import ragged_batch, tensorflow

for _name, _member in {**tensorflow.METHODS, **ragged_batch.METHODS}.items():
    setattr(NestedBatch, _name, _member)
del _name, _member
