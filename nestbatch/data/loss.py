"""Token-count loss normalisation: the gradient of one big batch, from micro-batches and ranks.

A mean over each micro-batch's tokens, averaged over micro-batches and ranks, weighs a token of a
short micro-batch more than one of a long micro-batch: the gradient is not the big batch's. The
big batch's mean token loss is ``sum of every token's loss / number of tokens``; so each
micro-batch contributes its loss *sum* and the divisor is the *global* count of target tokens,
known before the forward pass (it depends on the targets only) and summed across ranks with one
``all_reduce`` per optimizer step::

    micro_batches = [next(loader) for _ in range(accumulation_steps)]
    targets = [causal_lm_targets(b) for b in micro_batches]
    count = global_token_count([token_count(t) for t in targets])  # one all_reduce
    for i, (batch, target) in enumerate(zip(micro_batches, targets)):
        sync = ddp_model.no_sync() if i < len(micro_batches) - 1 else contextlib.nullcontext()
        with sync:
            loss_sum, _ = token_cross_entropy(ddp_model(batch), target)
            normalized_loss(loss_sum, count).backward()
    optimizer.step()
    optimizer.zero_grad()
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.checks import check_integer_tensor
from nestbatch.kernels.checks import negative_error

__all__ = ["global_token_count", "normalized_loss", "token_count", "token_cross_entropy"]

_HALF = (torch.float16, torch.bfloat16)


def _flat_targets(targets: NestedBatch | Tensor) -> Tensor:
    """The class indices, flat; ``TypeError`` for float, complex or bool ones (torch's
    ``cross_entropy`` refuses them as indices: truncated, they would name other classes)."""
    if isinstance(targets, NestedBatch):
        flat = targets.values.reshape(-1)
    elif isinstance(targets, Tensor):
        flat = targets.reshape(-1)
    else:
        raise TypeError(
            f"targets must be a NestedBatch or a tensor of class indices, got "
            f"{type(targets).__name__}"
        )
    return check_integer_tensor(flat, "targets")


def token_count(targets: NestedBatch | Tensor, ignore_index: int = -100) -> Tensor:
    """The number of target tokens that count in the loss (not ``ignore_index``).

    Returns
    -------
    Tensor
        A 0-d int64 tensor on the targets' device (no host sync).
    """
    return (_flat_targets(targets) != ignore_index).sum()


def token_cross_entropy(
    logits: NestedBatch | Tensor,
    targets: NestedBatch | Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Cross-entropy summed over the tokens of a batch, and the number of tokens summed.

    Parameters
    ----------
    logits : NestedBatch or Tensor
        ``(B, j, V)`` batch (samples ``(L_i, V)``), or a tensor ``(..., V)`` (the packed
        ``(total, V)``, or padded ``(B, L, V)``).
    targets : NestedBatch or Tensor
        Class indices of the same tokens: a batch of samples ``(L_i,)`` with the logits' lengths
        (:func:`~nestbatch.data.causal_lm_targets` makes one over the logits' partition), or a
        tensor of the logits' leading shape.
    ignore_index : int, default -100
        Targets that add nothing (nor count).
    label_smoothing : float, default 0.0
        As ``F.cross_entropy``'s.

    Returns
    -------
    loss_sum : Tensor
        0-d, float32 for float16 / bfloat16 logits (they are upcast: a sum over many tokens in
        half precision loses the small ones), else the logits' dtype. Differentiable.
    token_count : Tensor
        0-d int64: the targets that are not ``ignore_index`` (on the device; no sync).

    Raises
    ------
    ValueError
        If the logits and targets hold different numbers of tokens or lengths.
    """
    if isinstance(logits, NestedBatch) and isinstance(targets, NestedBatch):
        _check_same_lengths(logits, targets)
    scores = logits.values if isinstance(logits, NestedBatch) else logits
    if not isinstance(scores, Tensor) or scores.dim() < 1:
        raise TypeError(
            f"logits must be a NestedBatch or a tensor (..., V), got {type(logits).__name__}"
        )
    scores = scores.reshape(-1, scores.shape[-1])
    flat = _flat_targets(targets)
    if flat.shape[0] != scores.shape[0]:
        raise ValueError(
            f"logits and targets must hold the same tokens: logits have {scores.shape[0]} rows "
            f"of {scores.shape[-1]} classes, targets {flat.shape[0]} entries"
        )
    if scores.dtype in _HALF:
        scores = scores.float()
    loss = F.cross_entropy(scores, flat.to(torch.int64), ignore_index=ignore_index,
                           reduction="sum", label_smoothing=label_smoothing)
    return loss, (flat != ignore_index).sum()


