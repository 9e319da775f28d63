"""NLP pipeline: token ids of different lengths -> EmbeddingBag (one vector per sentence) and an
LSTM (one vector per token), with no manual padding or offsets.

Run: ``python examples/nlp_pipeline.py``
"""

from __future__ import annotations

import torch
from torch import nn

import nestbatch

VOCAB = ["<pad>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away"]


def tokenize(sentence: str) -> torch.Tensor:
    """Token ids of a whitespace-split sentence."""
    return torch.tensor([VOCAB.index(word) for word in sentence.split()])


def main() -> None:
    torch.manual_seed(0)
    sentences = ["the cat sat on the mat", "a dog ran", "the dog ran far away", "cat"]
    tokens = nestbatch.nested([tokenize(s) for s in sentences])  # packed: values + offsets
    print("lengths:", tokens.lengths.tolist(), "offsets:", tokens.offsets.tolist())

    # One bag embedding per sentence: the batch's packed ids and offsets go straight in.
    bag = nn.EmbeddingBag(len(VOCAB), 8, mode="mean")
    sentence_vectors = bag(tokens)
    print("sentence vectors:", tuple(sentence_vectors.shape))

    # Per-token embeddings (packed rows), then an LSTM over each sentence.
    embedding = nn.Embedding(len(VOCAB), 8)
    token_vectors = tokens.with_values(embedding(tokens.values))
    lstm = nn.LSTM(8, 16, batch_first=True)
    outputs, (h_n, _) = lstm(token_vectors)
    print("LSTM outputs per token:", outputs.lengths.tolist(), "x", tuple(outputs.feature_shape))
    print("final states:", tuple(h_n.shape))

    # A tagging loss over the padded outputs, padded slots ignored.
    tagger = nn.Linear(16, 3)
    logits = tagger(outputs.to_padded_tensor(0.0))
    targets = outputs.with_values(torch.randint(0, 3, (outputs.values.shape[0],)))
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, 3), targets.to_padded_tensor(-100).reshape(-1), ignore_index=-100
    )
    loss.backward()
    print(f"tagging loss: {loss.item():.4f}")


if __name__ == "__main__":
    main()
