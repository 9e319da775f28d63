"""The GPU-path harness: run nestbatch on fake CUDA tensors, count launches, catch host syncs.

Works on a CPU-only PyTorch. Inside :func:`fake_cuda`, tensors made with ``device="cuda"`` are
``FakeTensor`` objects of a ``torch._subclasses.fake_tensor.FakeTensorMode`` (they report
``device="cuda"``, and the fake mode checks devices, shapes and dtypes as a GPU would) that also
carry their true values: every op on them runs twice, once in the fake mode (the result's
metadata and device checks) and once for real on the host, on CPU copies of the inputs (their
*shadows*: each fake CUDA tensor holds one; a view's shadow is the same view of its base's
shadow, an in-place op updates it; :func:`real_values` returns it). Host (CPU) tensors stay
ordinary tensors: an op whose inputs are all on the host (a factory without a CUDA ``device=``)
runs for real, outside the fake mode, so sizes given on the host keep their values. An op whose
output depends on the data (``nonzero``, a bool mask, ``.item()``, ...) and an op the fake mode
has no kernel for (CUDA-only kernels such as ``_thnn_fused_gru_cell`` get host versions here) is
computed for real and its result put on the fake device with its true shape.

The fake mode stays active (a CUDA factory on a CPU-only torch needs it), so the library's
``making_fake_tensors()`` is true, as under ``torch.compile``: its branches for that case make
host tensors with factories instead of ``frombuffer``, with the same device ops. The mode has a
``ShapeEnv`` only for ``torch.nested``'s nested ints; shapes stay static. The real computations
run on one thread.

:func:`trace` runs a callable with a ``TorchDispatchMode`` on top that sees every aten and
``nestbatch::`` op the call dispatches and records in a :class:`Trace`:

* ``ops``: the ops that launch work on the device: an op with a CUDA input or a CUDA
  ``device=`` (views, allocations, metadata queries, copies of no bytes and ops on host tensors
  do not count; a ``nestbatch::`` operator counts once). Checked against the torch profiler on
  an H100, this count equals the kernel launches of the same calls (see
  ``shared/gpu/README.md``; torch's RNNs are the exception: without cuDNN their CUDA path is a
  few ops per time step, on a GPU one ``_cudnn_rnn``);
* ``syncs``: ops on CUDA tensors whose result the host must wait for (``_local_scalar_dense``
  behind ``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``, ``t.__index__()``; ``nonzero``,
  ``masked_select``, ``equal``, ``bincount``, ``unique``, indexing with a bool mask,
  ``repeat_interleave`` without ``output_size``, copies from the device to the host, ...). The
  same ops on host tensors are host work: neither syncs nor launches. ``t.tolist()`` of a CUDA
  tensor is one device-to-host copy: one sync;
* ``host_to_device``: copies of host data to the device (each is also an op; a pageable copy
  inside a call is what keeps it out of a CUDA graph);
* ``sync_sites`` / ``copy_sites``: for each sync / host-to-device copy, where it was made: the
  innermost three nestbatch frames (``file:line function < caller < ...``), or the caller's
  frame when nestbatch is not on the stack.

A sync fails the call with :class:`HostSyncError` (its message holds the stack) unless
``allow_syncs=True``; then it is counted and answered with the true value, and an op whose
output shape depends on the data returns a fake CUDA tensor of the true shape: the call runs the
path it runs on a GPU with the same data (validation included).

``torch.cuda.*`` calls made by nestbatch raise :class:`CudaRuntimeCall` (FakeTensorMode's own
calls pass); ``torch.cuda.is_current_stream_capturing()`` answers ``False`` (a host query; no
graph is being captured). Torch's handwritten Python tensor methods take a CUDA device guard,
which a CPU-only torch lacks; the harness runs them, for fake CUDA tensors, through the aten ops
they dispatch on a GPU: indexing (``slice``, ``select``, ``index``, and ``index_put_`` /
``copy_`` / ``fill_`` for ``t[i] = v``; a 0-d integer tensor index is read with ``item``, as
torch does), ``to`` / ``cuda`` (``_to_copy``; also for host tensors), ``contiguous``
(``clone``), ``~`` (``bitwise_not``), ``copy_``, ``new_tensor`` (a host-to-device copy),
``item``, ``int``, ``float``, ``bool``, ``complex``, ``__index__`` (``_local_scalar_dense``),
``nonzero`` / ``torch.nonzero`` and ``tolist`` (one device-to-host copy), so library code is
written as usual and a read shows up as a sync. They are patched on ``torch.Tensor`` and also
routed by a ``TorchFunctionMode``, which catches references to the methods taken before the
harness started (a registry keyed by ``torch.Tensor.__invert__``). ``pin_memory()`` of a host
tensor is a host copy marked pinned (``is_pinned()`` answers it), as no CPU-only torch can pin.
Anything else that needs the guard raises :class:`CudaRuntimeCall`.

Autograd does not run on fake CUDA tensors with a CPU-only PyTorch (the engine aborts the
process), so keep ``requires_grad`` off under the harness (``module.requires_grad_(False)``)
and call backward functions directly.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    UnsupportedOperatorException,
    unset_fake_temporarily,
)
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

aten = torch.ops.aten

# Ops that launch nothing: allocations (their memory is written by the op that fills them) and
# metadata. Views are recognised by their schema (``OpOverload.is_view``).
_NO_LAUNCH = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.empty_like.default,
    aten.lift_fresh.default,
    aten.detach.default,
    aten.alias.default,
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
    aten.is_same_size.default,
    aten.resize_.default,
}

# Ops on CUDA tensors whose result the host reads back (data-dependent output values or shapes).
_SYNCS = {
    aten._local_scalar_dense.default,
    aten.item.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.bincount.default,
    aten._unique.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default,
    aten.allclose.default,
}

# Ops that only read metadata: answered by the fake mode, nothing to compute for real.
_METADATA = {
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
    aten.is_same_size.default,
    aten.is_pinned.default,
}

# The fake mode cannot know these outputs (data-dependent values or shapes, or no fake kernel):
# they are computed for real and put on the fake device.
_FAKE_CANNOT = (DataDependentOutputException, DynamicOutputShapeException,
                UnsupportedOperatorException)

# What the fake mode raises when an op has no fake kernel and its fallback runs the real kernel
# on the CUDA device (which a CPU-only torch lacks), or, on a CUDA build, refuses to (the
# CUDA-only kernels): the op is computed for real instead.
_NEEDS_A_DEVICE = ("Torch not compiled with CUDA enabled",
                   "not linked with support for cuda devices",
                   "there was no fake impl or Meta kernel registered",
                   "Found no NVIDIA driver", "CUDA driver version is insufficient")

# torch.cuda functions that must not run on the GPU path (they fail on a CPU-only torch, and on
# a GPU they query or initialise the runtime on every call).
_CUDA_FUNCTIONS = (
    "is_available", "current_device", "device_count", "get_device_properties",
    "get_device_capability", "synchronize", "current_stream", "default_stream", "set_device",
)

_REAL = "_gpu_path_real"  # the attribute of a fake CUDA tensor that holds its shadow
_NESTBATCH = os.sep + "nestbatch" + os.sep
_HARNESS = __file__
_TORCH = os.sep + "torch" + os.sep


class HostSyncError(AssertionError):
    """A call on the GPU path made the host wait for the device."""


class CudaRuntimeCall(AssertionError):
    """A call on the GPU path used the CUDA runtime (``torch.cuda.*`` or a device guard)."""


@dataclass
class Trace:
    """What one call dispatched on fake CUDA tensors."""

    ops: list[str] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)
    host_to_device: list[str] = field(default_factory=list)
    all_dispatched: list[str] = field(default_factory=list)
    sync_sites: list[str] = field(default_factory=list)
    copy_sites: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (
            f"{len(self.ops)} ops {self.ops}, {len(self.syncs)} syncs {self.syncs} at "
            f"{self.sync_sites}, {len(self.host_to_device)} host->device copies at "
            f"{self.copy_sites}"
        )


# ------------------------------------------------------------------------ real values (shadows)
def _on_fake_cuda(tensor: Any) -> bool:
    return isinstance(tensor, FakeTensor) and tensor.fake_device.type == "cuda"


def _cuda_device(value: Any) -> bool:
    return isinstance(value, torch.device) and value.type == "cuda"


def _on_real_cuda(tensor: Any) -> bool:
    """A real CUDA tensor (a CUDA build of torch only): ``torch.tensor(data, device="cuda")``
    copies its data to the device below the dispatcher, so the lift of the result is the first
    op the modes see of it."""
    return (isinstance(tensor, torch.Tensor) and not isinstance(tensor, FakeTensor)
            and tensor.device.type == "cuda")


def _touches_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether an op runs on the device: a CUDA tensor among its inputs, or a CUDA ``device=``
    (factories, host-to-device copies). Ops on host tensors are host work, not launches."""
    for value in (*args, *kwargs.values()):
        if type(value) in (list, tuple):
            if any(_on_fake_cuda(item) or _on_real_cuda(item) for item in value):
                return True
        elif _on_fake_cuda(value) or _on_real_cuda(value) or _cuda_device(value):
            return True
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cuda"


