"""The ``nestbatch::*`` operators: schemas, CPU/CUDA implementations, fake kernels, autograd.

Every operator is a :func:`torch.library.custom_op`, so ``torch.compile`` traces through it as one
opaque node (its fake kernel gives output shapes without running it) and ``torch.library.opcheck``
can verify its registrations.

* The device-agnostic implementation is the pure-PyTorch reference of
  :mod:`nestbatch.kernels.torch_impl`. On the CPU every operator runs :mod:`nestbatch.kernels.cpu`
  instead (same results), which calls the reference where its shortcuts do not apply.
* The CUDA implementation calls the compiled kernels of ``csrc/`` (``torch.ops.nestbatch_cuda``)
  when :func:`nestbatch.kernels.extension.load_extension` succeeds, and the reference otherwise.
* Output sizes that depend on data (the total of a batch, the largest count of a mask) are int
  arguments computed by the caller, so no operator ever synchronizes with the device.
* Index validity is the caller's job (see the wrappers in :mod:`nestbatch.kernels`): the compiled
  kernels never touch memory out of bounds, but only the wrappers raise on bad indices.

Fill values are ``Scalar`` (Python ``int``, ``float`` or ``bool``) so ``int64`` data keeps exact
fillers. This module deliberately avoids ``from __future__ import annotations``: ``custom_op``
infers the schemas from the real annotation objects.
"""

from functools import partial

import torch
from torch import Tensor
from torch.types import Number

from nestbatch.kernels import cpu, torch_impl
from nestbatch.kernels.extension import load_extension

__all__ = [
    "CPU_IMPLEMENTATIONS",
    "KERNEL_DTYPES",
    "bool_compaction_op",
    "fill_padding_op",
    "index_mapping_op",
    "indexing_access_op",
    "indexing_write_op",
    "indices_to_mask_op",
    "inverse_indexing_access_op",
    "mask_to_indices_op",
    "packed_to_padded_op",
    "padded_to_packed_op",
]

#: What every operator runs on the CPU, by name (filled by :func:`_define`).
CPU_IMPLEMENTATIONS: dict = {}
# What the kernels' dtype dispatch covers (the same as aten's jagged kernels); other dtypes
# (complex, unsigned 16-64 bit, float8) run the PyTorch implementation on the GPU.
KERNEL_DTYPES = cpu.KERNEL_DTYPES
_COMPILED_ENTRY_POINTS: dict = {}


def compiled_kernel(name: str):
    """The C++ entry point of ``torch.ops.nestbatch_cuda.<name>`` (its one overload, resolved
    once) when the CUDA extension is loaded, else ``None``: called like the operator, through the
    C++ dispatcher (dispatch modes and CUDA-graph capture see it), without the overload packet's
    Python layers."""
    if not load_extension():
        return None
    kernel = _COMPILED_ENTRY_POINTS.get(name)
    if kernel is None:
        kernel = _COMPILED_ENTRY_POINTS[name] = getattr(torch.ops.nestbatch_cuda, name).default._op
    return kernel


def _define(name: str, reference_impl, cpu_impl):
    """Operator ``nestbatch::<name>`` running ``cpu_impl`` on the CPU (listed in
    :data:`CPU_IMPLEMENTATIONS`), and on CUDA tensors the compiled kernel
    ``torch.ops.nestbatch_cuda.<name>`` (``reference_impl`` when the extension is missing). The
    schema is inferred from ``reference_impl``'s annotations."""
    op = torch.library.custom_op(f"nestbatch::{name}", reference_impl, mutates_args=())
    op.register_kernel("cpu")(cpu_impl)
    CPU_IMPLEMENTATIONS[name] = cpu_impl

    @op.register_kernel("cuda")
    def _(*args):
        kernel = compiled_kernel(name) if kernels_cover(args) else None
        return reference_impl(*args) if kernel is None else kernel(*args)

    return op


def kernels_cover(args: tuple) -> bool:
    return all(a.dtype in KERNEL_DTYPES for a in args if isinstance(a, Tensor))


def _accumulate_rows(grad: Tensor, indices: Tensor, sizes: Tensor, num_sources: int) -> Tensor:
    """Backward of a per-sample gather: ``grad`` ``(B, M, *D)`` summed into its source rows,
    ``(B, num_sources, *D)`` (repeated sources add up, padded slots give nothing). What autograd
    derives for the reference gather, written out once so that both paths agree bit for bit."""
    num_samples = grad.shape[0]
    out = grad.new_zeros((num_samples, num_sources, *grad.shape[2:]))
    if num_sources == 0 or grad.numel() == 0:
        return out
    masked = torch.ops.nestbatch.fill_padding(grad, sizes, 0)
    safe = torch.ops.nestbatch.fill_padding(indices, sizes, 0).long()
    batch = torch.arange(num_samples, device=grad.device).unsqueeze(1)
    return out.index_put_((batch, safe), masked, accumulate=True)