def _check_same_lengths(logits: NestedBatch, targets: NestedBatch) -> None:
    a, b = logits.partition, targets.partition
    if a is b:  # targets made over the logits' partition: nothing to compare
        return
    if a.knows_host_shapes and b.knows_host_shapes:
        same = a.host_shapes == b.host_shapes
    else:
        same = a.batch_size == b.batch_size and torch.equal(a.offsets.to(torch.int64),
                                                            b.offsets.to(a.device, torch.int64))
    if not same:
        raise ValueError("logits and targets must be batches of the same sample lengths")


def global_token_count(
    counts: Tensor | int | Sequence[Tensor | int], group: dist.ProcessGroup | None = None
) -> Tensor:
    """The token count of one optimizer step: every micro-batch's, summed over all ranks.

    Parameters
    ----------
    counts : Tensor, int or sequence of them
        This rank's counts (one per micro-batch, from :func:`token_count` or
        :func:`token_cross_entropy`).
    group : ProcessGroup, optional
        The data-parallel group (default: the default group). Without an initialized process
        group the local sum is returned.

    Returns
    -------
    Tensor
        0-d int64, the same on every rank: one ``all_reduce`` (sum) of one number, on the
        counts' device (a CUDA tensor for NCCL). Collective: every rank of the group calls it.
    """
    items = counts if isinstance(counts, Sequence) else [counts]
    if not items:
        raise ValueError("counts must hold at least one micro-batch's count, got none")
    tensors = [_count_tensor(c, "counts") for c in items]
    device = tensors[0].device
    total = torch.stack([t.to(device, torch.int64).reshape(()) for t in tensors]).sum()
    if _world_size(group) > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


def normalized_loss(
    loss_sum: Tensor, global_count: Tensor | int, group: dist.ProcessGroup | None = None
) -> Tensor:
    """This rank's micro-batch loss scaled so that the step's gradient is one big batch's.

    ``loss_sum * world_size / global_count``. The gradients of a step's micro-batches add up
    (accumulation), and DistributedDataParallel *averages* the ranks' gradients, dividing their
    sum by ``world_size``: the factor ``world_size`` cancels that division, so the parameters
    receive ``sum over every token of every rank of grad(loss) / global_count``, the gradient of
    the mean token loss of all the step's tokens together. (Without DDP, or when gradients are
    summed rather than averaged, divide by ``global_count`` alone: ``group`` of one rank.)

    Parameters
    ----------
    loss_sum : Tensor
        The micro-batch's summed loss (:func:`token_cross_entropy`).
    global_count : Tensor or int
        :func:`global_token_count` of the step. A count of 0 (every target ignored) gives a loss
        of 0, not NaN.
    group : ProcessGroup, optional
        The data-parallel group whose size DDP divides by (default: the default group; 1
        without an initialized process group).
    """
    count = _count_tensor(global_count, "global_count").to(loss_sum.device).clamp_min(1)
    if loss_sum.dtype in _HALF:
        # A count past 65504 is inf in float16: divide in float32 (as torch's own division of
        # a half tensor by an integer one computes), round once.
        scaled = loss_sum.float() * _world_size(group) / count.float()
        return scaled.to(loss_sum.dtype)
    return loss_sum * _world_size(group) / count.to(loss_sum.dtype)


def _count_tensor(count: object, name: str) -> Tensor:
    """A token count (an int, or a one-element integer tensor) as a tensor; ``TypeError`` for
    anything else (a float or bool would be truncated), ``ValueError`` for a negative count
    the host holds (a device one is not read)."""
    if isinstance(count, Tensor):
        check_integer_tensor(count, name)
        if count.numel() != 1:
            raise ValueError(f"{name}: a count is one number, got shape {tuple(count.shape)}")
        if count.is_cpu and int(count) < 0:
            raise negative_error(name, int(count))
        return count
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):
        raise TypeError(f"{name} must hold ints or integer tensors, got {type(count).__name__}")
    if count < 0:
        raise negative_error(name, count)
    return torch.tensor(int(count))


def _world_size(group: dist.ProcessGroup | None) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)