def _involves_fakes(args: tuple, kwargs: dict) -> bool:
    if _touches_cuda(args, kwargs):
        return True
    leaves = tree_flatten((args, kwargs))[0]
    return any(isinstance(leaf, FakeTensor) for leaf in leaves)


def _other_subclasses(types: Any) -> bool:
    """Whether tensor subclasses other than fake tensors take part (wrappers such as
    torch.nested's jagged tensors, whose ops on their parts come back through the modes)."""
    return any(t not in (torch.Tensor, FakeTensor, torch.nn.Parameter) for t in types)


class _ValuesUnknown(Exception):
    pass


def _real(value: Any) -> Any:
    """An op argument for the real computation on the host: a fake tensor's shadow, a real
    CUDA tensor's host copy, a CUDA device as the CPU."""
    if isinstance(value, FakeTensor):
        real = value.__dict__.get(_REAL)
        if real is None:
            raise _ValuesUnknown
        return real
    if _on_real_cuda(value):
        with unset_fake_temporarily():
            return value.cpu()
    if _cuda_device(value):
        return torch.device("cpu")
    return value


def real_values(tensor: torch.Tensor) -> torch.Tensor:
    """The true values of a tensor made under :func:`fake_cuda` (a host tensor itself)."""
    if not isinstance(tensor, FakeTensor):
        return tensor
    real = tensor.__dict__.get(_REAL)
    if real is None:
        raise ValueError("this fake tensor has no real values (made outside the harness)")
    return real


