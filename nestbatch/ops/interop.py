"""``F.embedding_bag`` and the recurrent kernels on a :class:`~nestbatch.NestedBatch`.

EmbeddingBag
    ``nn.EmbeddingBag(...)(batch)`` and ``F.embedding_bag(batch, weight, ...)`` take a batch of
    indices ``(B, (L_i))``: its packed values are the indices and its offsets the bags, exactly
    the manual ``torch.cat`` + offsets call. ``per_sample_weights`` may be a batch of the same
    structure.

RNN / LSTM / GRU
    ``nn.RNN.forward`` (and LSTM's, GRU's) calls ``torch.rnn_tanh`` / ``rnn_relu`` / ``lstm`` /
    ``gru`` with the input it was given; those are torch functions, so a batch reaches
    ``NestedBatch.__torch_function__`` there, and the implementation below runs the kernel on a
    ``PackedSequence`` built from the batch. ``rnn(batch, h0)`` therefore returns
    ``(NestedBatch of outputs, h_n)`` (``(NestedBatch, (h_n, c_n))`` for an LSTM) without any
    patching of torch. Zero-length samples, which a ``PackedSequence`` cannot hold, are left out
    of the kernel: their output is empty and their final state is their initial one.

    A module with ``batch_first=True`` takes a batch as it is. One with ``batch_first=False``
    (time-major, torch's default) reads its batch size as ``input.size(1)``, a ragged dim of a
    batch: :func:`accept_nested_batches` registers a forward pre-hook on such modules that hands
    them the batch as a view whose ``size(1)`` is the batch size. (A hook on every module of the
    process would slow every module call; the answer never depends on who asks.)
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nestbatch.batch import NestedBatch, stored_layout
from nestbatch.conversions.time_major import TimeMajorOrder
from nestbatch.layouts import Layout
from nestbatch.ops.common import check_same_structure
from nestbatch.ops.registry import register

_EMBEDDING_BAG = inspect.signature(F.embedding_bag)


# ============================================================================ embedding_bag
@register(F.embedding_bag, layouts=(Layout.PACKED,))
def _embedding_bag(layout: Layout, func: Any, args: tuple, kwargs: dict) -> Tensor:
    """One bag per sample: ``(B, embedding_dim)``, empty samples give zeros (as torch)."""
    call = _EMBEDDING_BAG.bind(*args, **kwargs).arguments
    batch = call.pop("input")
    if not isinstance(batch, NestedBatch):
        raise TypeError(
            f"F.embedding_bag takes a NestedBatch as input, not as another argument; got input "
            f"of type {type(batch).__name__}"
        )
    if call.get("offsets") is not None:
        raise ValueError("offsets must be None when input is a NestedBatch (its offsets are used)")
    if batch.feature_shape != torch.Size() or batch.num_ragged_dims != 1:
        raise ValueError(
            "input must be a batch of index sequences (one ragged dim, no feature dims), got "
            f"{batch.num_ragged_dims} ragged dim(s) and feature shape "
            f"{tuple(batch.feature_shape)}"
        )
    if call.get("include_last_offset"):
        raise ValueError("include_last_offset must be False when input is a NestedBatch")
    call["per_sample_weights"] = _per_sample_weights(call.get("per_sample_weights"), batch)
    # The batch's offsets include the total: pass them whole instead of slicing off the last.
    call["offsets"] = batch.offsets
    call["include_last_offset"] = True
    return F.embedding_bag(batch.values, **call)


def _per_sample_weights(weights: Any, batch: NestedBatch) -> Tensor | None:
    if not isinstance(weights, NestedBatch):
        return weights
    if weights.batch_size != batch.batch_size or weights.feature_shape != torch.Size():
        raise ValueError(
            "per_sample_weights must have the structure of input: "
            f"{batch.batch_size} samples without feature dims, got {weights.batch_size} samples "
            f"with feature shape {tuple(weights.feature_shape)}"
        )
    # (Weights of other lengths but the same total were applied by position.)
    check_same_structure(batch, weights, "input and per_sample_weights")
    return weights.values


# ============================================================================ RNN / LSTM / GRU
@register(torch.rnn_tanh, torch.rnn_relu, torch.gru, torch.lstm, layouts=(Layout.PACKED,))
def _recurrent(layout: Layout, func: Any, args: tuple, kwargs: dict) -> tuple:
    """The kernel on a PackedSequence of the non-empty samples; outputs spliced back.

    Called by the RNN modules as ``func(input, hx, params, has_biases, num_layers, dropout,
    train, bidirectional, batch_first)`` with ``hx (layers * directions, B, H)`` in sample
    order (a tuple ``(h, c)`` for the LSTM). Returns ``(NestedBatch, h_n)`` or
    ``(NestedBatch, h_n, c_n)``, which the module's ``forward`` hands back as usual.

    Needs the lengths on the host (``batch_sizes`` of a PackedSequence live on the CPU): read
    once if the batch only has them on the device.
    """
    if kwargs or len(args) != 9 or not isinstance(args[0], NestedBatch):
        raise TypeError(
            f"{func.__name__} on a NestedBatch takes (input, hx, params, has_biases, num_layers, "
            "dropout, train, bidirectional, batch_first) with a NestedBatch input, as the nn.RNN "
            "modules call it"
        )
    batch, hx, *settings, _batch_first = args
    if batch.num_ragged_dims != 1:
        raise ValueError(
            "an RNN needs sequences (L_i, features): one ragged dim, got "
            f"{batch.num_ragged_dims}"
        )
    states = tuple(hx) if isinstance(hx, (tuple, list)) else (hx,)
    lengths = batch.partition.host_lengths
    kept = [i for i, n in enumerate(lengths) if n > 0]
    if not kept:  # every sample empty: no rows out (hidden wide, twice if bidirectional)
        values = states[0].new_empty((0, states[0].shape[-1] * (2 if settings[-1] else 1)))
        return (NestedBatch.from_lengths(values, list(lengths), validate=False), *states)
    values = batch.packed().values
    some_empty = len(kept) < len(lengths)
    # Every index the call needs reaches the device in one copy (the order is host work).
    order = TimeMajorOrder([lengths[i] for i in kept], values.device,
                           extra=(torch.tensor(kept, dtype=torch.int64),) if some_empty else ())
    kept_index = order.extra[0] if some_empty else None
    # The initial states of the kept samples, longest first: one gather per state.
    state_index = order.sorted_indices if kept_index is None else \
        kept_index.index_select(0, order.sorted_indices)
    initial = tuple(h.index_select(1, state_index) for h in states)
    result = func(
        values.index_select(0, order.rows),
        order.batch_sizes,
        initial if len(initial) > 1 else initial[0],
        *settings,
    )
    # Empty samples add no rows: the kept samples' rows in order are the whole batch's rows.
    output = batch.with_values(result[0].index_select(0, order.packed_rows))
    finals = tuple(
        _splice(h, state, kept_index, order.unsorted_indices)
        for h, state in zip(result[1:], states)
    )
    return (output, *finals)


def _splice(final: Tensor, initial: Tensor, kept: Tensor | None, unsorted: Tensor) -> Tensor:
    # Back to sample order; empty samples keep their initial state.
    final = final.index_select(1, unsorted)
    return final if kept is None else initial.index_copy(1, kept, final)


# =================================================================== time-major RNN modules
class TimeMajorSequences(NestedBatch):
    """A batch of sequences as a time-major RNN module reads it: ``size(1)`` is the batch size
    (the module's ``(T, B, F)`` convention). Made by the hook of :func:`accept_nested_batches`;
    everything else is the batch's own (the recurrent kernels above run on it)."""

    def size(self, dim: int | None = None) -> int:
        if dim is not None and -self.dim() <= dim < self.dim() and dim % self.dim() == 1:
            return self.batch_size
        return super().size(dim)


def accept_nested_batches(module: torch.nn.Module) -> torch.nn.Module:
    """Let the time-major RNN modules in ``module`` take a :class:`~nestbatch.NestedBatch`.

    Registers, once per module, a forward pre-hook on every ``nn.RNN`` / ``nn.LSTM`` /
    ``nn.GRU`` with ``batch_first=False`` in ``module`` (itself included) that hands a batch of
    sequences to the module as a :class:`TimeMajorSequences` view. Modules with
    ``batch_first=True`` need nothing. The result is the same either way: a batch of outputs and
    the final states, as for a ``PackedSequence``.

    Returns
    -------
    torch.nn.Module
        ``module``, for chaining (``rnn = accept_nested_batches(nn.LSTM(8, 16))``).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    for sub in module.modules():
        if isinstance(sub, torch.nn.RNNBase) and not getattr(sub, _HOOKED, False):
            sub.register_forward_pre_hook(_present_time_major)
            setattr(sub, _HOOKED, True)
    return module


_HOOKED = "_nestbatch_accepts_batches"


def _present_time_major(module: torch.nn.RNNBase, args: tuple) -> tuple | None:
    if module.batch_first or not args or type(args[0]) is not NestedBatch:
        return None
    batch = args[0]
    if batch.num_ragged_dims != 1 or batch.ragged_dim != 1:
        return None  # the recurrent kernels refuse it with their own message
    view = TimeMajorSequences.trusted(stored_layout(batch))
    return (view, *args[1:])
