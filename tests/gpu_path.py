"""The GPU-path harness: run nestbatch on fake CUDA tensors, count launches, catch host syncs.

Works on a CPU-only PyTorch. :func:`fake_cuda` opens a
``torch._subclasses.fake_tensor.FakeTensorMode`` in which tensors made with ``device="cuda"``
are fake CUDA tensors (shapes, dtypes and devices, no data); :func:`trace` runs a callable under
it with a ``TorchDispatchMode`` on top that sees every aten and ``nestbatch::`` op the call
dispatches and records:

* ``ops``: the ops that launch work on the device: an op with a CUDA input or a CUDA
  ``device=`` (views, allocations, metadata queries and ops on host tensors do not count; a
  ``nestbatch::`` operator counts once). Checked against the torch profiler on an H100, this
  count equals the kernel launches of the same calls (see ``shared/gpu/README.md``);
* ``syncs``: ops whose result the host must wait for (``_local_scalar_dense`` behind ``.item()``
  and ``bool(t)``, ``nonzero``, ``masked_select``, ``equal``, indexing with a bool mask,
  ``repeat_interleave`` without ``output_size``, copies from the device to the host, ...);
* ``host_to_device``: copies of host data to the device (each is also an op; a pageable copy
  inside a call is what keeps it out of a CUDA graph).

A sync fails the call with :class:`HostSyncError` unless ``allow_syncs=True``. Then each read
is counted and answered: ``True`` for a bool flag, 0 for a number (nestbatch writes its device
checks so that these answers pass), while an op whose output shape depends on data still
raises. Host tensors read after a device-to-host copy are answered the same way, not counted
again.

``torch.cuda.*`` calls made by nestbatch raise :class:`CudaRuntimeCall` (FakeTensorMode's own
calls pass). A few Python-level tensor methods need a real CUDA device guard on a CUDA tensor;
the harness routes them to the aten ops they dispatch on a GPU: indexing (``slice``,
``select``, ``index``; ``t[i] = v`` of a view becomes ``copy_`` / ``fill_``, same count),
``Tensor.to`` (``_to_copy``), ``contiguous`` (``clone``), ``~`` (``bitwise_not``),
``copy_``, ``item`` (``_local_scalar_dense``) and ``tolist`` (a device-to-host copy), so library
code is written as usual and a read shows up as a sync. Anything else that needs the guard raises
:class:`CudaRuntimeCall`.

Autograd does not run on fake CUDA tensors with a CPU-only PyTorch (the engine aborts the
process), so keep ``requires_grad`` off under the harness and call backward functions directly.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

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

# Ops whose result the host reads back (data-dependent output values or shapes).
_SYNCS = {
    aten._local_scalar_dense.default,
    aten.item.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.allclose.default,
}

# torch.cuda functions that must not run on the GPU path (they fail on a CPU-only torch, and on
# a GPU they query or initialise the runtime on every call).
_CUDA_FUNCTIONS = (
    "is_available", "current_device", "device_count", "get_device_properties",
    "get_device_capability", "synchronize", "current_stream", "default_stream", "set_device",
)


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

    def __str__(self) -> str:
        return (
            f"{len(self.ops)} ops {self.ops}, {len(self.syncs)} syncs {self.syncs}, "
            f"{len(self.host_to_device)} host->device copies"
        )


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: Trace, allow_syncs: bool) -> None:
        super().__init__()
        self.trace = trace
        self.allow_syncs = allow_syncs
        self._copied = False  # whether the last op was a host-to-device copy

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        self.trace.all_dispatched.append(name)
        copy = _copy_direction(func, args, kwargs)
        if func is aten._local_scalar_dense.default and args[0].device.type != "cuda":
            return _answer(args[0])  # a host tensor's value: no sync (copied back earlier)
        if (func in _SYNCS or copy == "d2h" or _is_unsized_repeat_interleave(func, kwargs)
                or _is_bool_mask_index(func, args)):
            return self._sync(func, name, args, kwargs)
        if _launches(func) and _touches_cuda(args, kwargs):
            self.trace.ops.append(name)
            if copy == "h2d":
                self.trace.host_to_device.append(name)
        elif func is aten.lift_fresh.default and _on_fake_cuda(args[0]) and not self._copied:
            # torch.tensor(data, device="cuda") on a CUDA build of torch copies the host data
            # below the dispatcher and only shows the lift of its result; on a CPU-only build
            # the copy shows as _to_copy just before. Either way: one host-to-device copy.
            self.trace.ops.append(name)
            self.trace.host_to_device.append(name)
        self._copied = copy == "h2d"
        return func(*args, **kwargs)

    def _sync(self, func, name: str, args: tuple, kwargs: dict):
        where = "".join(traceback.format_stack(limit=12)[:-2])
        if not self.allow_syncs:
            raise HostSyncError(f"host sync on the GPU path: {name}\n{where}")
        self.trace.syncs.append(name)
        if func is aten._local_scalar_dense.default:
            return _answer(args[0])
        if _copy_direction(func, args, kwargs) == "d2h":
            return func(*args, **kwargs)
        raise HostSyncError(f"{name}: a data-dependent shape the fake device cannot know\n{where}")


def _answer(tensor: torch.Tensor) -> bool | int | float:
    """What a read of a fake tensor answers: ``True`` for a flag, 0 for a number.

    nestbatch writes every device check so that these answers pass it (an "ok" flag, or a
    range whose bounds 0 satisfies), so a call under the harness runs its normal path.
    """
    if tensor.dtype == torch.bool:
        return True
    return 0.0 if tensor.is_floating_point() else 0


def _touches_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether an op runs on the device: a CUDA tensor among its inputs, or a CUDA ``device=``
    (factories, host-to-device copies). Ops on host tensors are host work, not launches."""
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else (value,)
        if any(_on_fake_cuda(item) for item in items):
            return True
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cuda"