def _fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``aten._thnn_fused_gru_cell`` (a CUDA-only kernel, which torch's GRU on CUDA tensors
    decomposes into) on the host: the hidden state and the kernel's ``(B, 5 H)`` workspace."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    i_r, i_z, i_n = input_gates.chunk(3, 1)
    h_r, h_z, h_n = hidden_gates.chunk(3, 1)
    reset, update = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    new = torch.tanh(i_n + reset * h_n)
    hy = new + update * (hx - new)
    return hy, torch.cat([reset, update, new, hx, h_n], 1)


def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``aten._thnn_fused_lstm_cell`` (CUDA-only) on the host: ``hy``, ``cy`` and the kernel's
    ``(B, 4 H)`` workspace (the activated gates)."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    return o * torch.tanh(cy), cy, torch.cat([i, f, g, o], 1)


#: Host implementations of CUDA-only kernels (which torch's RNNs on CUDA tensors decompose
#: into), for the real computation.
_HOST_KERNELS = {aten._thnn_fused_gru_cell.default: _fused_gru_cell,
                 aten._thnn_fused_lstm_cell.default: _fused_lstm_cell}


class _RealValues(TorchDispatchMode):
    """Runs every op: host-only ops for real; ops that touch CUDA in the fake mode and again
    for real on the shadows of their inputs (see the module docstring)."""

    def __init__(self, fake_mode: FakeTensorMode) -> None:
        super().__init__()
        self.fake_mode = fake_mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _other_subclasses(types):
            return NotImplemented  # (torch.nested's tensors: they dispatch their parts here)
        kwargs = kwargs or {}
        if func is aten.lift_fresh.default and _on_real_cuda(args[0]):
            # torch.tensor(data, device="cuda") on a CUDA build: a fake CUDA tensor holding
            # the data, as on a CPU-only build (a real one would leave the values of every
            # result computed from it unknown)
            return self._to_fake(_real(args[0]))
        if not _involves_fakes(args, kwargs):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func in _METADATA or func.namespace == "prim":
            return func(*args, **kwargs)
        try:
            real_args, real_kwargs = tree_map(_real, (args, kwargs))
        except _ValuesUnknown:
            real_args = real_kwargs = None
        try:
            if _data_dependent(func, args, kwargs):
                raise DynamicOutputShapeException(func)  # (its fake kernel may need a guard)
            fake = func(*args, **kwargs)
        except (*_FAKE_CANNOT, RuntimeError, AssertionError) as error:
            if real_args is None or not (isinstance(error, _FAKE_CANNOT) or any(
                    text in str(error) for text in _NEEDS_A_DEVICE)):
                raise
            with unset_fake_temporarily():
                real = _HOST_KERNELS.get(func, func)(*real_args, **real_kwargs)
            # (an in-place op returns its argument: the fake one)
            fakes = {id(_real(a)): a for a in tree_flatten((args, kwargs))[0]
                     if isinstance(a, FakeTensor)}
            return tree_map(lambda r: fakes[id(r)] if id(r) in fakes else self._to_fake(r),
                            real)
        real = None
        if real_args is not None:
            try:
                with unset_fake_temporarily():
                    real = _HOST_KERNELS.get(func, func)(*real_args, **real_kwargs)
            except Exception:  # noqa: BLE001  (no CPU kernel for the dtype: values unknown)
                real = None
        return self._pair(fake, real)

    def _to_fake(self, real: Any) -> Any:
        """A real result as a fake CUDA tensor with the same metadata, holding it."""
        if not isinstance(real, torch.Tensor):
            return real
        fake = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device="cuda")
        fake.__dict__[_REAL] = real
        return fake

    @staticmethod
    def _pair(fake: Any, real: Any) -> Any:
        """The fake result with each CUDA tensor holding its real counterpart; host tensors
        (device-to-host copies) are the real ones."""
        fakes, spec = tree_flatten(fake)
        reals = tree_flatten(real)[0] if real is not None else []
        if len(reals) != len(fakes):
            reals = [None] * len(fakes)
        out = []
        for f, r in zip(fakes, reals):
            if not isinstance(f, FakeTensor):
                out.append(f)
            elif f.fake_device.type == "cpu":
                if not isinstance(r, torch.Tensor):
                    raise RuntimeError(f"gpu_path: no host values for a {f.dtype} host result")
                out.append(r)
            else:
                f.__dict__[_REAL] = r if isinstance(r, torch.Tensor) else None
                out.append(f)
        return tree_unflatten(out, spec)


