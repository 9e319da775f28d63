"""Left and right padding: the same samples with their padding after or before them.

Every conversion and op of nestbatch is written for right padding; a left-padded
:class:`~nestbatch.layouts.Padded` (decoder-only language models batch prompts so) is turned
into a right-padded one at the boundary, and back where asked for. Both ways are one ``gather``
along the ragged dim, differentiable, whose padded slots keep the source's filler.
"""

from __future__ import annotations

import torch

from nestbatch.layouts import Padded

__all__ = ["to_side"]


def to_side(padded: Padded, side: str) -> Padded:
    """``padded`` with its padding on ``side`` (``"right"`` or ``"left"``); itself if already.

    Row ``t`` of sample ``b`` (length ``n_b``, padded width ``L``) moves by ``L - n_b``: a cyclic
    shift per sample, so the slots that become padding receive the source's padding slots (the
    filler, when known, carries over).
    """
    if padded.padding_side == side:
        return padded
    data = padded.data
    batch, width = data.shape[:2]
    shift = width - padded.partition.lengths  # (B,): the left padding of each sample
    slots = torch.arange(width, device=data.device)
    source = slots - shift[:, None] if side == "left" else slots + shift[:, None]
    index = source.remainder(width) if width else source
    index = index.view(batch, width, *([1] * (data.dim() - 2))).expand(data.shape)
    moved = data.gather(1, index) if data.numel() else data.clone()
    return Padded.trusted(moved, padded.partition, padded.padding_value, side)
