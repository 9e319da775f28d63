"""The road from nestbatch's layers to the ``nestbatch::*`` operators: which implementation a
call runs (the compiled CUDA kernel, the operator, or its CPU implementation directly), without
argument checks (:mod:`nestbatch.kernels.checks` and the entry points of
:mod:`nestbatch.kernels.api` make them)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor

from nestbatch.kernels import cpu, operators  # (operators registers nestbatch::*)
from nestbatch.kernels.extension import load_extension

_ops = torch.ops.nestbatch


def call(name: str, *args: object) -> object:
    """Run operator ``nestbatch::<name>`` on arguments the caller has already validated.

    The one road from nestbatch's layouts to the operators: no argument checks, no device
    reads. CUDA tensors, fake tensors and graphs that ``torch.compile`` traces go through the
    operator (compiled kernel, fake kernel, autograd formula). Host tensors that autograd need
    not record would only run its CPU implementation, so that is called directly: the same
    computation without the custom-op dispatch (about 50 us a call). Host tensors that autograd
    records go through the operator too: its backward formula is one operator call, where
    PyTorch differentiating the reference composition would run one backward node per sample
    (``pad_sequence``'s; 75x slower at 256 samples).
    """
    first = args[0]
    if type(first) is Tensor and first.is_cpu and not torch.compiler.is_compiling():
        # runs_on_host, inline (a FakeTensor is a subclass): every host conversion comes here.
        # The C function first, straight from here where it applies: the first step of the CPU
        # implementation, without its frames (each costs several us when the caches are cold).
        # Its operators' one differentiable input is the first (HOST_KERNELS).
        host = HOST.get(name)
        if host is not None and not (first.requires_grad and torch.is_grad_enabled()):
            result = host(*args)
            if result is not None:
                return result
        if torch.is_grad_enabled() and _any_requires_grad(args):
            return getattr(_ops, name)(*args)
        return CPU[name](*args)
    if isinstance(first, FakeTensor) or torch.compiler.is_compiling():
        return getattr(_ops, name)(*args)
    if first.is_cpu:  # (subclasses of Tensor: nn.Parameter, ...)
        if torch.is_grad_enabled() and _any_requires_grad(args):
            return getattr(_ops, name)(*args)
        return CPU[name](*args)
    if first.is_cuda:
        kernel = _direct_kernel(name, args)
        if kernel is not None:
            return kernel(*args)
    return getattr(_ops, name)(*args)


def _any_requires_grad(args: tuple) -> bool:
    for arg in args:
        if isinstance(arg, Tensor) and arg.requires_grad:
            return True
    return False


def runs_on_host(first: Tensor) -> bool:
    """Whether :func:`call` runs the CPU implementation directly (host tensors, eager)."""
    return first.is_cpu and not isinstance(first, FakeTensor) and not torch.compiler.is_compiling()


def call_validating(name: str, *args: object) -> Tensor | None:
    """:func:`call` of operator ``name`` on ``args`` when that call checks the indices itself,
    else ``None`` (nothing computed).

    Such a call raises (``IndexError`` or ``RuntimeError``) for every valid slot outside
    ``[-n, n)`` (``n`` the size of the dim the slot indexes) and counts a negative slot from
    the end of that dim or raises for it too. So far: host calls that take the CPU selection
    path (:func:`nestbatch.kernels.cpu.call_validating`).
    """
    return cpu.call_validating(name, args) if runs_on_host(args[0]) else None


def runs_compiled(args: tuple) -> bool:
    """Whether an operator called on ``args`` runs the compiled CUDA kernels, which never read
    or write out of bounds whatever the indices (the PyTorch implementations may raise)."""
    first = args[0]
    return (
        first.is_cuda
        and not isinstance(first, FakeTensor)
        and not torch.compiler.is_compiling()
        and load_extension()
        and operators.kernels_cover(args)
    )


def _direct_kernel(name: str, args: tuple):
    """The compiled CUDA kernel of operator ``name`` when it covers ``args`` (their dtypes) and
    autograd has nothing to record, else ``None``: the operator's kernel without the Python
    layers of ``torch.library.custom_op`` (about 15 us a call, the kernel's own time at small
    sizes). One pass over ``args`` without generator frames: every CUDA call pays it."""
    grad = torch.is_grad_enabled()
    for arg in args:
        if isinstance(arg, Tensor) and (
            arg.dtype not in _KERNEL_DTYPES or (grad and arg.requires_grad)
        ):
            return None
    return operators.compiled_kernel(name)


CPU = operators.CPU_IMPLEMENTATIONS
HOST = cpu.HOST_KERNELS
_KERNEL_DTYPES = operators.KERNEL_DTYPES


def making_fake_tensors() -> bool:
    """Whether fake tensors are being made (``torch.compile``, FakeTensorMode): host tensors
    then cannot be computed with (ops on them are refused or traced), only made by factories."""
    if torch.compiler.is_compiling():
        return True  # first: dynamo cannot trace the dispatch-mode query below
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