# ------------------------------------------------------------------------------- the recorder
def _site(depth: int = 3) -> str:
    """Where the op was called from: the innermost ``depth`` nestbatch frames, innermost first
    (``file:line function < caller < ...``), else the innermost frame outside the harness and
    torch."""
    found: list[str] = []
    fallback = None
    frame = sys._getframe(1)
    while frame is not None and len(found) < depth:
        path = frame.f_code.co_filename
        if _NESTBATCH in path:
            where = path[path.rindex(_NESTBATCH) + 1:]
            found.append(f"{where}:{frame.f_lineno} {frame.f_code.co_name}")
        elif not found and fallback is None and path != _HARNESS and _TORCH not in path \
                and "<" not in path:
            fallback = f"{os.path.basename(path)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return " < ".join(found) if found else (fallback or "?")


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: Trace, allow_syncs: bool) -> None:
        super().__init__()
        self.trace = trace
        self.allow_syncs = allow_syncs
        self._copied = False  # whether the last op was a host-to-device copy

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _other_subclasses(types):
            return NotImplemented
        kwargs = kwargs or {}
        name = str(func)
        self.trace.all_dispatched.append(name)
        if not _touches_cuda(args, kwargs):
            self._copied = False
            return func(*args, **kwargs)  # host work: no launch, no sync
        copy = _copy_direction(func, args, kwargs)
        if copy is not None and args[1 if func is aten.copy_.default else 0].numel() == 0:
            copy = "empty"  # torch copies no bytes and launches nothing
        if copy == "d2h" or _data_dependent(func, args, kwargs):
            if not self.allow_syncs:
                where = "".join(traceback.format_stack(limit=14)[:-1])
                raise HostSyncError(f"host sync on the GPU path: {name}\n{where}")
            self.trace.syncs.append(name)
            self.trace.sync_sites.append(_site())
        elif _launches(func) and copy != "empty":
            self.trace.ops.append(name)
            if copy == "h2d":
                self.trace.host_to_device.append(name)
                self.trace.copy_sites.append(_site())
        elif func is aten.lift_fresh.default and not self._copied:
            # torch.tensor(data, device="cuda") on a CUDA build of torch copies the host data
            # below the dispatcher and only shows the lift of its result; on a CPU-only build
            # the copy shows as _to_copy. Either way: one host-to-device copy.
            self.trace.ops.append(name)
            self.trace.host_to_device.append(name)
            self.trace.copy_sites.append(_site())
        self._copied = copy == "h2d"
        return func(*args, **kwargs)


