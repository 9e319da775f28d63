"""The elementwise losses of ``torch.nn.functional`` on batches, computed on the packed values.

``F.mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss``, ``binary_cross_entropy``,
``binary_cross_entropy_with_logits``, ``kl_div``, ``poisson_nll_loss``, ``gaussian_nll_loss``,
``soft_margin_loss``, ``hinge_embedding_loss`` and ``margin_ranking_loss`` (and the ``nn.*Loss``
modules, which call them) take a batch where torch takes a tensor, with torch's semantics for a
tensor of the batch's logical shape:

* the operands are batches of one row structure, or a batch and dense tensors that broadcast as
  in an elementwise op (:mod:`nestbatch.ops.broadcasting`); torch's checks of their sizes run on
  the logical shapes (``mse_loss`` warns for a target of another size, ``binary_cross_entropy``
  raises, ``margin_ranking_loss`` wants as many dims in each, ``gaussian_nll_loss`` takes
  ``var`` of the input's size, of it without the last dim, or with one dim of size 1);
* the loss itself is torch's, on the packed values ``(total, *feature)``: padding is never
  computed on, and dtypes, special values and errors (inputs outside ``[0, 1]`` for
  ``binary_cross_entropy``, ...) are torch's own;
* ``reduction="none"`` gives a batch of the operands' structure; ``"mean"`` / ``"sum"`` reduce
  every element of every sample, so the result is torch's loss of all the samples' elements
  concatenated (the mean of no element is NaN, as torch's); ``kl_div``'s ``"batchmean"`` divides
  the sum by ``input.size(0)``, the number of samples, as torch's does; the legacy
  ``size_average`` / ``reduce`` arguments map to a reduction as torch maps them.

The ragged dim may be moved (``b.transpose(1, 2)``: every operand presents it at the same
position, dense operands span the dims after it only) and batches may be of ragged rank 2:
the loss is elementwise, so the stored order of the packed values does not change it.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import _reduction as torch_reduction

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Layout
from nestbatch.layouts.sizes import RaggedSize
from nestbatch.ops.broadcasting import broadcast_error, feature_ndim, packed_operand
from nestbatch.ops.common import check_same_structure, is_batch
from nestbatch.ops.registry import register

Operand = Tensor | NestedBatch

_REGRESSION = (F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss)
_BINARY = (F.binary_cross_entropy, F.binary_cross_entropy_with_logits)
_POINTWISE = (F.poisson_nll_loss, F.soft_margin_loss, F.hinge_embedding_loss,
              F.margin_ranking_loss)
_SIGNATURES = {func: inspect.signature(func) for func in
               (*_REGRESSION, *_BINARY, *_POINTWISE, F.kl_div, F.gaussian_nll_loss)}

#: Arguments that are not handed on as they are: the operands, and what picks the reduction.
_HANDLED = frozenset({"input", "input1", "input2", "target", "weight", "pos_weight", "var",
                      "size_average", "reduce", "reduction"})

_SIZE_WARNING = ("Using a target size ({}) that is different to the input size ({}). This will "
                 "likely lead to incorrect results due to broadcasting. Please ensure they have "
                 "the same size.")
_KL_MEAN_WARNING = ("reduction: 'mean' divides the total loss by both the batch size and the "
                    "support size.'batchmean' divides only by the batch size, and aligns with the "
                    "KL div math definition.'mean' will be changed to behave the same as "
                    "'batchmean' in the next major release.")


# =========================================================================== the losses
@register(*_REGRESSION, layouts=(Layout.PACKED,), moved_ragged=True, nested=True)
def _regression(layout: Layout, func: Callable, args: tuple, kwargs: dict) -> Any:
    """``mse_loss``, ``l1_loss``, ``smooth_l1_loss``, ``huber_loss`` (``nn.MSELoss``, ...).

    A target of another logical size than the input gets torch's warning, then broadcasts.
    ``weight`` (``mse_loss``, ``huber_loss``) must have the input's size; as torch's, the
    weighted mean divides by the sum of the weights (``huber_loss``: by the number of
    elements). ``F.l1_loss`` of torch 2.13 leaves its ``weight`` out of the call it hands a
    batch (its ``handle_torch_function`` call names every other argument), so its weight never
    arrives here: weigh ``F.l1_loss(x, y, reduction="none")`` instead. Were it handed on, it
    would be taken as ``mse_loss``'s is.
    """
    given = _arguments(func, args, kwargs)
    ref = _reference(func, given)
    input, target, weight = given["input"], given["target"], given.get("weight")
    if _shape(target) != _shape(input):
        _warn(_SIZE_WARNING.format(target.size(), input.size()))
    reduction = _reduction(given)
    x, y = _broadcast(given, ("input", "target"), ref)
    if weight is None:
        return _finish(ref, func(x, y, reduction=reduction, **_rest(given)), reduction)
    if _shape(weight) != _shape(input):
        raise ValueError("Weights and input must have the same size.")
    # torch computes the weighted forms in Python, from the unweighted loss of each element.
    weighted = func(x, y, reduction="none", **_rest(given)) * _packed(given, ("weight",), ref)[0]
    if reduction == "none":
        return ref.with_values(weighted)
    if reduction == "sum":
        return torch.sum(weighted)
    if reduction == "mean":
        if func is F.huber_loss:
            return weighted.mean()
        # The sum of the weights as given: a dense weight spread over the rows counts once.
        total = weight.packed().values.sum() if is_batch(weight) else torch.sum(weight)
        return torch.sum(weighted) / total
    raise ValueError(
        f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', 'sum'."
    )


@register(*_BINARY, layouts=(Layout.PACKED,), moved_ragged=True, nested=True)
def _binary_cross_entropy(layout: Layout, func: Callable, args: tuple, kwargs: dict) -> Any:
    """``binary_cross_entropy`` / ``_with_logits`` (``nn.BCELoss``, ``nn.BCEWithLogitsLoss``).

    The target must have the input's logical size (a ``ValueError`` otherwise, as torch's);
    ``weight`` and ``pos_weight`` broadcast as torch broadcasts them (a batch of the same
    structure, a tensor over the feature dims, a ``(B, 1, ...)`` tensor per sample).
    """
    given = _arguments(func, args, kwargs)
    ref = _reference(func, given)
    input, target = given["input"], given["target"]
    reduction = _reduction(given)
    if _shape(target) != _shape(input):
        if func is F.binary_cross_entropy:
            raise ValueError(
                f"Using a target size ({target.size()}) that is different to the input size "
                f"({input.size()}) is deprecated. Please ensure they have the same size."
            )
        raise ValueError(
            f"Target size ({target.size()}) must be the same as input size ({input.size()})"
        )
    names = ("input", "target", "weight", *(("pos_weight",) if "pos_weight" in given else ()))
    x, y, weight, *pos_weight = _packed(given, names, ref)
    extra = {"pos_weight": pos_weight[0]} if pos_weight else {}
    return _finish(ref, func(x, y, weight, reduction=reduction, **extra), reduction)


@register(F.kl_div, layouts=(Layout.PACKED,), moved_ragged=True, nested=True)
def _kl_div(layout: Layout, func: Callable, args: tuple, kwargs: dict) -> Any:
    """``F.kl_div`` / ``nn.KLDivLoss``, ``log_target`` included.

    ``reduction="batchmean"`` is the sum over every element divided by ``input.size(0)``: the
    number of samples of a batch input (torch's rule for a tensor; NaN for an empty batch, as
    torch's ``0 / 0``). ``"mean"`` warns as torch's does.
    """
    given = _arguments(func, args, kwargs)
    ref = _reference(func, given)
    asked = given["reduction"]
    if given["size_average"] is not None or given["reduce"] is not None:
        reduction = _reduction(given)
    else:
        if asked == "mean":
            _warn(_KL_MEAN_WARNING)
        reduction = "sum" if asked == "batchmean" else asked
    enum = torch_reduction.get_enum(reduction)  # (raises torch's ValueError for another name)
    x, y = _broadcast(given, ("input", "target"), ref)
    out = torch.kl_div(x, y, enum, log_target=given["log_target"])
    input = given["input"]
    if asked == "batchmean" and input.dim() != 0:  # (also with the legacy arguments: torch's)
        out = out / input.size(0)
    return _finish(ref, out, reduction)


@register(*_POINTWISE, layouts=(Layout.PACKED,), moved_ragged=True, nested=True)
def _pointwise(layout: Layout, func: Callable, args: tuple, kwargs: dict) -> Any:
    """``poisson_nll_loss``, ``soft_margin_loss``, ``hinge_embedding_loss`` and
    ``margin_ranking_loss`` (three operands, which must have as many dims each, as torch's):
    the operands broadcast without a warning, as torch's do."""
    given = _arguments(func, args, kwargs)
    ref = _reference(func, given)
    names = _main_names(func)
    reduction = _reduction(given)
    if func is F.margin_ranking_loss and len({given[name].dim() for name in names}) > 1:
        sizes = ", ".join(f"{name}: {given[name].size()}" for name in names)
        raise RuntimeError("margin_ranking_loss : All input tensors should have same dimension "
                           f"but got sizes: {sizes} ")
    operands = _broadcast(given, names, ref)
    return _finish(ref, func(*operands, reduction=reduction, **_rest(given)), reduction)


@register(F.gaussian_nll_loss, layouts=(Layout.PACKED,), moved_ragged=True, nested=True)
def _gaussian_nll_loss(layout: Layout, func: Callable, args: tuple, kwargs: dict) -> Any:
    """``F.gaussian_nll_loss`` / ``nn.GaussianNLLLoss``.

    ``var`` is a float, or has the input's logical size, or that size without the last dim (one
    variance per row of features), or the input's dims with exactly one of size 1 where the
    input's differs (a ``(B, 1, D)`` tensor: one per sample; a batch ``(B, j, 1)``); any other
    raises torch's ``ValueError``. torch's own function then runs on the packed values, with
    ``var`` spread over them.
    """
    given = _arguments(func, args, kwargs)
    ref = _reference(func, given)
    x, y = _broadcast(given, ("input", "target"), ref)
    var = given["var"]
    if isinstance(var, Tensor | NestedBatch):
        given["var"] = _homoscedastic(given["input"], var)
        # Spread over the rows: torch's own size check then sees the input's size.
        var = _packed(given, ("var",), ref)[0].expand(x.shape)
    out = func(x, y, var, full=given["full"], eps=given["eps"], reduction=given["reduction"])
    return _finish(ref, out, given["reduction"])


def _homoscedastic(input: Operand, var: Operand) -> Operand:
    """``var`` as torch reads it for ``input`` (one dim added where it lacks the last one).

    Raises
    ------
    ValueError
        torch's "var is of incorrect size".
    """
    want, have = _shape(input), _shape(var)
    if have == want:
        return var
    if want[:-1] == have:
        return var.unsqueeze(-1)
    # One dim where var has size 1 and the input another (torch: the sizes at the dims that
    # differ add up to 1); a ragged size is none of these.
    differ = [h for w, h in zip(want, have) if w != h]
    if len(want) == len(have) and all(isinstance(h, int) for h in differ) and sum(differ) == 1:
        return var
    raise ValueError("var is of incorrect size")


# =========================================================================== the arguments
def _arguments(func: Callable, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Every parameter of ``func``, by name, as the call gives it or defaults it (a
    ``TypeError`` for arguments ``func`` does not take, as Python's)."""
    bound = _SIGNATURES[func].bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _main_names(func: Callable) -> tuple[str, ...]:
    """The operands the loss compares elementwise (the others weigh or scale it)."""
    return ("input1", "input2", "target") if func is F.margin_ranking_loss else ("input", "target")


def _reference(func: Callable, given: dict[str, Any]) -> NestedBatch:
    """The batch whose structure the result has: the first among the compared operands.

    Raises
    ------
    TypeError
        For an operand that is neither a tensor nor a batch (torch refuses a Python number
        there too), or when only a weight (or ``var``) is a batch: a weight is spread over the
        input, not the input over the weight.
    ValueError
        For batches of different row structures.
    """
    main = _main_names(func)
    for name in (*main, "weight", "pos_weight"):
        value = given.get(name)
        if not isinstance(value, Tensor | NestedBatch) and (name in main or value is not None):
            raise TypeError(f"{func.__name__}(): argument '{name}' must be a Tensor or a "
                            f"NestedBatch, not {type(value).__name__}")
    batches = [given[name] for name in main if is_batch(given[name])]
    if not batches:
        raise TypeError(
            f"{func.__name__}: a NestedBatch weight or var needs a NestedBatch among "
            f"{', '.join(main)} (the result has their structure); make the input a batch, or "
            "pass the weight's packed rows (.values) beside packed dense operands"
        )
    ref = batches[0]
    for value in given.values():
        if is_batch(value) and value is not ref:
            check_same_structure(ref, value, f"the batches of {func.__name__}")
    return ref


def _shape(x: Operand) -> tuple:
    """``x``'s logical shape, a token ``("ragged", i)`` at each ragged dim: the batches of one
    call have one structure (checked by :func:`_reference`), so equal tokens are equal sizes,
    and no token equals an int (a dense tensor never has a batch's size)."""
    if is_batch(x):
        return tuple(("ragged", s.index) if isinstance(s, RaggedSize) else s for s in x.shape)
    return tuple(x.shape)


def _reduction(given: dict[str, Any]) -> str:
    """``reduction``, or the one torch reads from the legacy ``size_average`` / ``reduce``
    arguments (with torch's deprecation warning)."""
    size_average, reduce = given.get("size_average"), given.get("reduce")
    if size_average is None and reduce is None:
        return given["reduction"]
    reduction = torch_reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    _warn(f"size_average and reduce args will be deprecated, please use reduction='{reduction}' "
          "instead.", depth=1)
    return reduction


def _rest(given: dict[str, Any]) -> dict[str, Any]:
    """The loss's own parameters (``beta``, ``delta``, ``margin``, ``log_input``, ...)."""
    return {name: value for name, value in given.items() if name not in _HANDLED}


def _packed(given: dict[str, Any], names: Sequence[str], ref: NestedBatch) -> list[Any]:
    """The named operands as tensors that broadcast against ``ref``'s packed values (None
    stays None; see :func:`nestbatch.ops.broadcasting.packed_operand`)."""
    nf = feature_ndim([value for value in given.values() if is_batch(value)])
    return [packed_operand(given[name], ref, nf) for name in names]


def _broadcast(given: dict[str, Any], names: Sequence[str],
               ref: NestedBatch) -> tuple[Tensor, ...]:
    """The named operands packed and broadcast to one shape ``(total, *feature)``, as torch
    broadcasts the operands of these losses (so torch's own size checks see equal sizes).

    Raises
    ------
    ValueError
        Naming the logical shapes, where the feature dims do not broadcast.
    """
    operands = _packed(given, names, ref)
    try:
        return torch.broadcast_tensors(*operands)
    except RuntimeError as exc:
        raise broadcast_error(exc, ref, [given[name] for name in names]) from exc


def _finish(ref: NestedBatch, out: Tensor, reduction: str) -> Tensor | NestedBatch:
    """The loss of every element as a batch of ``ref``'s structure, a reduced loss as it is."""
    return ref.with_values(out) if reduction == "none" else out


# =========================================================================== warnings
#: The frames from :func:`_warn` up to the code that called the loss: ``_warn``, the
#: implementation, ``dispatch``, ``NestedBatch.__torch_function__``, torch's
#: ``handle_torch_function``, the ``F`` function; the next one is its caller, where torch's
#: own warnings of these losses point.
_CALLER_OF_THE_LOSS = 7


def _warn(message: str, depth: int = 0) -> None:
    """torch's ``UserWarning``, shown at the line that called the loss (``depth``: the frames
    between the implementation and the caller of ``_warn``)."""
    warnings.warn(message, UserWarning, stacklevel=_CALLER_OF_THE_LOSS + depth)