def _saving(*positions: int):
    """A ``setup_context`` keeping ``inputs[i]`` for ``i`` in ``positions`` (``ctx.saved_tensors``)
    and the first input's shape (``ctx.shape``) for backward."""

    def setup(ctx, inputs, output) -> None:
        ctx.save_for_backward(*(inputs[i] for i in positions))
        ctx.shape = inputs[0].shape

    return setup


def _keeping_index(position: int):
    """A ``setup_context`` keeping the index tensor ``inputs[position]`` as an attribute
    (``ctx.index``) and the first input's shape (``ctx.shape``): unlike a saved tensor it
    outlives the first ``backward()``, so a conversion's graph can be run through again as a
    torch view's can (an index tensor is never differentiated nor written)."""

    def setup(ctx, inputs, output) -> None:
        ctx.index = inputs[position]
        ctx.shape = inputs[0].shape

    return setup


def _contiguous_like(position: int):
    """A fake kernel: an empty contiguous tensor like the operator's input ``position``."""
    return lambda *args: torch.empty_like(args[position], memory_format=torch.contiguous_format)


# ------------------------------------------------------------------------------ packed -> padded
def packed_to_padded_torch(
    values: Tensor, offsets: Tensor, max_len: int, padding_value: Number
) -> Tensor:
    """``(total, *D)`` packed rows -> ``(B, max_len, *D)``; ``offsets`` is ``(B + 1,)``."""
    return torch_impl.packed_to_padded(values, offsets, max_len, padding_value).contiguous()


# (The CPU implementations are partials, not wrapper functions: the same call without a Python
# frame, which :func:`nestbatch.kernels.call` pays on every host call.)
_packed_to_padded_cpu = partial(cpu.packed_to_padded, fallback=packed_to_padded_torch)
packed_to_padded_op = _define("packed_to_padded", packed_to_padded_torch, _packed_to_padded_cpu)


@packed_to_padded_op.register_fake
def _(values: Tensor, offsets: Tensor, max_len: int, padding_value: Number) -> Tensor:
    return values.new_empty((offsets.shape[0] - 1, max_len, *values.shape[1:]))


def _packed_to_padded_backward(ctx, grad):
    offsets = ctx.index
    return torch.ops.nestbatch.padded_to_packed(grad, offsets, ctx.shape[0]), None, None, None


packed_to_padded_op.register_autograd(_packed_to_padded_backward,
                                      setup_context=_keeping_index(1))


# ------------------------------------------------------------------------------ padded -> packed
def padded_to_packed_torch(data: Tensor, offsets: Tensor, total: int) -> Tensor:
    """``(B, L, *D)`` padded data -> ``(total, *D)`` packed rows; ``offsets`` is ``(B + 1,)``."""
    return torch_impl.padded_to_packed(data, offsets, total).contiguous()


_padded_to_packed_cpu = partial(cpu.padded_to_packed, fallback=padded_to_packed_torch)
padded_to_packed_op = _define("padded_to_packed", padded_to_packed_torch, _padded_to_packed_cpu)


@padded_to_packed_op.register_fake
def _(data: Tensor, offsets: Tensor, total: int) -> Tensor:
    return data.new_empty((total, *data.shape[2:]))


def _padded_to_packed_backward(ctx, grad):
    offsets = ctx.index
    return torch.ops.nestbatch.packed_to_padded(grad, offsets, ctx.shape[1], 0), None, None


padded_to_packed_op.register_autograd(_padded_to_packed_backward,
                                      setup_context=_keeping_index(1))


# --------------------------------------------------------------------------------- fill padding
def fill_padding_torch(data: Tensor, sizes: Tensor, value: Number) -> Tensor:
    """``(B, N, *D)`` with slots ``>= sizes[b]`` along dim 1 set to ``value`` (a new tensor)."""
    return torch_impl.fill_padding(data, sizes, value).contiguous()


_fill_padding_cpu = partial(cpu.fill_padding, fallback=fill_padding_torch)
fill_padding_op = _define("fill_padding", fill_padding_torch, _fill_padding_cpu)
fill_padding_op.register_fake(_contiguous_like(0))