def _data_dependent(func, args: tuple, kwargs: dict) -> bool:
    """Whether an op's output values or shape depend on the data (a sync on the device)."""
    return (func in _SYNCS or _is_unsized_repeat_interleave(func, kwargs)
            or _is_bool_mask_index(func, args))


def _launches(func) -> bool:
    if func.namespace == "prim" or func in _NO_LAUNCH:
        return False
    return not func.is_view


def _is_unsized_repeat_interleave(func, kwargs: dict) -> bool:
    return func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None


def _is_bool_mask_index(func, args: tuple) -> bool:
    # Indexing with a bool mask runs nonzero first: its output size is data-dependent.
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                    aten._index_put_impl_.default):
        return False
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1])


def _copy_direction(func, args: tuple, kwargs: dict) -> str | None:
    """``"h2d"`` / ``"d2h"`` for a copy between the host and a CUDA device, else None."""
    if func is aten._to_copy.default:
        source = args[0].device
        target = kwargs.get("device") or source
    elif func is aten.copy_.default:
        target, source = args[0].device, args[1].device
    else:
        return None
    target = torch.device(target)
    if source.type == "cpu" and target.type == "cuda":
        return "h2d"
    if source.type == "cuda" and target.type == "cpu":
        return "d2h"
    return None


# ------------------------------------------------------------------- the fake CUDA device
@contextlib.contextmanager
def fake_cuda() -> Iterator[FakeTensorMode]:
    """A session in which ``device="cuda"`` tensors are fake CUDA tensors with real values, on a
    CPU-only torch (see the module docstring). Yields the ``FakeTensorMode`` they belong to."""
    # (A ShapeEnv only for torch.nested's nested ints: shapes stay static, and data-dependent
    # ops never reach the fake mode.)
    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True)
    threads = torch.get_num_threads()
    with contextlib.ExitStack() as stack:
        # The real computations are small: one thread (several contend on a busy machine,
        # 100x slower at times).
        torch.set_num_threads(1)
        stack.callback(torch.set_num_threads, threads)
        stack.enter_context(mode)
        stack.enter_context(_RealValues(mode))
        stack.enter_context(_no_cuda_runtime())
        stack.enter_context(_device_guardless())
        # A CUDA build of torch asks cuDNN (which starts the CUDA runtime) whether it takes an
        # RNN on CUDA tensors; with cuDNN off the RNN runs the fused-cell path the fake mode
        # computes on the host, as on a CPU-only build.
        stack.enter_context(torch.backends.cudnn.flags(enabled=False))
        yield mode


