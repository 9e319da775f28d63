"""The GPU-path harness: run nestbatch on fake CUDA tensors, count launches, catch host syncs.

Works on a CPU-only PyTorch. :func:`fake_cuda` opens a
``torch._subclasses.fake_tensor.FakeTensorMode`` in which tensors made with ``device="cuda"``
are fake CUDA tensors (shapes, dtypes and devices, no data); :func:`trace` runs a callable under
it with a ``TorchDispatchMode`` on top that sees every aten and ``nestbatch::`` op the call
dispatches and records:

* ``ops``: the ops that launch work on the device (views, allocations and metadata queries do
  not; a ``nestbatch::`` operator counts once). Checked against the torch profiler on an H100,
  this count equals the kernel launches of the same call (see ``shared/gpu/README.md``);
* ``syncs``: ops whose result the host must wait for (``_local_scalar_dense`` behind ``.item()``
  and ``bool(t)``, ``nonzero``, ``masked_select``, ``equal``, ``repeat_interleave`` without
  ``output_size``, copies from the device to the host, ...);
* ``host_to_device``: copies of host data to the device (each is also an op; pageable copies are
  what makes a call impossible to capture in a CUDA graph).

A sync fails the call with :class:`HostSyncError` unless ``allow_syncs=True``; then reads are
answered ``True`` for a bool flag and 0 for a number (nestbatch's device checks pass with those
answers), and an op with a data-dependent output shape still raises. Values of host tensors read
back after a device-to-host copy are answered the same way and are not syncs themselves. ``torch.cuda.*`` calls on the path raise
:class:`CudaRuntimeCall`, and so do the Python-level ops that need a real CUDA device guard
(``.item()``, ``.tolist()``, ``.nonzero()``, ``Tensor.to(cuda)``, ``copy_``). Python indexing
(``t[...]``) needs such a guard too; the harness routes it to the aten ops C++ indexing
dispatches (``slice``, ``select``, ``index``), so library code indexes as usual. Advanced
indexing with a tensor writes back through ``index_put_`` on a real GPU; under the harness
``t[index] = v`` of a view becomes ``copy_`` / ``fill_`` (same count).

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
    with mode, _no_cuda_runtime(), _indexing_without_device_guard():
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
def _indexing_without_device_guard() -> Iterator[None]:
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

    with mock.patch.object(torch.Tensor, "__getitem__", fake_getitem), \
            mock.patch.object(torch.Tensor, "__setitem__", fake_setitem):
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