def _fill_padding_backward(ctx, grad):
    (sizes,) = ctx.saved_tensors
    return torch.ops.nestbatch.fill_padding(grad, sizes, 0), None, None


fill_padding_op.register_autograd(_fill_padding_backward, setup_context=_saving(1))


# ------------------------------------------------------------------------------ indexing access
def indexing_access_torch(
    data: Tensor, indices: Tensor, sizes: Tensor, filler_value: Number
) -> Tensor:
    """Per-sample gather ``out[b, j] = data[b, indices[b, j]]``, filler for ``j >= sizes[b]``."""
    return torch_impl.indexing_access(data, indices, sizes, filler_value).contiguous()


_indexing_access_cpu = partial(cpu.indexing_access, fallback=indexing_access_torch)
indexing_access_op = _define("indexing_access", indexing_access_torch, _indexing_access_cpu)


@indexing_access_op.register_fake
def _(data: Tensor, indices: Tensor, sizes: Tensor, filler_value: Number) -> Tensor:
    return data.new_empty((data.shape[0], indices.shape[1], *data.shape[2:]))


def _indexing_access_backward(ctx, grad):
    indices, sizes = ctx.saved_tensors
    return _accumulate_rows(grad, indices, sizes, ctx.shape[1]), None, None, None


indexing_access_op.register_autograd(_indexing_access_backward, setup_context=_saving(1, 2))


# ------------------------------------------------------------------------------- indexing write
def indexing_write_torch(to_write: Tensor, indices: Tensor, sizes: Tensor, into: Tensor) -> Tensor:
    """``into`` with ``out[b, indices[b, j]] = to_write[b, j]`` for ``j < sizes[b]``."""
    return torch_impl.indexing_write(to_write, indices, sizes, into).contiguous()


_indexing_write_cpu = partial(cpu.indexing_write, fallback=indexing_write_torch)
indexing_write_op = _define("indexing_write", indexing_write_torch, _indexing_write_cpu)
indexing_write_op.register_fake(_contiguous_like(3))


def _indexing_write_backward(ctx, grad):
    indices, sizes = ctx.saved_tensors
    grad_values = grad_into = None
    if ctx.needs_input_grad[0]:
        grad_values = torch.ops.nestbatch.indexing_access(grad, indices, sizes, 0)
    if ctx.needs_input_grad[3]:
        # Overwritten positions of ``into`` do not reach the output: their gradient is 0.
        zeros = grad.new_zeros(ctx.shape)
        grad_into = torch.ops.nestbatch.indexing_write(zeros, indices, sizes, grad)
    return grad_values, None, None, grad_into


indexing_write_op.register_autograd(_indexing_write_backward, setup_context=_saving(1, 2))


# ---------------------------------------------------------------------- inverse indexing access
def inverse_indexing_access_torch(
    data: Tensor, indices: Tensor, sizes: Tensor, num_targets: int, filler_value: Number
) -> Tensor:
    """``(B, num_targets, *D)`` filler with ``out[b, indices[b, j]] = data[b, j]`` written in."""
    return torch_impl.inverse_indexing_access(
        data, indices, sizes, num_targets, filler_value
    ).contiguous()


_inverse_indexing_access_cpu = partial(
    cpu.inverse_indexing_access, fallback=inverse_indexing_access_torch
)
inverse_indexing_access_op = _define(
    "inverse_indexing_access", inverse_indexing_access_torch, _inverse_indexing_access_cpu
)


@inverse_indexing_access_op.register_fake
def _(
    data: Tensor, indices: Tensor, sizes: Tensor, num_targets: int, filler_value: Number
) -> Tensor:
    return data.new_empty((data.shape[0], num_targets, *data.shape[2:]))


def _inverse_backward(ctx, grad):
    indices, sizes = ctx.saved_tensors
    grad_data = torch.ops.nestbatch.indexing_access(grad, indices, sizes, 0)
    return grad_data, None, None, None, None


inverse_indexing_access_op.register_autograd(_inverse_backward, setup_context=_saving(1, 2))


# -------------------------------------------------------------------------------- index mapping
def index_mapping_torch(
    source: Tensor, source_indices: Tensor, target_indices: Tensor, sizes: Tensor, target: Tensor
) -> Tensor:
    """``target`` with ``out[b, target_indices[b, j]] = source[b, source_indices[b, j]]``."""
    return torch_impl.index_mapping(
        source, source_indices, target_indices, sizes, target
    ).contiguous()