# ------------------------------------------- Python-level tensor methods that need a device guard
# Torch's handwritten Python methods (indexing, .item(), int(t), .tolist(), .to(), ...) take a
# CUDA device guard, which a CPU-only torch lacks; each first offers the call to the active
# torch-function modes, so :class:`_HostMethods` runs them through the aten ops they dispatch on
# a GPU. This also covers references to the methods taken before the harness started (a
# registry keyed by ``torch.Tensor.__invert__``).
def _index_entries(tensor: torch.Tensor, index: Any) -> list:
    index = list(index) if isinstance(index, tuple) else [index]
    if any(entry is Ellipsis for entry in index):
        at = next(i for i, entry in enumerate(index) if entry is Ellipsis)
        used = sum(_dims_used(e) for e in index if e is not None and e is not Ellipsis)
        index[at : at + 1] = [slice(None)] * (tensor.dim() - used)
    return index


def _dims_used(entry: Any) -> int:
    if isinstance(entry, torch.Tensor) and entry.dtype in (torch.bool, torch.uint8):
        return max(entry.dim(), 1)
    return 1


def _read(tensor: torch.Tensor) -> Any:
    """The value of a one-element tensor: ``_local_scalar_dense`` (a sync on the device)."""
    if tensor.numel() != 1:
        raise RuntimeError(
            f"a Tensor with {tensor.numel()} elements cannot be converted to Scalar"
        )
    if not _on_fake_cuda(tensor):
        return torch.Tensor.item(tensor)
    return aten._local_scalar_dense.default(tensor)


def _basic_index(tensor: torch.Tensor, index: Any) -> tuple[torch.Tensor, list | None]:
    """``tensor[index]`` split as torch's C++ indexing does it: the view that ints, slices,
    None and Ellipsis make (through aten ops), and the index list (or None) for
    ``aten.index`` / ``aten.index_put_`` on it."""
    out, dim, indices = tensor, 0, []
    for entry in _index_entries(tensor, index):
        if (isinstance(entry, torch.Tensor) and entry.dim() == 0
                and entry.dtype not in (torch.bool, torch.uint8)
                and not (entry.is_floating_point() or entry.is_complex())):
            entry = int(_read(entry))  # torch reads a 0-d integer index: a sync on the device
        if entry is None or isinstance(entry, slice):
            if entry is None:
                out = aten.unsqueeze.default(out, dim)
            else:
                start, stop, step = slice(
                    *(None if v is None else operator.index(v)
                      for v in (entry.start, entry.stop, entry.step))
                ).indices(out.shape[dim])
                out = aten.slice.Tensor(out, dim, start, max(stop, start), step)
            dim += 1
            if indices:
                indices.append(None)
        elif isinstance(entry, int) and not isinstance(entry, bool):
            if not -out.shape[dim] <= entry < out.shape[dim]:
                raise IndexError(
                    f"index {entry} is out of bounds for dimension {dim} with size "
                    f"{out.shape[dim]}"
                )
            out = aten.select.int(out, dim, entry)
        else:
            if not isinstance(entry, torch.Tensor):
                entry = torch.tensor(entry)
            if entry.dtype in (torch.bool, torch.uint8) and entry.dim() == 0:
                out = aten.unsqueeze.default(out, dim)  # t[True]: a new dim of size 1 (or 0)
                entry = torch.zeros(int(bool(_read(entry))), dtype=torch.long)
            if not indices:
                indices = [None] * dim
            indices.append(entry)
            dim += _dims_used(entry)
    return out, (indices or None)


def _getitem(self: torch.Tensor, index: Any) -> torch.Tensor:
    out, indices = _basic_index(self, index)
    return out if indices is None else aten.index.Tensor(out, indices)


