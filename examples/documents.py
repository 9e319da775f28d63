"""Documents of sentences of tokens (ragged rank 2): token embeddings mean-pooled into sentence
vectors, sentence vectors into document vectors, with no loop over documents or sentences.

Run: ``python examples/documents.py``
"""

from __future__ import annotations

import torch

from nestbatch import NestedBatch


def main() -> None:
    torch.manual_seed(0)
    # 3 documents: 2 sentences (4 and 2 tokens), 1 sentence (3 tokens), 3 sentences (1, 5, 2).
    sentences_per_doc = [2, 1, 3]
    tokens_per_sentence = [4, 2, 3, 1, 5, 2]
    token_ids = torch.randint(0, 100, (sum(tokens_per_sentence),))
    embed = torch.nn.Embedding(100, 8)
    docs = NestedBatch.from_nested_row_lengths(
        embed(token_ids), (sentences_per_doc, tokens_per_sentence)
    )
    print("ragged rank:", docs.ragged_rank, "documents:", len(docs))
    sentences = torch.mean(docs, dim=2)  # over the tokens: a batch of sentence vectors
    print("sentences per document:", sentences.lengths.tolist())
    document_vectors = torch.mean(sentences, dim=1)  # over the sentences
    print("document vectors:", tuple(document_vectors.shape))
    padded = docs.to_tensor(0.0)
    print("padded to (B, max sentences, max tokens, features):", tuple(padded.shape))


if __name__ == "__main__":
    main()
