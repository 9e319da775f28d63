"""``torch.autograd.backward`` and ``torch.autograd.grad`` on batches, as on torch.nested's.

Both reach a batch through ``__torch_function__``. A batch output is differentiated through its
packed rows (``b.packed().values``: every layout converts to them differentiably), against the
packed rows of its gradient, a batch of the same samples' shapes; a batch input stands for the
tensors it stores (:meth:`~nestbatch.NestedBatch.stored`), and ``grad`` returns its gradient as
a batch of the same structure (:meth:`~nestbatch.NestedBatch.with_stored`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from nestbatch.batch import NestedBatch
from nestbatch.layouts import Layout
from nestbatch.ops.common import check_same_structure
from nestbatch.ops.registry import register

_ANY_LAYOUT = tuple(Layout)


def _as_tuple(items: Any) -> tuple:
    if items is None:
        return ()
    if isinstance(items, (Tensor, NestedBatch)):
        return (items,)
    return tuple(items)


def _output_rows(output: Any) -> Any:
    return output.packed().values if isinstance(output, NestedBatch) else output


def _gradient_rows(output: Any, gradient: Any, index: int) -> Any:
    """The gradient of ``output`` as the tensor :func:`_output_rows` gives for it."""
    if not isinstance(output, NestedBatch):
        if isinstance(gradient, NestedBatch):
            raise TypeError(f"grad_tensors[{index}] is a NestedBatch for a tensor output")
        return gradient
    if gradient is None:
        raise RuntimeError(
            "grad can be implicitly created only for scalar outputs: a NestedBatch is not one; "
            f"give its gradient (grad_tensors[{index}]), a batch of the same samples' shapes "
            "such as torch.ones_like(output)"
        )
    if not isinstance(gradient, NestedBatch):
        raise TypeError(
            f"grad_tensors[{index}] must be a NestedBatch for a NestedBatch output, got "
            f"{type(gradient).__name__}"
        )
    check_same_structure(output, gradient, f"output {index} and its gradient")
    if gradient.ragged_dim != output.ragged_dim or gradient.feature_shape != output.feature_shape:
        raise RuntimeError(
            f"grad_tensors[{index}] has shape {gradient.shape}, the output {output.shape}: "
            "they must match"
        )
    return gradient.packed().values


def _gradient_pairs(outputs: tuple, gradients: Any) -> tuple[list, list]:
    gradients = _as_tuple(gradients) or (None,) * len(outputs)
    if len(gradients) != len(outputs):
        raise RuntimeError(
            f"got {len(gradients)} gradients for {len(outputs)} outputs: give one per output"
        )
    rows = [_output_rows(out) for out in outputs]
    grads = [_gradient_rows(out, g, i) for i, (out, g) in enumerate(zip(outputs, gradients))]
    return rows, grads


def _input_tensors(inputs: Sequence[Any]) -> list[Any]:
    flat = []
    for item in inputs:
        flat.extend(item.stored() if isinstance(item, NestedBatch) else (item,))
    return flat


@register(torch.autograd.backward, layouts=_ANY_LAYOUT, moved_ragged=True, nested=True)
def _backward(layout: Layout, func: Any, args: tuple, kwargs: dict) -> None:
    outputs = _as_tuple(args[0])
    rows, grads = _gradient_pairs(outputs, kwargs.get("grad_tensors"))
    inputs = kwargs.get("inputs")
    torch.autograd.backward(
        rows, grads, retain_graph=kwargs.get("retain_graph"),
        create_graph=kwargs.get("create_graph", False),
        inputs=None if inputs is None else _input_tensors(_as_tuple(inputs)),
    )


@register(torch.autograd.grad, layouts=_ANY_LAYOUT, moved_ragged=True, nested=True)
def _grad(layout: Layout, func: Any, args: tuple, kwargs: dict) -> tuple[Any, ...]:
    outputs, inputs = _as_tuple(args[0]), _as_tuple(args[1])
    rows, grads = _gradient_pairs(outputs, kwargs.pop("grad_outputs", None))
    flat = torch.autograd.grad(rows, _input_tensors(inputs), grads, **kwargs)
    results, at = [], 0
    for item in inputs:
        if not isinstance(item, NestedBatch):
            results.append(flat[at])
            at += 1
            continue
        stored = item.stored()
        mine = flat[at : at + len(stored)]
        at += len(stored)
        if all(g is None for g in mine):
            results.append(None)  # unused (allow_unused=True)
        else:
            results.append(item.with_stored([
                torch.zeros_like(t) if g is None else g for t, g in zip(stored, mine)
            ]))
    return tuple(results)