def _setitem(self: torch.Tensor, index: Any, value: Any) -> None:
    target, indices = _basic_index(self, index)
    if indices is not None:
        if not isinstance(value, torch.Tensor):
            value = aten.scalar_tensor.default(value, dtype=self.dtype, device=self.device)
        aten.index_put_.default(target, indices, value)
    elif isinstance(value, torch.Tensor):
        aten.copy_.default(target, value)
    else:
        aten.fill_.Scalar(target, value)


def _to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
    device = self.device if device is None else torch.device(device)
    if device.type == "cuda":
        device = torch.device("cuda", 0)
    dtype = self.dtype if dtype is None else dtype
    if device == self.device and dtype == self.dtype and not kwargs.get("copy"):
        return self
    return aten._to_copy.default(self, dtype=dtype, device=device, non_blocking=non_blocking)


def _cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
          memory_format: Any = None) -> torch.Tensor:
    return _to(self, "cuda", non_blocking=non_blocking)


def _contiguous(self: torch.Tensor, memory_format=torch.contiguous_format) -> torch.Tensor:
    if self.is_contiguous(memory_format=memory_format):
        return self
    return aten.clone.default(self, memory_format=memory_format)


def _bool(self: torch.Tensor) -> bool:
    if self.numel() != 1:
        many = "more than one" if self.numel() else "no"
        raise RuntimeError(f"Boolean value of Tensor with {many} value is ambiguous")
    return bool(_read(self))


def _index(self: torch.Tensor) -> int:
    if self.is_floating_point() or self.is_complex() or self.numel() != 1:
        raise TypeError("only integer tensors of a single element can be converted to an index")
    return int(_read(self))


def _tolist(self: torch.Tensor) -> Any:
    """One device-to-host copy, then the host tensor's list."""
    return aten._to_copy.default(self, device=torch.device("cpu")).tolist()


def _nonzero(self: torch.Tensor, *, as_tuple: bool = False, out: Any = None) -> Any:
    if out is not None:
        raise NotImplementedError("gpu_path: nonzero(out=) of a CUDA tensor")
    found = aten.nonzero.default(self)
    if not as_tuple:
        return found
    if self.dim() == 0:
        return (found.reshape(-1),)
    return tuple(found.unbind(1))


def _copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return aten.copy_.default(self, src, non_blocking)


def _new_tensor(self: torch.Tensor, data: Any, dtype: Any = None, device: Any = None,
                requires_grad: bool = False) -> torch.Tensor:
    host = torch.tensor(data, dtype=dtype or self.dtype)
    return aten._to_copy.default(host, device=torch.device(device or self.device))


def _pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    """A host copy marked pinned: no CPU-only torch can pin memory."""
    if _on_fake_cuda(self):
        raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be "
                           "pinned")
    pinned = self.clone()
    pinned.__dict__["_gpu_path_pinned"] = True
    return pinned


def _is_pinned(self: torch.Tensor, device: Any = None) -> bool:
    return self.__dict__.get("_gpu_path_pinned", False)


#: Methods routed for fake CUDA tensors, by name.
_ROUTES: dict[str, Callable[..., Any]] = {
    "__getitem__": _getitem, "__setitem__": _setitem, "contiguous": _contiguous,
    "item": _read, "__int__": lambda self: int(_read(self)),
    "__float__": lambda self: float(_read(self)),
    "__complex__": lambda self: complex(_read(self)), "__bool__": _bool, "__index__": _index,
    "tolist": _tolist, "nonzero": _nonzero, "copy_": _copy_,
    "__invert__": lambda self: aten.bitwise_not.default(self), "new_tensor": _new_tensor,
    "to": _to, "cuda": _cuda, "pin_memory": _pin_memory, "is_pinned": _is_pinned,
}