def _launches(func) -> bool:
    if func.namespace == "prim" or func in _NO_LAUNCH:
        return False
    return not func.is_view


def _is_unsized_repeat_interleave(func, kwargs: dict) -> bool:
    return func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None


def _is_bool_mask_index(func, args: tuple) -> bool:
    # Indexing with a bool mask runs nonzero first: its output size is data-dependent.
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
        return False
    return any(i is not None and i.dtype == torch.bool for i in args[1])


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


@contextlib.contextmanager
def fake_cuda() -> Iterator[FakeTensorMode]:
    """A ``FakeTensorMode`` in which ``device="cuda"`` tensors can be made on a CPU-only torch."""
    mode = FakeTensorMode()
    with mode, _no_cuda_runtime(), _without_device_guard():
        yield mode


def _on_fake_cuda(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda"


def _index_entries(tensor: torch.Tensor, index: Any) -> list:
    index = list(index) if isinstance(index, tuple) else [index]
    if Ellipsis in index:
        at = index.index(Ellipsis)
        used = sum(1 for e in index if e is not None and e is not Ellipsis)
        index[at : at + 1] = [slice(None)] * (tensor.dim() - used)
    return index


def _basic_getitem(tensor: torch.Tensor, index: Any) -> torch.Tensor:
    """``tensor[index]`` through aten ops (what the C++ indexing dispatches), for fake CUDA
    tensors: Python indexing of a CUDA tensor needs a CUDA device guard, which a CPU-only torch
    lacks. Covers ints, slices, None, Ellipsis, and one or more index tensors / lists."""
    out, dim, advanced = tensor, 0, {}
    for entry in _index_entries(tensor, index):
        if entry is None:
            out = out.unsqueeze(dim)
            dim += 1
        elif isinstance(entry, slice):
            start, stop, step = entry.indices(out.shape[dim])
            out = aten.slice.Tensor(out, dim, start, max(stop, start), step)
            dim += 1
        elif isinstance(entry, int) and not isinstance(entry, bool):
            out = aten.select.int(out, dim, entry)
        else:
            advanced[dim] = entry if isinstance(entry, torch.Tensor) else torch.tensor(entry)
            dim += 1
    if advanced:
        indices = [advanced.get(d) for d in range(max(advanced) + 1)]
        out = aten.index.Tensor(out, indices)
    return out


@contextlib.contextmanager
def _without_device_guard() -> Iterator[None]:
    getitem, setitem = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def fake_getitem(self, index):
        if not _on_fake_cuda(self):
            return getitem(self, index)
        return _basic_getitem(self, index)

    def fake_setitem(self, index, value):
        if not _on_fake_cuda(self):
            return setitem(self, index, value)
        target = _basic_getitem(self, index)
        if isinstance(value, torch.Tensor):
            aten.copy_.default(target, value)
        else:
            aten.fill_.Scalar(target, value)

    def fake_to(self, *args, **kwargs):
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        device = self.device if device is None else torch.device(device)
        dtype = self.dtype if dtype is None else dtype
        if not (_on_fake_cuda(self) or device.type == "cuda"):
            return to(self, *args, **kwargs)
        if device == self.device and dtype == self.dtype and not kwargs.get("copy"):
            return self
        return aten._to_copy.default(self, dtype=dtype, device=device, non_blocking=non_blocking)

    def fake_contiguous(self, memory_format=torch.contiguous_format):
        if not _on_fake_cuda(self):
            return contiguous(self, memory_format=memory_format)
        if self.is_contiguous(memory_format=memory_format):
            return self
        return aten.clone.default(self, memory_format=memory_format)

    def fake_item(self):
        return aten._local_scalar_dense.default(self) if _on_fake_cuda(self) else item(self)

    def fake_tolist(self):
        return tolist(self.cpu()) if _on_fake_cuda(self) else tolist(self)

    def fake_copy_(self, src, non_blocking=False):
        if not (_on_fake_cuda(self) or _on_fake_cuda(src)):
            return copy_(self, src, non_blocking)
        return aten.copy_.default(self, src, non_blocking)

    def fake_invert(self):
        return aten.bitwise_not.default(self) if _on_fake_cuda(self) else invert(self)

    invert = torch.Tensor.__invert__
    to, contiguous, item = torch.Tensor.to, torch.Tensor.contiguous, torch.Tensor.item
    tolist, copy_ = torch.Tensor.tolist, torch.Tensor.copy_
    patches = {
        "__getitem__": fake_getitem, "__setitem__": fake_setitem, "to": fake_to,
        "contiguous": fake_contiguous, "item": fake_item, "tolist": fake_tolist,
        "copy_": fake_copy_, "__invert__": fake_invert,
    }
    with contextlib.ExitStack() as stack:
        for name, method in patches.items():
            stack.enter_context(mock.patch.object(torch.Tensor, name, method))
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
        yield


def trace(fn: Callable[..., Any], *args: Any, allow_syncs: bool = False, **kwargs: Any):
    """Run ``fn(*args, **kwargs)`` (inside :func:`fake_cuda`) and return ``(result, Trace)``.

    Raises
    ------
    HostSyncError
        On a host sync (any, or one that is not a bool flag with ``allow_syncs=True``).
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
                "the call needs a real CUDA device (a Python-level .item(), .tolist(), "
                f".nonzero(), Tensor.to(cuda) or copy_ on a CUDA tensor): {error}\n"
                f"ops so far: {record.all_dispatched[-8:]}"
            ) from error
        raise
    return result, record


def count(fn: Callable[..., Any], *args: Any, allow_syncs: bool = False, **kwargs: Any) -> Trace:
    """The :class:`Trace` of ``fn(*args, **kwargs)``; see :func:`trace`."""
    return trace(fn, *args, allow_syncs=allow_syncs, **kwargs)[1]
