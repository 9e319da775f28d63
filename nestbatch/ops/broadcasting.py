"""Broadcasting between a batch and its operands, as TensorFlow's ragged broadcasting (7.2).

The operands of an elementwise op line up with the batch's dims from the right, as in NumPy:

* a Python scalar or a 0-d tensor combines with every element;
* a dense tensor with at most as many dims as the feature dims broadcasts over the features;
* a longer dense tensor ``(b, *r, *f)`` must have size 1 on every ragged dim (``r``) and ``b``
  equal to 1 or to the batch size: ``(B, 1)`` is one value per sample, spread over its rows;
* another batch must have the same row structure (per-sample ragged shapes) and as many dims;
  the feature dims broadcast as dense dims do (sizes 1 spread).

With the ragged dim moved to logical dim ``r > 1`` (:attr:`~nestbatch.NestedBatch.ragged_dim`),
a dense operand may span only the logical dims after the ragged one (they are the trailing
stored dims), and another batch must present its ragged dim at the same position with as many
dims. Anything else raises a ``ValueError`` naming the dim and both sizes (TF: "Unable to
broadcast: dimension size mismatch"). :func:`packed_operand` turns every operand into a tensor that
broadcasts against the packed values ``(total, *feature)``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.ops.common import check_same_structure, is_batch


def feature_ndim(batches: list[NestedBatch]) -> int:
    """The largest number of feature dims among ``batches`` (the result's)."""
    return max(len(b.feature_shape) for b in batches)


def packed_operand(x: Any, ref: NestedBatch, nf: int) -> Any:
    """``x`` as an operand that broadcasts against ``ref``'s packed values.

    Parameters
    ----------
    x : NestedBatch, Tensor or any
        The operand; anything that is neither a batch nor a tensor is returned unchanged.
    ref : NestedBatch
        The batch whose row structure the result has.
    nf : int
        Number of feature dims of the result (so batches with fewer feature dims line up).

    Returns
    -------
    Tensor or any
        A tensor ``(total, *feature)`` for a batch (of ``nf`` feature dims, else ``ValueError``),
        ``(total, *1, *feature)`` for a per-sample tensor, a tensor over the feature dims for a
        feature tensor, ``x`` itself otherwise.
    """
    if ref.ragged_dim != 1 or (is_batch(x) and x.ragged_dim != 1):
        _check_moved_operand(x, ref)
    if is_batch(x):
        if len(x.feature_shape) != nf:
            # Per sample, torch would line the shorter one's ragged dim up with a feature dim
            # of the other: no rule for a batch (torch.nested and TF refuse it too).
            raise ValueError(
                f"Unable to broadcast: the batches of an elementwise op have different numbers "
                f"of dims ({x.dim()} and {x.dim() - len(x.feature_shape) + nf}); unsqueeze "
                "the one with fewer first"
            )
        check_same_structure(ref, x, "the two batches of an elementwise op")
        return x.packed().values
    if isinstance(x, Tensor) and x.dim() > nf:
        return _dense_per_sample(x, ref, nf)
    return x


def _check_moved_operand(x: Any, ref: NestedBatch) -> None:
    # Stored dims line up with logical ones from the right only after the ragged dim.
    if is_batch(x):
        if x.ragged_dim != ref.ragged_dim or x.dim() != ref.dim():
            raise ValueError(
                "Unable to broadcast: the two batches of an elementwise op present their ragged "
                f"dims at different positions (dim {ref.ragged_dim} of {ref.dim()} and dim "
                f"{x.ragged_dim} of {x.dim()}); transpose them to the same layout first"
            )
        return
    trailing = ref.dim() - 1 - ref.ragged_dim
    if isinstance(x, Tensor) and x.dim() > trailing:
        raise ValueError(
            f"Unable to broadcast: a dense tensor of shape {tuple(x.shape)} would reach the "
            f"ragged dim at logical dim {ref.ragged_dim} (only the {trailing} dim(s) after it "
            f"broadcast); transpose the ragged dim back to dim 1 first (e.g. "
            f"x.transpose(1, {ref.ragged_dim}))"
        )


def _dense_per_sample(x: Tensor, ref: NestedBatch, nf: int) -> Tensor:
    k = ref.num_ragged_dims
    full = 1 + k + nf
    if x.dim() > full:
        raise ValueError(
            f"cannot broadcast a dense tensor of shape {tuple(x.shape)} ({x.dim()} dims) with a "
            f"batch of {full} dims: the result would have more dims than the batch"
        )
    x = x.reshape(*([1] * (full - x.dim())), *x.shape)
    for d in range(1, 1 + k):
        if x.shape[d] != 1:
            raise ValueError(
                f"Unable to broadcast: dimension size mismatch in ragged dim {d}: the dense "
                f"operand has size {x.shape[d]} there, but a ragged dim only broadcasts with "
                "size 1 (use a (B, 1) tensor for one value per sample)"
            )
    if x.shape[0] not in (1, ref.batch_size):
        raise ValueError(
            f"Unable to broadcast: dimension size mismatch in dim 0: the dense operand has "
            f"{x.shape[0]} rows but the batch has {ref.batch_size} samples"
        )
    per_sample = x.reshape(x.shape[0], *x.shape[1 + k :])
    if x.shape[0] == 1:
        return per_sample
    # One value per sample, repeated over the sample's packed rows.
    return per_sample.index_select(0, ref.row_ids.to(x.device))


def broadcast_error(exc: RuntimeError, batch: NestedBatch, others: list[Any]) -> ValueError:
    """A clear error for feature dims that do not broadcast (torch's message kept as cause)."""
    shapes = [
        f"batch feature shape {tuple(o.feature_shape)}" if is_batch(o) else
        f"tensor shape {tuple(o.shape)}"
        for o in others
        if is_batch(o) or isinstance(o, Tensor)
    ]
    return ValueError(
        "Unable to broadcast: dimension size mismatch in the feature dims of a batch with "
        f"feature shape {tuple(batch.feature_shape)} and {', '.join(shapes)} ({exc})"
    )