def _routed(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the method ``name`` called with ``args`` takes its route: on a fake CUDA
    tensor, or a host tensor going to the device or to pinned memory."""
    if not args or not isinstance(args[0], torch.Tensor):
        return False
    if _on_fake_cuda(args[0]) or name in ("pin_memory", "is_pinned", "cuda"):
        return True
    if name != "to":
        return False
    device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
    return device is not None and torch.device(device).type == "cuda"


_ORIGINALS = {name: getattr(torch.Tensor, name) for name in _ROUTES}
_NAMES_OF = {original: name for name, original in _ORIGINALS.items()}
_NAMES_OF[torch.nonzero] = "nonzero"


def _method(name: str) -> Callable[..., Any]:
    original, route = _ORIGINALS[name], _ROUTES[name]

    def method(*args: Any, **kwargs: Any) -> Any:
        if _routed(name, args, kwargs):
            return route(*args, **kwargs)
        return original(*args, **kwargs)

    method.__name__ = name
    return method


class _HostMethods(TorchFunctionMode):
    """Routes the device-guarded methods that reach torch's function layer (the originals,
    held by references taken before the harness started) as the patched methods do."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _NAMES_OF.get(func)
        if name is not None and _routed(name, args, kwargs):
            return _ROUTES[name](*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def _device_guardless() -> Iterator[None]:
    """The routes of :data:`_ROUTES`, for every spelling: ``torch.Tensor``'s methods (patched:
    fake-tensor kernels call them with torch functions disabled), references taken earlier
    (:class:`_HostMethods`), ``torch.nonzero``, and ``FakeTensor.tolist`` (which would read each
    element with ``.item()``: one copy instead)."""
    with contextlib.ExitStack() as stack:
        for name in _ROUTES:
            stack.enter_context(mock.patch.object(torch.Tensor, name, _method(name)))
        stack.enter_context(mock.patch.object(FakeTensor, "tolist", _method("tolist")))
        original_nonzero = torch.nonzero

        def nonzero(input, *args: Any, **kwargs: Any) -> Any:  # noqa: A002  (torch's name)
            if _on_fake_cuda(input):
                return _nonzero(input, *args, **kwargs)
            return original_nonzero(input, *args, **kwargs)

        stack.enter_context(mock.patch.object(torch, "nonzero", nonzero))
        stack.enter_context(_HostMethods())
        yield


@contextlib.contextmanager
def _no_cuda_runtime() -> Iterator[None]:
    def refuse(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        # Only nestbatch's own calls are refused: FakeTensorMode itself asks is_available().
        def call(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.split(".")[0] == "nestbatch":
                raise CudaRuntimeCall(f"torch.cuda.{name} called on the GPU path (by {caller})")
            return original(*args, **kwargs)

        return call

    with contextlib.ExitStack() as stack:
        for name in _CUDA_FUNCTIONS:
            original = getattr(torch.cuda, name)
            stack.enter_context(mock.patch.object(torch.cuda, name, refuse(name, original)))
        stack.enter_context(
            mock.patch.object(torch.cuda, "is_current_stream_capturing", lambda: False)
        )
        yield


def trace(fn: Callable[..., Any], *args: Any, allow_syncs: bool = False, **kwargs: Any):
    """Run ``fn(*args, **kwargs)`` (inside :func:`fake_cuda`) and return ``(result, Trace)``.

    Raises
    ------
    HostSyncError
        On a host sync, unless ``allow_syncs=True``.
    CudaRuntimeCall
        When the call reaches the CUDA runtime, which a fake device does not have.
    """
    record = Trace()
    try:
        with _Recorder(record, allow_syncs):
            result = fn(*args, **kwargs)
    except RuntimeError as error:
        if "not linked with support for cuda" in str(error):
            raise CudaRuntimeCall(
                "the call needs a real CUDA device (a Python-level method on a CUDA tensor "
                f"that the harness does not route): {error}\n"
                f"ops so far: {record.all_dispatched[-8:]}"
            ) from error
        raise
    return result, record


def count(fn: Callable[..., Any], *args: Any, allow_syncs: bool = False, **kwargs: Any) -> Trace:
    """The :class:`Trace` of ``fn(*args, **kwargs)``; see :func:`trace`."""
    return trace(fn, *args, allow_syncs=allow_syncs, **kwargs)[1]