_index_mapping_cpu = partial(cpu.index_mapping, fallback=index_mapping_torch)
index_mapping_op = _define("index_mapping", index_mapping_torch, _index_mapping_cpu)
index_mapping_op.register_fake(_contiguous_like(4))


def _index_mapping_backward(ctx, grad):
    source_indices, target_indices, sizes = ctx.saved_tensors
    grad_source = grad_target = None
    mapped = torch.ops.nestbatch.indexing_access(grad, target_indices, sizes, 0)
    if ctx.needs_input_grad[0]:
        grad_source = _accumulate_rows(mapped, source_indices, sizes, ctx.shape[1])
    if ctx.needs_input_grad[4]:
        grad_target = torch.ops.nestbatch.indexing_write(
            torch.zeros_like(mapped), target_indices, sizes, grad
        )
    return grad_source, None, None, None, grad_target


index_mapping_op.register_autograd(_index_mapping_backward, setup_context=_saving(1, 2, 3))


# ------------------------------------------------------------------------------- mask -> indices
def mask_to_indices_torch(mask: Tensor, max_count: int) -> tuple[Tensor, Tensor]:
    """Positions of the True entries of each row of a ``(B, N)`` mask, in increasing order:
    ``indices`` ``(B, max_count)`` int64 (padded slots 0; entries of rank ``>= max_count``
    dropped) and ``counts`` ``(B,)`` int64."""
    return torch_impl.mask_to_indices(mask, max_count)


_mask_to_indices_cpu = partial(cpu.mask_to_indices, fallback=mask_to_indices_torch)
mask_to_indices_op = _define("mask_to_indices", mask_to_indices_torch, _mask_to_indices_cpu)


@mask_to_indices_op.register_fake
def _(mask: Tensor, max_count: int) -> tuple[Tensor, Tensor]:
    num_samples = mask.shape[0]
    indices = mask.new_empty((num_samples, max_count), dtype=torch.int64)
    return indices, mask.new_empty((num_samples,), dtype=torch.int64)


# ------------------------------------------------------------------------------- indices -> mask
def indices_to_mask_torch(indices: Tensor, sizes: Tensor, num_targets: int) -> Tensor:
    """Bool ``(B, num_targets)`` with ``mask[b, indices[b, j]] = True`` for ``j < sizes[b]``."""
    return torch_impl.indices_to_mask(indices, sizes, num_targets).contiguous()


_indices_to_mask_cpu = partial(cpu.indices_to_mask, fallback=indices_to_mask_torch)
indices_to_mask_op = _define("indices_to_mask", indices_to_mask_torch, _indices_to_mask_cpu)


@indices_to_mask_op.register_fake
def _(indices: Tensor, sizes: Tensor, num_targets: int) -> Tensor:
    return indices.new_empty((indices.shape[0], num_targets), dtype=torch.bool)


# ------------------------------------------------------------------------------ bool compaction
def bool_compaction_torch(data: Tensor, mask: Tensor, max_count: int) -> tuple[Tensor, Tensor]:
    """Selected rows of ``(B, N, *D)`` packed to the front: ``(B, max_count, *D)``, counts."""
    indices, counts = mask_to_indices_torch(mask, max_count)
    return torch_impl.indexing_access(data, indices, counts, 0).contiguous(), counts


def _bool_compaction_by_gather(data: Tensor, mask: Tensor, max_count: int) -> tuple[Tensor, Tensor]:
    # Large host masks: the indices, then the CPU gather (its one-write path for large outputs).
    indices, counts = mask_to_indices_torch(mask, max_count)
    return _indexing_access_cpu(data, indices, counts, 0), counts


_bool_compaction_cpu = partial(cpu.bool_compaction, fallback=_bool_compaction_by_gather)
bool_compaction_op = _define("bool_compaction", bool_compaction_torch, _bool_compaction_cpu)


@bool_compaction_op.register_fake
def _(data: Tensor, mask: Tensor, max_count: int) -> tuple[Tensor, Tensor]:
    num_samples = data.shape[0]
    out = data.new_empty((num_samples, max_count, *data.shape[2:]))
    return out, data.new_empty((num_samples,), dtype=torch.int64)


def _bool_compaction_backward(ctx, grad, grad_counts):
    # (The int64 counts are not differentiable; grad is (B, max_count, *D).)
    (mask,) = ctx.saved_tensors
    indices, counts = torch.ops.nestbatch.mask_to_indices(mask, grad.shape[1])
    return _accumulate_rows(grad, indices, counts, ctx.shape[1]), None, None


bool_compaction_op.register_autograd(_bool_compaction_backward, setup_context=_saving(1))

