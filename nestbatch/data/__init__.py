"""Padding-free training: batching by token budget, per-token metadata, causal targets, losses.

* :class:`TokenBudgetBatchSampler`: a ``DataLoader`` batch sampler that buckets samples by
  length under a ``max_tokens`` budget, shuffles with a seed and ``set_epoch``, and gives every
  data-parallel rank the same number of batches.
* :func:`token_positions`, :func:`sequence_ids`, :func:`cu_seqlens`, :func:`max_length`: the
  per-token metadata of a batch of sequences, cached on its partition;
  :func:`flattened_inputs`: the inputs HuggingFace's ``DataCollatorWithFlattening`` produces.
* :func:`causal_lm_targets`: next-token targets shifted inside every sample.
* :func:`token_cross_entropy`, :func:`token_count`, :func:`global_token_count`,
  :func:`normalized_loss`: token-count loss normalisation over micro-batches and ranks.
* :func:`from_left_padded`, :func:`to_left_padded`: left-padded prompts to and from a batch;
  :func:`sliding_window_mask`: local attention within each sample.

The recipe and its pitfalls: ``docs/padding_free_training.rst``.
"""

from nestbatch.data.loss import (
    global_token_count,
    normalized_loss,
    token_count,
    token_cross_entropy,
)
from nestbatch.data.sampler import SamplerStats, TokenBudgetBatchSampler
from nestbatch.data.tokens import (
    causal_lm_targets,
    cu_seqlens,
    flattened_inputs,
    from_left_padded,
    max_length,
    sequence_ids,
    sliding_window_mask,
    to_left_padded,
    token_positions,
)

__all__ = [
    "SamplerStats",
    "TokenBudgetBatchSampler",
    "causal_lm_targets",
    "cu_seqlens",
    "flattened_inputs",
    "from_left_padded",
    "global_token_count",
    "max_length",
    "normalized_loss",
    "sequence_ids",
    "sliding_window_mask",
    "to_left_padded",
    "token_count",
    "token_cross_entropy",
    "token_positions",
]
