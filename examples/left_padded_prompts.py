"""Prompts of different lengths, left-padded as a decoder-only language model takes them, and
the model's next-token logits read back per prompt.

Run: ``python examples/left_padded_prompts.py``
"""

from __future__ import annotations

import torch

from nestbatch import NestedBatch

PAD = 0


def main() -> None:
    torch.manual_seed(0)
    prompts = NestedBatch.from_lengths(torch.randint(1, 50, (9,)), [4, 2, 3])
    ids = prompts.to_padded_tensor(PAD, padding_side="left")  # (B, L): prompts end at L - 1
    attention_mask = prompts.padded(PAD, padding_side="left").mask
    print("left-padded ids:", ids.tolist())
    print("attention mask:", attention_mask.int().tolist())
    # A stand-in model: logits for every position; the next token comes from the last one.
    embed, head = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50)
    logits = head(embed(ids))  # (B, L, vocab)
    next_token = logits[:, -1].argmax(-1)  # every prompt's last position is column L - 1
    # Read the model's outputs back per prompt: the batch of its real positions.
    per_prompt = NestedBatch.from_padded(logits, prompts.lengths, padding_side="left")
    same = torch.equal(per_prompt.unbind()[1][-1], logits[1, -1])
    print("next tokens:", next_token.tolist(), "last position read back:", same)


if __name__ == "__main__":
    main()
