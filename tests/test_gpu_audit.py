"""GPU-path audit: every registered op and public call, on fake CUDA, at B=4 and B=4096.

Each entry of :data:`CALLS` builds valid arguments for a batch of ``B`` samples (sizes given on
the host, as Python lists, and, in the entries named ``... [device sizes]``, only on the device)
and calls one public function. :func:`test_gpu_path_audit` runs it under :mod:`gpu_path`
(``allow_syncs=True``: reads are answered with the true values) at both batch sizes and checks:

* host sizes: no sync, unless the call is in :data:`EXCEPTIONS` (with why; then one at most);
* the number of device ops (launches) and of syncs is the same at B=4096 as at B=4: nothing
  launches or reads per sample (calls that take or return one tensor per sample compare B=4
  with B=512, see :data:`PER_SAMPLE_SIZE`);
* an in-place method launches and syncs no more than its out-of-place form.

Entries with sizes only on the device (``[device sizes]``, ``RaggedBatch``, index batches) are
held to the second and third rules only: reading device sizes is how some of them work.

A call that breaks a rule because of a library problem is listed in :data:`KNOWN_PROBLEMS`
(what happens and which library line causes it): its test is an expected failure that turns
into a failure once the problem is fixed, so the entry gets removed. The meta-tests check that
every registered torch function, every public name of ``NestedBatch``, ``RaggedBatch``,
``nestbatch.__all__``, ``nestbatch.batching_helpers``, ``nestbatch.convert`` and its kaolin /
pytorch3d / tensorflow modules has an entry or an explicit exclusion (:data:`NOT_AUDITED`),
so new API cannot escape the audit. Batches of ragged rank 2 are audited through the calls in
:data:`NESTED_CALLS` (entries ``nested: ...``).
"""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from gpu_path import Trace, fake_cuda, trace
from torch import nn

import nestbatch as nb
import nestbatch.batching_helpers as helpers
import nestbatch.compat.tensorflow as tensorflow
import nestbatch.conversions as convert
import nestbatch.convert.kaolin as kaolin
import nestbatch.convert.pytorch3d as pytorch3d
from nestbatch import NestedBatch, RaggedBatch
from nestbatch import torch_nested as tn
from nestbatch.ops import registry

pytestmark = pytest.mark.filterwarnings("ignore:PyTorch was compiled without cuDNN")

SIZES = (4, 4096)
#: The larger batch size of calls that take or return one tensor per sample: each of those is a
#: Python object (a view, no launch) that costs the harness about 0.4 ms, so they are audited
#: at 4 and 512 samples to keep the audit fast.
PER_SAMPLE_SIZE = 512
FEATURES = 4
MAX_LEN = 9


@functools.cache
def host_lengths(batch_size: int) -> tuple[int, ...]:
    """1..9 rows per sample, no empty one; the longest is 9 at every batch size (an RNN on the
    fake device steps once per row of the longest sample)."""
    lengths = [1 + (i * 7) % MAX_LEN for i in range(batch_size)]
    lengths[-1] = MAX_LEN
    return tuple(lengths)


def _offsets(lengths: Any) -> list[int]:
    return [0, *itertools.accumulate(lengths)]


class Inputs:
    """Builders of valid arguments for ``batch_size`` samples, called inside ``fake_cuda`` and
    outside the traced call. ``device_sizes``: batches know their sizes only on the device."""

    def __init__(self, batch_size: int, device_sizes: bool) -> None:
        self.B = batch_size
        self.device_sizes = device_sizes
        self.lengths = list(host_lengths(batch_size))
        self.total = sum(self.lengths)
        self.offsets = _offsets(self.lengths)

    def dense(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if dtype == torch.bool:
            return torch.randn(*shape, device="cuda") > 0
        if dtype.is_complex:
            return torch.randn(*shape, dtype=dtype, device="cuda")
        if not dtype.is_floating_point:
            return torch.randint(0, 10, shape, dtype=dtype, device="cuda")
        return torch.randn(*shape, dtype=dtype, device="cuda")

    def values(self, *feature: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.dense(self.total, *(feature or (FEATURES,)), dtype=dtype)

    def device_offsets(self) -> torch.Tensor:
        return torch.tensor(self.offsets, device="cuda")

    def device_lengths(self) -> torch.Tensor:
        return torch.tensor(self.lengths, device="cuda")

    def batch(self, *feature: int, dtype: torch.dtype = torch.float32) -> NestedBatch:
        values = self.values(*feature, dtype=dtype)
        if self.device_sizes:
            return NestedBatch.from_offsets(values, self.device_offsets(), validate=False)
        return NestedBatch.from_lengths(values, self.lengths)

    def like(self, batch: NestedBatch, dtype: torch.dtype | None = None) -> NestedBatch:
        """Another batch of the same partition (the common case: ``a * b`` of one batch's
        derived values)."""
        return batch.with_values(
            self.dense(*batch.values.shape, dtype=dtype or batch.dtype)
        )

    def padded_data(self, *feature: int) -> torch.Tensor:
        return self.dense(self.B, MAX_LEN, *(feature or (FEATURES,)))

    def samples(self, *feature: int) -> list[torch.Tensor]:
        """The batch as a list of B device tensors (views of one tensor)."""
        values = self.values(*feature)
        return [values[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:])]

    def index_batch(self, width: int = 8, num_entries: int = 16) -> RaggedBatch:
        sizes = torch.full((self.B,), width // 2, dtype=torch.int64, device="cuda")
        indices = torch.randint(0, num_entries // 2, (self.B, width), device="cuda")
        return RaggedBatch(indices, sample_sizes=sizes)

    def ragged(self, *feature: int, dtype: torch.dtype = torch.float32) -> RaggedBatch:
        data = self.dense(self.B, MAX_LEN, *feature, dtype=dtype)
        return RaggedBatch(data, sample_sizes=self.device_lengths())


Make = Callable[[Inputs], Callable[[], Any]]


@dataclass(frozen=True)
class Call:
    """An audited call: ``make(inputs)`` returns the call to trace. ``host_sizes``: the rule of
    no sync applies (the sizes are on the host). ``sizes``: the two batch sizes compared."""

    make: Make
    host_sizes: bool = True
    sizes: tuple[int, int] = SIZES


CALLS: dict[str, Call] = {}


def audit(name: str, make: Make, *, device: bool | None = None, host: bool = True) -> None:
    """Add ``name`` (host sizes unless ``host=False``) and, with ``device=True``, its
    ``[device sizes]`` variant (the same ``make`` given batches with device sizes)."""
    if name in CALLS:
        raise ValueError(f"two entries named {name}")
    sizes = (SIZES[0], PER_SAMPLE_SIZE) if name.split(" [")[0] in PER_SAMPLE else SIZES
    CALLS[name] = Call(_with_sizes(make, False), host, sizes)
    if device:
        CALLS[f"{name} [device sizes]"] = Call(_with_sizes(make, True), False, sizes)


#: Calls taking or returning one tensor per sample (see :data:`PER_SAMPLE_SIZE`).
PER_SAMPLE = {
    "torch.unbind", "Tensor.unbind", "NestedBatch.unbind", "NestedBatch.__iter__",
    "NestedBatch.tensor_list", "NestedBatch.from_list", "nb.nested", "nb.as_nested", "nb.pack",
    "torch_nested.nested_tensor", "torch_nested.as_nested_tensor",
    "nb.collate", "nb.combine_data", "nb.TensorList", "RaggedBatch.split",
    "kaolin.get_shape_per_tensor", "kaolin.list_to_packed", "kaolin.list_to_padded",
    "kaolin.packed_to_list", "kaolin.padded_to_list", "pytorch3d.list_to_packed",
    "pytorch3d.list_to_padded", "pytorch3d.packed_to_list", "pytorch3d.padded_to_list",
    "convert.to_list", "convert.packed_to_list", "convert.padded_to_list",
    "convert.list_to_packed", "convert.list_to_padded",
}


def _with_sizes(make: Make, device_sizes: bool) -> Make:
    def build(inputs: Inputs) -> Callable[[], Any]:
        inputs.device_sizes = device_sizes
        return make(inputs)

    return build


# ============================================================================== exceptions
_BOOL_RESULT = "returns a Python bool: one read of the comparison's result"
_PYTHON_DATA = "returns Python data: one device-to-host copy of the values"
_VALIDATES_INDICES = ("validate=True checks the index values, which live on the device: one read "
                      "(the [validate=False] entry makes none)")

#: Calls that read the device once by design although the sizes are on the host, and why. Each
#: may make one sync, the same at every batch size.
EXCEPTIONS: dict[str, str] = {
    "torch.equal": _BOOL_RESULT,
    "Tensor.equal": _BOOL_RESULT,
    "torch.allclose": _BOOL_RESULT,
    "Tensor.allclose": _BOOL_RESULT,
    "NestedBatch.tolist": _PYTHON_DATA,
    "NestedBatch.to_list": _PYTHON_DATA,
    "NestedBatch.cpu": "returns a batch on the host: one device-to-host copy of the values",
    "Tensor.__getitem__ [b[device indices]]": "the samples are picked by indices on the device: "
    "one read of their smallest and largest value, to raise IndexError (the result's sizes "
    "stay on the device)",
    "nb.packed_indices": _VALIDATES_INDICES,
    "nb.local_indices": _VALIDATES_INDICES,
}

#: Calls that break a rule because of a library problem: what happens, and the lines causing it.
#: (Empty: the eleven the first audit found are fixed; see the git history of this file.)
KNOWN_PROBLEMS: dict[str, str] = {}

_AUTOGRAD = ("needs requires_grad=True, and autograd aborts the process on fake CUDA tensors "
             "with a CPU-only torch (tests/test_batch_autograd.py checks it on the CPU)")

#: Public names and registered functions not audited here, and why.
NOT_AUDITED: dict[str, str] = {
    "torch.msort": "sorts along dim 0, the batch: refused (a ValueError) before any launch",
    "Tensor.msort": "sorts along dim 0, the batch: refused (a ValueError) before any launch",
    "nb.Layout": "an enum of the layout kinds: no tensor, nothing to launch",
    "nb.INDEX_FILLER": "a constant (the padded slots of an index batch): nothing to call",
    "nb.torch_nested": "a module: its functions are audited as torch_nested.*",
    "RaggedBatch.retain_grad": _AUTOGRAD,
    "NestedBatch.retain_grad": _AUTOGRAD,
    "NestedBatch.backward": _AUTOGRAD,
    "torch.autograd.backward": _AUTOGRAD,
    "torch.autograd.grad": _AUTOGRAD,
    "nb.RaggedSize": "the size of a ragged dim in a shape: holds the partition, launches nothing "
    "(NestedBatch.shape is audited)",
    "nb.NestedSize": "a tuple of sizes: launches nothing (NestedBatch.shape is audited)",
    "NestedBatch.share_memory_": "host shared memory, torch's own call on each stored tensor "
    "(a no-op for CUDA tensors; a fake CUDA tensor's storage is a host one, which refuses it)",
    "NestedBatch.is_shared": "torch's own query of each stored tensor: launches nothing",
}


# ====================================================================== registered functions
@functools.cache
def _names_of(namespace: Any, prefix: str) -> dict[int, str]:
    found = {}
    for key in dir(namespace):
        try:
            value = getattr(namespace, key)
        except Exception:  # noqa: BLE001
            continue
        found.setdefault(id(value), f"{prefix}.{key}")
    return found


_NAMESPACES = [(torch, "torch"), (torch.Tensor, "Tensor"), (F, "F"),
               (torch.special, "torch.special"), (torch.autograd, "torch.autograd"),
               (torch.nested, "torch.nested"), (torch.linalg, "torch.linalg")]
#: Where the C functions that torch's Python wrappers call live (``atleast_3d`` of a list, the
#: pools): their names, for functions no namespace above holds.
_C_NAMESPACES = [(torch._C._VariableFunctions, "torch._VF"), (torch._C._nn, "torch._C._nn")]


def qualified_name(func: Callable) -> str:
    """``torch.exp``, ``Tensor.exp``, ``F.relu``, ``torch.special.softmax``: the first
    namespace holding ``func`` (under its own name when it has several)."""
    own = getattr(func, "__name__", None)
    for namespace, prefix in _NAMESPACES:
        if own and getattr(namespace, own, None) is func:
            return f"{prefix}.{own}"
    for namespace, prefix in (*_NAMESPACES, *_C_NAMESPACES):
        name = _names_of(namespace, prefix).get(id(func))
        if name is not None:
            return name
    return repr(func)


def _op_name(qualified: str) -> str:
    return qualified.rsplit(".", 1)[1]


# Recipes: (inputs, func) -> the call. Values need no particular range: nothing is validated
# on them (log of a negative is NaN on the GPU too).
Recipe = Callable[[Inputs, Callable], Callable[[], Any]]


def unary(*args: Any, dtype: torch.dtype = torch.float32, **kwargs: Any) -> Recipe:
    def make(s: Inputs, f: Callable) -> Callable[[], Any]:
        b = s.batch(dtype=dtype)
        return lambda: f(b, *args, **kwargs)

    return make


def binary(*args: Any, dtype: torch.dtype = torch.float32, **kwargs: Any) -> Recipe:
    def make(s: Inputs, f: Callable) -> Callable[[], Any]:
        b = s.batch(dtype=dtype)
        other = s.like(b)
        return lambda: f(b, other, *args, **kwargs)

    return make


def ternary(*args: Any, **kwargs: Any) -> Recipe:
    def make(s: Inputs, f: Callable) -> Callable[[], Any]:
        b = s.batch()
        one, two = s.like(b), s.like(b)
        return lambda: f(b, one, two, *args, **kwargs)

    return make


def with_scalar(value: Any, dtype: torch.dtype = torch.float32) -> Recipe:
    def make(s: Inputs, f: Callable) -> Callable[[], Any]:
        b = s.batch(dtype=dtype)
        return lambda: f(b, value)

    return make


def with_dense(dtype: torch.dtype = torch.float32) -> Recipe:
    """The other operand a dense tensor broadcast over the features."""
    def make(s: Inputs, f: Callable) -> Callable[[], Any]:
        b = s.batch(dtype=dtype)
        other = s.dense(FEATURES, dtype=dtype)
        return lambda: f(b, other)

    return make


def mask_first(s: Inputs, f: Callable) -> Callable[[], Any]:  # torch.where(mask, b, other)
    b = s.batch()
    mask, other = s.like(b, torch.bool), s.like(b)
    return lambda: f(mask, b, other)


def mask_second(*rest: Any) -> Recipe:  # b.where(mask, other), masked_fill(b, mask, value)
    def make(s: Inputs, f: Callable) -> Callable[[], Any]:
        b = s.batch()
        mask = s.like(b, torch.bool)
        other = s.like(b) if not rest else rest[0]
        return lambda: f(b, mask, other)

    return make


_UNARY_FLOAT = (
    "abs", "absolute", "neg", "negative", "positive", "sgn", "sign", "signbit", "logical_not",
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "square",
    "reciprocal", "sigmoid", "tanh", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "floor", "ceil", "round", "trunc",
    "frac", "relu", "isnan", "isinf", "isfinite", "isneginf", "isposinf", "nan_to_num", "logit",
    "lgamma", "digamma", "deg2rad", "rad2deg", "sinc", "conj", "real", "angle", "float",
    "double", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool", "clone",
    "detach", "contiguous", "empty_like", "zeros_like", "ones_like", "rand_like", "randn_like",
    "zero_", "__neg__", "__abs__",
    # torch.nn.functional activations and dropout (training=True: a random mask, one op)
    "relu6", "elu", "selu", "celu", "leaky_relu", "gelu", "silu", "mish", "softplus",
    "softsign", "hardtanh", "hardswish", "hardsigmoid", "logsigmoid", "tanhshrink",
    "softshrink", "hardshrink", "rrelu", "dropout", "alpha_dropout", "feature_alpha_dropout",
    # aliases and torch.special's elementwise functions
    "arccos", "arcsin", "arctan", "arccosh", "arcsinh", "arctanh", "fix", "i0", "isreal",
    "resolve_conj", "resolve_neg", "cfloat", "cdouble", "chalf", "expit", "ndtr", "ndtri",
    "i0e", "i1", "i1e", "psi", "gammaln", "entr", "log_ndtr", "erfcx",
    "airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0",
    "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
    "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0",
    # facts of the stored tensors and the dtype (no op at all)
    "nelement", "ndimension", "is_floating_point", "is_complex", "is_signed", "is_conj",
    "is_neg", "is_inference", "get_device",
)
_BINARY_FLOAT = (
    "add", "sub", "subtract", "rsub", "mul", "multiply", "div", "divide", "true_divide",
    "floor_divide", "remainder", "fmod", "pow", "float_power", "atan2", "arctan2", "hypot",
    "maximum", "minimum", "fmax", "fmin", "copysign", "xlogy", "heaviside", "eq", "ne", "lt",
    "le", "gt", "ge", "greater", "greater_equal", "less", "less_equal", "not_equal", "isclose",
    "logical_and", "logical_or", "logical_xor", "__add__", "__sub__", "__mul__", "__truediv__",
    "__floordiv__", "__mod__", "__pow__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
    "__ge__", "__iadd__", "__isub__", "__imul__", "__idiv__", "__itruediv__", "__ifloordiv__",
    "__imod__", "__ipow__", "equal", "allclose", "logaddexp", "logaddexp2", "igamma",
    "igammac", "nextafter", "xlog1py", "zeta", "gammainc", "gammaincc",
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
    "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
    "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p",
)
_BINARY_INT = ("bitwise_left_shift", "bitwise_right_shift", "__lshift__", "__rshift__",
               "__rlshift__", "__rrshift__", "gcd", "lcm")
_BINARY_BOOL = ("bitwise_and", "bitwise_or", "bitwise_xor", "__and__", "__or__", "__xor__",
                "__rand__", "__ror__", "__rxor__", "__iand__", "__ior__", "__ixor__")
_REFLECTED = ("__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rdiv__", "__rfloordiv__",
              "__rmod__", "__rpow__")

def _over_ragged_dim(n: int, weight: tuple[int, ...] | None, *args: Any) -> Recipe:
    """A convolution / pooling over the ragged dim: samples ``(L_i, C, *rest)`` presented as
    ``(C, L_i, *rest)`` (``transpose(1, 2)``); ``weight``: a convolution's weight shape."""
    def make(s: Inputs, f: Callable) -> Callable[[], Any]:
        b = s.batch(*((FEATURES,) if n == 1 else (2,) + (3,) * (n - 1))).transpose(1, 2)
        if weight is None:
            return lambda: f(b, *args)
        w = s.dense(*weight)
        return lambda: f(b, w, None, *args)

    return make


_CONV_CHANNELS = {1: FEATURES, 2: 2, 3: 2}

RECIPES: dict[str, Recipe] = {
    **{f"conv{n}d": _over_ragged_dim(n, (3, _CONV_CHANNELS[n], 1, *(2,) * (n - 1)), 1, 1)
       for n in (1, 2, 3)},
    **{f"conv_transpose{n}d": _over_ragged_dim(n, (_CONV_CHANNELS[n], 3, 1, *(2,) * (n - 1)),
                                               2, 0, 1) for n in (1, 2, 3)},
    **{name: _over_ragged_dim(int(name[8]), None, 2, 1, 1) for name in (
        *(f"max_pool{n}d{suffix}" for n in (1, 2, 3) for suffix in ("", "_with_indices")),
        "avg_pool1d", "avg_pool2d")},
    # (avg_pool3d refuses an input dim shorter than its kernel: a kernel of 1 along the ragged
    # dim, whose samples may have one row)
    "avg_pool3d": _over_ragged_dim(3, None, (1, 2, 2), 1, (0, 1, 1)),
    **{name: unary() for name in _UNARY_FLOAT},
    **{name: binary() for name in _BINARY_FLOAT},
    **{name: binary(dtype=torch.bool) for name in _BINARY_BOOL},
    **{name: binary(dtype=torch.int64) for name in _BINARY_INT},
    "ldexp": binary(),
    "conj_physical": unary(dtype=torch.complex64),  # (of real values a no-op out of place)
    "mvlgamma": unary(1),
    "multigammaln": unary(1),
    "Tensor.polygamma": unary(1),  # (the method: the order first after the batch)
    "Tensor.polygamma_": unary(1),
    "torch.polygamma": lambda s, f: (lambda b: lambda: f(1, b))(s.batch()),
    "torch.special.polygamma": lambda s, f: (lambda b: lambda: f(1, b))(s.batch()),
    **{f"torch.{name}": unary(0.5, True)  # (torch's spellings: p and train positional)
       for name in ("dropout", "alpha_dropout", "feature_alpha_dropout")},
    "repeat_interleave": unary(2, 1),
    "vector_norm": unary(2, 1),
    "norm": unary(2, 1),
    "result_type": binary(),
    "is_same_size": binary(),
    **{name: with_scalar(2.0) for name in _REFLECTED},
    "bitwise_not": unary(dtype=torch.bool),
    "__invert__": unary(dtype=torch.bool),
    "torch.nested.to_padded_tensor": unary(-1.0),
    "unflatten": unary(-1, (2, FEATURES // 2)),
    "chunk": unary(2, -1),
    "split": unary(2, -1),
    "tensor_split": unary(2, -1),
    "split_with_sizes": unary([1, FEATURES - 1], -1),
    "type_as": lambda s, f: (lambda b, other: lambda: f(b, other))(
        s.batch(), s.dense(1).to(torch.float64)),
    "narrow": unary(-1, 1, 2),
    "numel": unary(),
    "element_size": unary(),
    "is_contiguous": unary(),
    "imag": unary(dtype=torch.complex64),
    "clamp": unary(-1.0, 1.0),
    "clip": unary(-1.0, 1.0),
    "clamp_min": unary(0.0),
    "clamp_max": unary(0.0),
    "full_like": unary(1.0),
    "randint_like": unary(10),
    "fill_": unary(1.0),
    "threshold": unary(0.0, 1.0),
    "_threshold": unary(0.0, 1.0),
    "lerp": binary(0.5),
    "addcmul": ternary(),
    "addcdiv": ternary(),
    "torch.where": mask_first,
    "where": mask_second(),
    "masked_fill": mask_second(0.0),
    "glu": unary(dim=-1),
    "normalize": unary(dim=-1),
    # reductions over the ragged dim
    **{name: unary(dim=1) for name in (
        "sum", "nansum", "mean", "prod", "amax", "amin", "argmax", "argmin", "logsumexp",
        "count_nonzero", "any", "all", "var", "std", "max", "min", "softmax", "log_softmax")},
    # shape
    "reshape": lambda s, f: (lambda b: lambda: f(b, (-1, -1, 2, 2)))(s.batch()),
    "view": lambda s, f: (lambda b: lambda: f(b, (s.B, -1, 2, 2)))(s.batch()),
    "reshape_as": lambda s, f: (lambda b, o: lambda: f(b, o))(s.batch(), s.batch(2, 2)),
    "view_as": lambda s, f: (lambda b, o: lambda: f(b, o))(s.batch(), s.batch(2, 2)),
    "transpose": unary(1, 2),
    "swapaxes": unary(1, 2),
    "swapdims": unary(1, 2),
    "permute": unary((0, 2, 1)),
    "movedim": unary(1, 2),
    "moveaxis": unary(1, 2),
    "select": unary(1, 0),
    "unbind": unary(),
    "unsqueeze": unary(-1),
    "squeeze": lambda s, f: (lambda b: lambda: f(b, -1))(s.batch(FEATURES, 1)),
    "flatten": lambda s, f: (lambda b: lambda: f(b, 2))(s.batch(2, 2)),
    "expand": lambda s, f: (lambda b: lambda: f(b, -1, -1, 3, FEATURES))(s.batch(1, FEATURES)),
    "broadcast_to": lambda s, f: (lambda b: lambda: f(b, (-1, -1, 3, FEATURES)))(
        s.batch(1, FEATURES)),
    "expand_as": lambda s, f: (lambda b, w: lambda: f(w, b))(s.batch(), s.dense(FEATURES)),
    "broadcast_tensors": lambda s, f: (lambda b, w: lambda: f(b, w))(
        s.batch(1, FEATURES), s.dense(3, FEATURES)),
    # channel dropouts (training: one mask over the padded data's channels) and frexp
    "dropout1d": unary(0.5),
    "dropout2d": lambda s, f: (lambda b: lambda: f(b, 0.5))(s.batch(2, 4)),
    "dropout3d": lambda s, f: (lambda b: lambda: f(b, 0.5))(s.batch(2, 2, 2)),
    "feature_dropout": unary(0.5, True),
    "torch.feature_alpha_dropout_": unary(0.5, True),
    "native_dropout": unary(0.5, True),
    "frexp": unary(),
    "tril": unary(),  # (the ragged dim the rows: one comparison with every row's position)
    "triu": unary(1),
    # lookups (a batch of the input's structure) and counts (a dense result) of ops/lookup.py
    "one_hot": lambda s, f: (lambda b: lambda: f(b, 10))(s.batch(dtype=torch.long).select(2, 0)),
    "isin": lambda s, f: (lambda b, t: lambda: f(b, t))(
        s.batch(dtype=torch.long), s.dense(3, dtype=torch.long)),
    "bucketize": lambda s, f: (lambda b, e: lambda: f(b, e))(s.batch(), s.dense(5).sort().values),
    "searchsorted": lambda s, f: (lambda e, b: lambda: f(e, b))(
        s.dense(5).sort().values, s.batch()),
    "histc": unary(10, -1.0, 1.0),
    "histogram": unary(4, range=(-1.0, 1.0)),
    **{name: lambda s, f: (lambda b: lambda: f(b))(s.batch(dtype=torch.long).select(2, 0))
       for name in ("bincount", "unique", "unique_consecutive")},
    "batch_norm": lambda s, f: (lambda b: lambda: f(b, None, None, training=True))(
        s.batch().transpose(1, 2)),  # (channels at dim 1, the ragged length after them)
    # (two spatial elements a row: a sample of one row is normalized, not refused)
    "instance_norm": lambda s, f: (lambda b: lambda: f(b))(s.batch(FEATURES, 2).transpose(1, 2)),
    "group_norm": lambda s, f: (lambda b: lambda: f(b, 2))(s.batch().transpose(1, 2)),
    # index_put: (sample, position) pairs given on the host
    **{name: lambda s, f: (lambda b, i, j: lambda: f(b, (i, j), torch.tensor(1.0)))(
        s.batch(), torch.tensor([0, s.B - 1]), torch.tensor([0, -1]))
       for name in ("index_put", "index_put_")},
    # elementwise losses (torch.nn.functional), on the packed rows
    **{name: binary() for name in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                                   "binary_cross_entropy_with_logits", "poisson_nll_loss",
                                   "soft_margin_loss", "hinge_embedding_loss")},
    "binary_cross_entropy": lambda s, f: (lambda p: lambda: f(p, s.like(p).sigmoid()))(
        s.batch().sigmoid()),  # (torch checks the values are in [0, 1])
    "kl_div": binary(reduction="batchmean"),
    "gaussian_nll_loss": binary(1.0),  # (a float var; a tensor var: the entry below)
    "margin_ranking_loss": ternary(),
    # scans along the ragged dim; in place along a feature dim, torch's op on the stored rows
    # (along the ragged dim the result is copied into them: one launch more than out of place)
    **{name: unary(dim=1) for name in ("cumsum", "cumprod", "logcumsumexp", "cummax",
                                       "cummin")},
    "cumsum_": unary(dim=-1),
    "cumprod_": unary(dim=-1),
    # ordering along the ragged dim (flip / roll: the samples' order too)
    **{name: unary(dim=1) for name in ("sort", "argsort", "diff")},
    **{name: unary(1, dim=1) for name in ("topk", "kthvalue")},
    # order statistics and paired reductions over the ragged dim
    **{name: unary(1) for name in ("median", "nanmedian", "mode", "var_mean", "std_mean")},
    **{name: unary(0.5, 1) for name in ("quantile", "nanquantile")},
    "aminmax": unary(dim=1),
    "flip": unary((0, 1)),
    "roll": unary((1, 2), (0, 1)),
    "fliplr": unary(),
    # padding (pad.py): over the ragged dim of (B, C, j) (every length is 1 or more), and
    # reflect / replicate over the n feature dims of (B, j, 4, ...) (padNd)
    "pad": lambda s, f: (lambda b: lambda: f(b, (1, 2)))(s.batch().transpose(1, 2)),
    "constant_pad_nd": lambda s, f: (lambda b: lambda: f(b, (1, 2), 0.5))(
        s.batch().transpose(1, 2)),
    "_pad_enum": lambda s, f: (lambda b: lambda: f(b, (1, 1), 1))(s.batch().transpose(1, 2)),
    "_pad_circular": lambda s, f: (lambda b: lambda: f(b, (1, 1)))(s.batch().transpose(1, 2)),
    **{f"{kind}_pad{n}d": (lambda dims: lambda s, f: (lambda b: lambda: f(b, (1, 1) * dims))(
        s.batch(*(FEATURES,) * dims)))(n)
       for kind in ("reflection", "replication") for n in (1, 2, 3)},
    "flipud": unary(),
    # torch.cat of the tensors given at least so many dims
    **{name: lambda s, f: (lambda a, b: lambda: f([a, b]))(s.batch(), s.batch())
       for name in ("hstack", "vstack", "row_stack", "dstack", "column_stack")},
    **{name: unary() for name in ("atleast_1d", "atleast_2d", "atleast_3d")},
    "softmin": unary(dim=1),
    "cosine_similarity": binary(dim=-1),
    "pairwise_distance": binary(),
    # new_*: a plain tensor of the batch's dtype and device
    "new_zeros": unary((2, 3)),
    "new_ones": unary((2, 3)),
    "new_empty": unary((2, 3)),
    "new_full": unary((2, 3), 1.0),
    "new_tensor": unary([1.0, 2.0]),
    "new_empty_strided": unary((2, 3), (3, 1)),
    "copy_": binary(),
    "tile": unary((1, 2)),
    "repeat": unary(1, 1, 2),
    "float_power_": binary(dtype=torch.float64),
    "cat": lambda s, f: (lambda b: lambda: f([b, s.like(b)], 1))(s.batch()),
    "concat": lambda s, f: (lambda b: lambda: f([b, s.like(b)], 1))(s.batch()),
    "concatenate": lambda s, f: (lambda b: lambda: f([b, s.like(b)], 1))(s.batch()),
    "stack": lambda s, f: (lambda b: lambda: f([b, s.like(b)], 2))(s.batch()),
    # matmul: (B, j, F) @ (F, 3); bmm: (B, j, F) @ (B, F, j') of a transposed batch
    "matmul": lambda s, f: (lambda b, w: lambda: f(b, w))(s.batch(), s.dense(FEATURES, 3)),
    "__matmul__": lambda s, f: (lambda b, w: lambda: f(b, w))(s.batch(), s.dense(FEATURES, 3)),
    "__rmatmul__": lambda s, f: (lambda b, w: lambda: f(b, w))(  # w @ b
        s.batch(2, FEATURES), s.dense(3, 2)),
    "bmm": lambda s, f: (lambda b: lambda: f(b, s.like(b).transpose(1, 2)))(s.batch()),
    # nn.functional
    "linear": lambda s, f: (lambda b, w, c: lambda: f(b, w, c))(
        s.batch(), s.dense(3, FEATURES), s.dense(3)),
    "layer_norm": lambda s, f: (lambda b, w, c: lambda: f(b, (FEATURES,), w, c))(
        s.batch(), s.dense(FEATURES), s.dense(FEATURES)),
    "rms_norm": lambda s, f: (lambda b, w: lambda: f(b, (FEATURES,), w))(
        s.batch(), s.dense(FEATURES)),
    "prelu": lambda s, f: (lambda b, w: lambda: f(b, w))(s.batch(), s.dense(1)),
    "embedding": lambda s, f: (lambda b, w: lambda: f(b, w))(
        s.batch(dtype=torch.long).select(2, 0), s.dense(10, 3)),
    "embedding_bag": lambda s, f: (lambda b, w: lambda: f(b, w, mode="sum"))(
        s.batch(dtype=torch.long).select(2, 0), s.dense(10, 3)),
    "scaled_dot_product_attention": lambda s, f: (lambda b: lambda: f(b, b, b))(s.batch()),
    "__getitem__": lambda s, f: (lambda b: lambda: f(b, (slice(None), slice(None, 2))))(
        s.batch()),
    "__setitem__": lambda s, f: (lambda b: lambda: f(b, (slice(None), slice(None, 2)), 1.0))(
        s.batch()),
}

#: Registered functions audited by another entry (the function is what the entry calls).
AUDITED_BY = {
    "torch.rnn_tanh": "nn.RNN(batch)",
    "torch.rnn_relu": "nn.RNN(nonlinearity='relu')(batch)",
    "torch.gru": "nn.GRU(batch)",
    "torch.lstm": "nn.LSTM(batch)",
}


def _recipe_for(qualified: str) -> Recipe | None:
    if qualified in RECIPES:
        return RECIPES[qualified]
    name = _op_name(qualified)
    if name in RECIPES:
        return RECIPES[name]
    if name.endswith("_") and not name.startswith("__") and name[:-1] in RECIPES:
        return RECIPES[name[:-1]]  # b.add_(other) as b.add(other)
    return None


def _registered(func: Callable) -> Make:
    qualified = qualified_name(func)
    recipe = _recipe_for(qualified)
    return lambda s: recipe(s, as_called(func, qualified))


def as_called(func: Callable, qualified: str) -> Callable:
    """How a user reaches ``func`` with a batch: ``torch.*`` and ``F.*`` functions directly, a
    ``Tensor`` method as the batch's method of that name when the registry made it from
    ``func``, else (``Tensor`` dunders) as torch hands it to ``__torch_function__``."""
    if not qualified.startswith("Tensor."):
        return func
    name = qualified[len("Tensor."):]
    if registry._METHOD_SOURCES.get(name) is func:
        return lambda self, *args, **kwargs: getattr(self, name)(*args, **kwargs)
    return lambda *args, **kwargs: NestedBatch.__torch_function__(
        func, (NestedBatch,), args, kwargs)


def _out_of_place_name(qualified: str) -> str | None:
    """``Tensor.add`` for ``Tensor.add_`` / ``Tensor.__iadd__`` (the same variant), if
    audited."""
    qualified, bracket, variant = qualified.partition(" [")
    if "." not in qualified or " " in qualified:
        return None
    variant = bracket + variant
    prefix, name = qualified.rsplit(".", 1)
    if name.startswith("__i") and name.endswith("__"):
        base = {"__idiv__": "__truediv__", "__itruediv__": "__truediv__"}.get(
            name, f"__{name[3:]}")
    elif name.endswith("_") and not name.startswith("__"):
        base = name[:-1]
    else:
        return None
    return f"{prefix}.{base}{variant}"


#: Elementwise ops never read the sizes: only these of them are also audited on batches with
#: device sizes.
_ELEMENTWISE = {*_UNARY_FLOAT, *_BINARY_FLOAT, *_BINARY_BOOL, *_REFLECTED, "bitwise_not",
                "__invert__", "imag", "clamp", "clip", "clamp_min", "clamp_max", "full_like",
                "randint_like", "fill_", "threshold", "_threshold", "lerp", "addcmul", "addcdiv",
                "where", "masked_fill", "float_power_", "prelu"} - {"equal", "allclose"}
_DEVICE_SIZED_ELEMENTWISE = {"torch.exp", "torch.add", "Tensor.add_", "Tensor.exp_",
                             "Tensor.__add__", "Tensor.__iadd__", "torch.where", "F.relu",
                             "F.dropout", "torch.zeros_like", "torch.clone"}


def _elementwise(qualified: str) -> bool:
    name = _op_name(qualified)
    return name in _ELEMENTWISE or (name.endswith("_") and name[:-1] in _ELEMENTWISE)


for _func in registry.registered_functions():
    _name = qualified_name(_func)
    if _name in AUDITED_BY or _recipe_for(_name) is None:
        continue  # AUDITED_BY: below; no recipe: test_every_registered_function_is_audited
    audit(_name, _registered(_func),
          device=not _elementwise(_name) or _name in _DEVICE_SIZED_ELEMENTWISE)


# Variants of the common ops: other operands, other dims.
audit("torch.add [batch + dense]", lambda s: with_dense()(s, torch.add), device=True)
audit("torch.mul [batch * scalar]", lambda s: with_scalar(3.0)(s, torch.mul), device=True)
audit("torch.add [other partition, same sizes]",
      lambda s: (lambda a, b: lambda: a + b)(s.batch(), s.batch()), device=True)
audit("torch.sum [feature dim]", lambda s: unary(dim=-1)(s, torch.sum), device=True)
audit("torch.sum [all]", lambda s: unary()(s, torch.sum), device=True)
audit("torch.argmax [all]", lambda s: unary()(s, torch.argmax), device=True)
audit("torch.argmin [all, ragged dim moved]",
      lambda s: (lambda b: lambda: torch.argmin(b))(s.batch().transpose(1, 2)), device=True)
audit("F.gaussian_nll_loss [tensor var]", lambda s: (lambda b: lambda: F.gaussian_nll_loss(
    b, s.like(b), s.like(b).abs()))(s.batch()), device=True)
EXCEPTIONS["F.gaussian_nll_loss [tensor var]"] = (
    "torch's own check that var holds no negative entry (torch.any(var < 0)) reads the device "
    "once, as for a dense tensor")
audit("torch.conv1d [ragged dim first: samples (n_i, C, L)]", lambda s: (
    lambda b, w: lambda: torch.conv1d(b, w))(s.batch(3, 5), s.dense(2, 3, 2)), device=True)
audit("F.max_pool1d [ragged channels: samples (n_i, L)]",
      lambda s: (lambda b: lambda: F.max_pool1d(b, 2))(s.batch(5)), device=True)
audit("torch.cosine_similarity [ragged dim]",
      lambda s: (lambda b: lambda: torch.cosine_similarity(b, b, dim=1))(s.batch()),
      device=True)
audit("F.dropout1d [ragged dim moved]",
      lambda s: (lambda b: lambda: F.dropout1d(b, 0.5))(s.batch().transpose(1, 2)),
      device=True)
audit("torch.amax [empty samples]",
      lambda s: (lambda b: lambda: torch.amax(b, dim=1))(_with_empty_samples(s)), device=True)
audit("torch.median [all]", lambda s: unary()(s, torch.median), device=True)
audit("torch.median [feature dim]", lambda s: unary(-1)(s, torch.median), device=True)
audit("torch.quantile [1-d q]", lambda s: (lambda b, q: lambda: torch.quantile(b, q, 1))(
    s.batch(), s.dense(3).sigmoid()), device=True)
audit("torch.quantile [all]", lambda s: unary(0.5)(s, torch.quantile), device=True)
audit("torch.mode [ragged dim moved]",
      lambda s: (lambda b: lambda: torch.mode(b, 2))(s.batch().transpose(1, 2)), device=True)
audit("torch.aminmax [all]", lambda s: unary()(s, torch.aminmax), device=True)
audit("torch.softmax [empty samples]",
      lambda s: (lambda b: lambda: torch.softmax(b, dim=1))(_with_empty_samples(s)), device=True)
audit("F.one_hot [num_classes=-1]", lambda s: (lambda b: lambda: F.one_hot(b))(
    s.batch(dtype=torch.long).select(2, 0)), device=True)
audit("torch.isin [dense elements, batch test_elements]", lambda s: (
    lambda e, b: lambda: torch.isin(e, b))(s.dense(5, dtype=torch.long),
                                            s.batch(dtype=torch.long)), device=True)
audit("torch.searchsorted [per-row sequences]", lambda s: (
    lambda q: lambda: torch.searchsorted(q, s.like(q)))(s.batch().sort(-1).values), device=True)
audit("torch.histc [data range]", lambda s: unary(10)(s, torch.histc), device=True)
audit("torch.unique [return_inverse, ragged dim moved]", lambda s: (
    lambda b: lambda: torch.unique(b, return_inverse=True, return_counts=True))(
    s.batch(dtype=torch.long).transpose(1, 2)), device=True)
_OUTPUT_SIZE = ("torch's own read of the device for the size of its result (the largest value, "
                "or the number of unique values), as for a dense tensor: one sync")
EXCEPTIONS.update({name: _OUTPUT_SIZE for name in (
    "F.one_hot [num_classes=-1]", "torch.bincount", "Tensor.bincount", "torch.unique",
    "Tensor.unique", "torch.unique_consecutive", "Tensor.unique_consecutive",
    "torch.unique [return_inverse, ragged dim moved]")})


def _attention(fn: Callable, transpose: bool, partition_only: bool = False) -> Make:
    """Self-attention of ``(B, j, 2, 8)`` batches (float32, head dim 8: the varlen efficient
    kernel where the ragged dim is at dim -2), transposed to torch.nested's ``(B, H, j, E)``
    with ``transpose``; keys and values other tensors of the query's partition with
    ``partition_only``."""
    def make(s: Inputs) -> Callable[[], Any]:
        q = s.batch(2, 8).transpose(1, 2) if transpose else s.batch(2, 8)
        k, v = (s.like(q), s.like(q)) if partition_only else (q, q)
        return lambda: fn(q, k, v)
    return make


# Attention in each form: (B, H, j, E) over j (the varlen kernel; padded with device sizes);
# (B, j, H, E) over H (torch's attention on the packed values); sequence_attention.
audit("F.scaled_dot_product_attention [(B, H, j, E)]",
      _attention(F.scaled_dot_product_attention, True), device=True)
audit("F.scaled_dot_product_attention [(B, j, H, E) over H]",
      _attention(F.scaled_dot_product_attention, False, partition_only=True), device=True)
audit("nb.sequence_attention", _attention(nb.sequence_attention, False), device=True)
def _padded_pair(s: Inputs) -> tuple[NestedBatch, NestedBatch]:
    """A batch stored padded, and another of its partition."""
    b = NestedBatch.from_padded(s.padded_data(), s.lengths)
    return b, b.with_values(s.values())


for _name, _call in [("Tensor.add_", lambda b, o: b.add_(o)), ("Tensor.add", lambda b, o: b.add(o)),
                     ("Tensor.mul_", lambda b, o: b.mul_(2.0)),
                     ("Tensor.mul", lambda b, o: b.mul(2.0)),
                     ("Tensor.exp_", lambda b, o: b.exp_()), ("Tensor.exp", lambda b, o: b.exp())]:
    # (a batch stored padded: torch's in-place op on the padded data)
    audit(f"{_name} [padded batch]", (lambda c: lambda s: (
        lambda b, o: lambda: c(b, o))(*_padded_pair(s)))(_call))
audit("torch.select [feature dim]", lambda s: unary(2, 0)(s, torch.select), device=True)
audit("Tensor.__getitem__ [b[:, -2:]]",
      lambda s: (lambda b: lambda: b[:, -2:])(s.batch()), device=True)
audit("Tensor.__getitem__ [b[..., 0]]",
      lambda s: (lambda b: lambda: b[..., 0])(s.batch()), device=True)
audit("Tensor.__getitem__ [b[host indices]]",
      lambda s: (lambda b, i: lambda: b[i])(s.batch(), torch.tensor([0, s.B - 1])), device=True)
audit("Tensor.__getitem__ [b[device indices]]",
      lambda s: (lambda b, i: lambda: b[i])(s.batch(), torch.tensor([0, s.B - 1], device="cuda")),
      device=True)
audit("Tensor.__getitem__ [b[host samples, host positions]]",
      lambda s: (lambda b, i, j: lambda: b[i, j])(s.batch(), torch.tensor([0, s.B - 1]),
                                                   torch.tensor([0, -1])))
audit("Tensor.__getitem__ [b[device samples, device positions]]",
      lambda s: (lambda b, i, j: lambda: b[i, j])(
          s.batch(), torch.tensor([0, s.B - 1], device="cuda"),
          torch.tensor([0, -1], device="cuda")), device=True)
EXCEPTIONS["Tensor.__getitem__ [b[device samples, device positions]]"] = (
    "every (sample, position) pair is checked against its sample's size on the device: one "
    "read of the check's flag (the CUDA kernels would otherwise assert on the device)")
audit("Tensor.__getitem__ [b[i]]", lambda s: (lambda b: lambda: b[1])(s.batch()), device=True)
audit("Tensor.__getitem__ [b[1:3]]", lambda s: (lambda b: lambda: b[1:3])(s.batch()),
      device=True)


def _with_empty_samples(s: Inputs) -> NestedBatch:
    lengths = [0 if i % 3 == 1 else n for i, n in enumerate(s.lengths)]
    values = s.dense(sum(lengths), FEATURES)
    if s.device_sizes:
        return NestedBatch.from_lengths(values, torch.tensor(lengths, device="cuda"),
                                        validate=False)
    return NestedBatch.from_lengths(values, lengths)


# ============================================================================ nn modules
def _module(module: nn.Module) -> nn.Module:
    return module.requires_grad_(False)  # autograd aborts on fake CUDA tensors (CPU-only torch)


def _rnn(cls: type, **kwargs: Any) -> Make:
    def make(s: Inputs) -> Callable[[], Any]:
        module = _module(cls(FEATURES, 3, batch_first=True, device="cuda", **kwargs))
        b = s.batch()
        return lambda: module(b)

    return make


audit("nn.RNN(batch)", _rnn(nn.RNN), device=True)
audit("nn.RNN(nonlinearity='relu')(batch)", _rnn(nn.RNN, nonlinearity="relu"), device=True)
audit("nn.GRU(batch)", _rnn(nn.GRU), device=True)
audit("nn.LSTM(batch)", _rnn(nn.LSTM), device=True)


audit("nn.LSTM(batch) [empty samples]", lambda s: (lambda m, b: lambda: m(b))(
    _module(nn.LSTM(FEATURES, 3, batch_first=True, device="cuda")), _with_empty_samples(s)),
    device=True)


def _time_major_lstm(s: Inputs) -> Callable[[], Any]:
    module = nb.accept_nested_batches(_module(nn.LSTM(FEATURES, 3, device="cuda")))
    b = s.batch()
    return lambda: module(b)


audit("nb.accept_nested_batches(nn.LSTM)(batch)", _time_major_lstm, device=True)
audit("nn.Linear(batch)", lambda s: (lambda m, b: lambda: m(b))(
    _module(nn.Linear(FEATURES, 3, device="cuda")), s.batch()), device=True)
audit("nn.LayerNorm(batch)", lambda s: (lambda m, b: lambda: m(b))(
    _module(nn.LayerNorm(FEATURES, device="cuda")), s.batch()), device=True)
audit("nn.Embedding(batch)", lambda s: (lambda m, b: lambda: m(b))(
    _module(nn.Embedding(10, 3, device="cuda")), s.batch(dtype=torch.long).select(2, 0)),
    device=True)
audit("nn.EmbeddingBag(batch)", lambda s: (lambda m, b: lambda: m(b))(
    _module(nn.EmbeddingBag(10, 3, mode="mean", device="cuda")),
    s.batch(dtype=torch.long).select(2, 0)), device=True)


# ===================================================================== NestedBatch's own API
def _method(name: str, *args: Any, feature: tuple[int, ...] = (), **kwargs: Any) -> Make:
    def make(s: Inputs) -> Callable[[], Any]:
        b = s.batch(*feature)
        return lambda: getattr(b, name)(*args, **kwargs)

    return make


def _attribute(name: str) -> Make:
    def make(s: Inputs) -> Callable[[], Any]:
        b = s.batch()
        return lambda: getattr(b, name)

    return make


for _name in ("batch_size", "device", "dtype", "feature_shape", "is_cuda", "is_nested", "layout",
              "materialized_layouts", "max_shape", "ndim", "num_ragged_dims", "ragged_dim",
              "ragged_rank", "requires_grad", "grad", "sample_shape", "values", "flat_values",
              "lengths", "offsets", "row_ids", "mask", "shape_per_sample", "nested_row_splits",
              "partition", "shape", "is_leaf", "grad_fn"):
    audit(f"NestedBatch.{_name}", _attribute(_name), device=True)

for _name, _args, _kwargs in [
    ("packed", (), {}), ("padded", (), {}), ("tensor_list", (), {}), ("unbind", (), {}),
    ("tolist", (), {}), ("to_list", (), {}), ("to_tensor", (), {}), ("to_padded_tensor", (), {}),
    ("bounding_shape", (), {}), ("row_starts", (), {}), ("row_limits", (), {}),
    ("nested_row_lengths", (), {}), ("cpu", (), {}), ("detach", (), {}), ("clone", (), {}),
    ("contiguous", (), {}), ("requires_grad_", (False,), {}), ("is_pinned", (), {}),
    ("dim", (), {}), ("has_layout", (nb.Layout.PADDED,), {}),
    ("to", (torch.float64,), {}), ("to_ragged_batch", (), {}),
    ("map_values", (torch.exp,), {}), ("stored", (), {}), ("unflatten", (-1, (2, 2)), {}),
]:
    audit(f"NestedBatch.{_name}", _method(_name, *_args, **_kwargs), device=True)

audit("NestedBatch.size [dim 0]", _method("size", 0), device=True)
audit("NestedBatch.size [ragged dim]", _method("size", 1), device=True)
audit("NestedBatch.size", _method("size"), device=True)
audit("NestedBatch.with_stored", lambda s: (lambda b: lambda: b.with_stored(b.stored()))(
    s.batch()), device=True)
audit("NestedBatch.size [feature dim]", _method("size", 2), device=True)
audit("NestedBatch.padded [max_shape]", _method("padded", 0.0, (MAX_LEN,)), device=True)
audit("NestedBatch.padded [left]", _method("padded", padding_side="left"), device=True)
audit("NestedBatch.to_padded_tensor [output_size]",
      _method("to_padded_tensor", 0.0, (None, MAX_LEN, FEATURES)), device=True)
audit("NestedBatch.with_values", lambda s: (lambda b, v: lambda: b.with_values(v))(
    s.batch(), s.values()), device=True)
audit("NestedBatch.data", lambda s: (lambda b: lambda: b.data)(s.batch()), device=True)
audit("NestedBatch.mT", lambda s: (lambda b: lambda: b.mT)(s.batch(2, FEATURES // 2)),
      device=True)
audit("NestedBatch.adjoint", _method("adjoint"), device=True)
audit("NestedBatch.type", _method("type", torch.float64), device=True)
audit("NestedBatch.nbytes", _attribute("nbytes"))  # (numel's total: read once from a device)
for _name in ("is_cpu", "itemsize"):
    audit(f"NestedBatch.{_name}", _attribute(_name), device=True)
audit("NestedBatch.__len__", lambda s: (lambda b: lambda: len(b))(s.batch()), device=True)
audit("NestedBatch.__iter__", lambda s: (lambda b: lambda: list(b))(s.batch()), device=True)
audit("NestedBatch.__repr__", lambda s: (lambda b: lambda: repr(b))(s.batch()), device=True)


def _host_batch(s: Inputs) -> NestedBatch:
    return NestedBatch.from_lengths(torch.randn(s.total, FEATURES), s.lengths)


audit("NestedBatch.cuda", lambda s: (lambda b: lambda: b.cuda())(_host_batch(s)))
audit("NestedBatch.to [cuda]", lambda s: (lambda b: lambda: b.to("cuda"))(_host_batch(s)))
audit("NestedBatch.pin_memory", lambda s: (lambda b: lambda: b.pin_memory())(_host_batch(s)))

# constructors
audit("NestedBatch.from_lengths", lambda s: (lambda v: lambda: NestedBatch.from_lengths(
    v, s.lengths))(s.values()))
audit("NestedBatch.from_lengths [device sizes]",
      lambda s: (lambda v, n: lambda: NestedBatch.from_lengths(v, n))(
          s.values(), s.device_lengths()), host=False)
audit("NestedBatch.from_lengths [device sizes, validate=False]",
      lambda s: (lambda v, n: lambda: NestedBatch.from_lengths(v, n, validate=False))(
          s.values(), s.device_lengths()), host=False)
audit("NestedBatch.from_offsets", lambda s: (lambda v: lambda: NestedBatch.from_offsets(
    v, s.offsets))(s.values()))
audit("NestedBatch.from_offsets [device sizes]",
      lambda s: (lambda v, o: lambda: NestedBatch.from_offsets(v, o))(
          s.values(), s.device_offsets()), host=False)
audit("NestedBatch.from_offsets [device sizes, validate=False]",
      lambda s: (lambda v, o: lambda: NestedBatch.from_offsets(v, o, validate=False))(
          s.values(), s.device_offsets()), host=False)


def _row_ids(s: Inputs) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(s.B), torch.tensor(s.lengths))


audit("NestedBatch.from_row_ids [host ids]",
      lambda s: (lambda v, r: lambda: NestedBatch.from_row_ids(v, r, s.B))(s.values(), _row_ids(s)))
audit("NestedBatch.from_row_ids [device sizes]",
      lambda s: (lambda v, r: lambda: NestedBatch.from_row_ids(v, r, s.B))(
          s.values(), _row_ids(s).cuda()), host=False)
audit("NestedBatch.from_row_ids [device sizes, validate=False]",
      lambda s: (lambda v, r: lambda: NestedBatch.from_row_ids(v, r, s.B, validate=False))(
          s.values(), _row_ids(s).cuda()), host=False)
audit("NestedBatch.from_row_starts", lambda s: (lambda v: lambda: NestedBatch.from_row_starts(
    v, s.offsets[:-1]))(s.values()))
audit("NestedBatch.from_row_starts [device sizes]",
      lambda s: (lambda v, r: lambda: NestedBatch.from_row_starts(v, r))(
          s.values(), s.device_offsets()[:-1]), host=False)
audit("NestedBatch.from_row_limits", lambda s: (lambda v: lambda: NestedBatch.from_row_limits(
    v, s.offsets[1:]))(s.values()))
audit("NestedBatch.from_row_limits [device sizes]",
      lambda s: (lambda v, r: lambda: NestedBatch.from_row_limits(v, r))(
          s.values(), s.device_offsets()[1:]), host=False)


def _shapes(s: Inputs) -> torch.Tensor:
    return torch.tensor([[n] for n in s.lengths])


audit("NestedBatch.from_shapes [host shapes]", lambda s: (lambda v, p: lambda: (
    NestedBatch.from_shapes(v, p)))(s.values(), _shapes(s)))
audit("NestedBatch.from_shapes [device sizes]", lambda s: (lambda v, p: lambda: (
    NestedBatch.from_shapes(v, p)))(s.values(), _shapes(s).cuda()), host=False)
audit("NestedBatch.from_padded", lambda s: (lambda d: lambda: NestedBatch.from_padded(
    d, s.lengths))(s.padded_data()))
audit("NestedBatch.from_padded [device sizes]", lambda s: (lambda d, n: lambda: (
    NestedBatch.from_padded(d, n)))(s.padded_data(), s.device_lengths()), host=False)
audit("NestedBatch.from_padded [mask]", lambda s: (lambda d, m: lambda: (
    NestedBatch.from_padded(d, mask=m)))(
        s.padded_data(), torch.arange(MAX_LEN, device="cuda") < s.device_lengths()[:, None]),
    host=False)
audit("NestedBatch.from_tensor", lambda s: (lambda d: lambda: NestedBatch.from_tensor(
    d, s.lengths))(s.padded_data()))
audit("NestedBatch.from_tensor [padding]", lambda s: (lambda d: lambda: NestedBatch.from_tensor(
    d, padding=0.0))(s.padded_data()), host=False)
audit("NestedBatch.from_list", lambda s: (lambda x: lambda: NestedBatch.from_list(x))(
    s.samples()))
audit("NestedBatch.from_nested_row_splits", lambda s: (lambda v: lambda: (
    NestedBatch.from_nested_row_splits(v, [s.offsets])))(s.values()))
audit("NestedBatch.from_nested_row_splits [device sizes]", lambda s: (lambda v, o: lambda: (
    NestedBatch.from_nested_row_splits(v, [o])))(s.values(), s.device_offsets()), host=False)
audit("NestedBatch.from_nested_row_lengths", lambda s: (lambda v: lambda: (
    NestedBatch.from_nested_row_lengths(v, [s.lengths])))(s.values()))
audit("NestedBatch.from_nested_row_lengths [host tensor lengths]", lambda s: (lambda v, n: lambda: (
    NestedBatch.from_nested_row_lengths(v, [n])))(s.values(), torch.tensor(s.lengths)))
audit("NestedBatch.from_nested_row_lengths [device sizes]", lambda s: (lambda v, n: lambda: (
    NestedBatch.from_nested_row_lengths(v, [n])))(s.values(), s.device_lengths()), host=False)
audit("NestedBatch.from_ragged_batch", lambda s: (lambda r: lambda: (
    NestedBatch.from_ragged_batch(r)))(s.ragged(FEATURES)), host=False)
audit("NestedBatch.trusted", lambda s: (lambda p: lambda: NestedBatch.trusted(p))(
    s.batch().packed()), device=True)
audit("NestedBatch [constructor]", lambda s: (lambda p: lambda: NestedBatch(p))(
    s.batch().packed()), device=True)


# ============================================================== nestbatch functions
audit("nb.Packed", lambda s: (lambda v, o: lambda: nb.Packed(v, o))(
    s.values(), s.device_offsets()), host=False)
audit("nb.Padded", lambda s: (lambda d, n: lambda: nb.Padded(d, n))(
    s.padded_data(), s.device_lengths()), host=False)
audit("nb.TensorList", lambda s: (lambda x: lambda: nb.TensorList(x))(s.samples()))
audit("nb.RowPartition", lambda s: lambda: nb.RowPartition.from_host_lengths(
    s.lengths, torch.device("cuda")).offsets)
audit("nb.nested", lambda s: (lambda x: lambda: nb.nested(x))(s.samples()))
audit("nb.as_nested", lambda s: (lambda x: lambda: nb.as_nested(x))(s.samples()))
audit("nb.pack", lambda s: (lambda x: lambda: nb.pack(x))(s.samples()))
audit("torch_nested.nested_tensor", lambda s: (lambda x: lambda: tn.nested_tensor(x))(
    s.samples()))
audit("torch_nested.as_nested_tensor", lambda s: (lambda x: lambda: tn.as_nested_tensor(x))(
    s.samples()))
audit("torch_nested.as_nested_tensor [dense]", lambda s: (
    lambda x: lambda: tn.as_nested_tensor(x))(s.dense(s.B, 3, FEATURES)))
audit("torch_nested.nested_tensor_from_jagged", lambda s: (
    lambda v, o: lambda: tn.nested_tensor_from_jagged(v, o))(s.values(), s.device_offsets()),
    host=False)
audit("torch_nested.narrow", lambda s: (lambda x, n: lambda: tn.narrow(x, 1, 0, n))(
    s.dense(s.B, MAX_LEN, FEATURES), s.device_lengths()), host=False)
audit("torch_nested.masked_select", lambda s: (lambda x, m: lambda: tn.masked_select(x, m))(
    s.dense(s.B, MAX_LEN), s.dense(s.B, MAX_LEN) > 0), host=False)
audit("torch_nested.to_padded_tensor", lambda s: (lambda b: lambda: tn.to_padded_tensor(b, 0.0))(
    s.batch()))
audit("nb.collate", lambda s: (lambda x: lambda: nb.collate(x, ragged=(0,)))(
    [(t, t.sum()) for t in s.samples()]))
audit("nb.to_packed_sequence", lambda s: (lambda b: lambda: nb.to_packed_sequence(b))(
    s.batch()), device=True)
audit("nb.to_nested_tensor", lambda s: (lambda b: lambda: nb.to_nested_tensor(b))(s.batch()),
      device=True)


def _packed_sequence(s: Inputs, device_indices: bool) -> Any:
    host = NestedBatch.from_lengths(torch.randn(s.total, FEATURES), s.lengths)
    sequence = nb.to_packed_sequence(host)
    indices = [sequence.sorted_indices, sequence.unsorted_indices]
    if device_indices:
        indices = [i.cuda() for i in indices]
    return torch.nn.utils.rnn.PackedSequence(sequence.data.cuda(), sequence.batch_sizes, *indices)


audit("nb.from_packed_sequence", lambda s: (lambda q: lambda: nb.from_packed_sequence(q))(
    _packed_sequence(s, True)))
audit("nb.from_packed_sequence [host indices]",
      lambda s: (lambda q: lambda: nb.from_packed_sequence(q))(_packed_sequence(s, False)))
audit("nb.from_nested_tensor", lambda s: (lambda t: lambda: nb.from_nested_tensor(t))(
    torch.nested.nested_tensor_from_jagged(s.values(), s.device_offsets())), host=False)


def _payload_batches(s: Inputs) -> tuple[NestedBatch, NestedBatch]:
    into = s.batch()
    # every sample indexes its own rows: index i of sample k is i % length_k
    counts = [2] * s.B
    local = [i % n for n in s.lengths for i in range(2)]
    values = torch.tensor(local, device="cuda")
    if s.device_sizes:
        offsets = torch.tensor(_offsets(counts), device="cuda")
        return NestedBatch.from_offsets(values, offsets, validate=False), into
    return NestedBatch.from_lengths(values, counts), into


audit("nb.packed_indices", lambda s: (lambda i, t: lambda: nb.packed_indices(i, t))(
    *_payload_batches(s)), device=True)
audit("nb.packed_indices [validate=False]", lambda s: (
    lambda i, t: lambda: nb.packed_indices(i, t, validate=False))(*_payload_batches(s)),
    device=True)


def _local_indices(s: Inputs, validate: bool = True) -> Callable[[], Any]:
    indices, into = _payload_batches(s)
    packed = nb.packed_indices(indices, into, validate=False)
    return lambda: nb.local_indices(packed, indices, into, validate=validate)


audit("nb.local_indices", _local_indices, device=True)
audit("nb.local_indices [validate=False]", lambda s: _local_indices(s, False), device=True)


# ==================================================== RaggedBatch and batching helpers
# RaggedBatch keeps its sample sizes on the device: entries check only that the counts do not
# depend on the batch size.
def _rb(name: str, *args: Any, **kwargs: Any) -> Make:
    def make(s: Inputs) -> Callable[[], Any]:
        r = s.ragged(FEATURES)
        return lambda: getattr(r, name)(*args, **kwargs)

    return make


def _rb_attr(name: str) -> Make:
    def make(s: Inputs) -> Callable[[], Any]:
        r = s.ragged(FEATURES)
        return lambda: getattr(r, name)

    return make


for _name in ("batch_shape", "device", "dtype", "mask", "max_sample_size", "non_uniform_dim",
              "num_batch_dims", "requires_grad", "retains_grad", "sample_sizes", "shape",
              "tensor", "total_num_entries", "total_num_samples_in_batch"):
    audit(f"RaggedBatch.{_name}", _rb_attr(_name), host=False)

for _name, _args in [
    ("as_self_with_cloned_data", ()), ("bfloat16", ()), ("bool", ()), ("cdouble", ()),
    ("cfloat", ()), ("cpu", ()), ("detach", ()), ("dim", ()), ("double", ()),
    ("flatten_batch_dims", ()), ("float", ()), ("get_existence_weights", ()),
    ("get_non_uniform_dimension_transposed_to", (2,)), ("half", ()), ("int", ()),
    ("long", ()), ("repeat_samples", (2,)), ("reshape_batch_dims", ((2, -1),)),
    ("size", ()), ("split", ()), ("to", (torch.float64,)), ("to_device", ("cuda",)),
    ("to_dtype", (torch.float64,)), ("to_nested_batch", ()), ("unsqueeze_batch_dim", (0,)),
    ("unsqueeze_data_dim", (2,)), ("with_padded_set_to", (0.0,)), ("set_padded_to", (0.0,)),
    ("apply", (torch.exp,)),
]:
    audit(f"RaggedBatch.{_name}", _rb(_name, *_args), host=False)

audit("RaggedBatch.squeeze_batch_dim", lambda s: (lambda r: lambda: r.squeeze_batch_dim(0))(
    s.ragged(FEATURES).unsqueeze_batch_dim(0)), host=False)
audit("RaggedBatch.set_tensor", lambda s: (lambda r, t: lambda: r.set_tensor(t))(
    s.ragged(FEATURES), s.dense(s.B, MAX_LEN, FEATURES)), host=False)
audit("RaggedBatch.create_with_sample_sizes_like_self", lambda s: (
    lambda r, t: lambda: r.create_with_sample_sizes_like_self(t))(
        s.ragged(FEATURES), s.dense(s.B, MAX_LEN, 2)), host=False)
audit("RaggedBatch.broadcast_batch_dims", lambda s: (
    lambda r: lambda: RaggedBatch.broadcast_batch_dims([r, r]))(s.ragged(FEATURES)), host=False)
audit("RaggedBatch.broadcast_batch_dims_to_shape", lambda s: (
    lambda r: lambda: r.broadcast_batch_dims_to_shape((2, s.B)))(s.ragged(FEATURES)), host=False)
audit("RaggedBatch.from_nested_batch", lambda s: (
    lambda b: lambda: RaggedBatch.from_nested_batch(b))(s.batch()), device=True)
audit("RaggedBatch [constructor]", lambda s: (
    lambda t, n: lambda: RaggedBatch(t, sample_sizes=n))(
        s.dense(s.B, MAX_LEN, FEATURES), s.device_lengths()), host=False)
audit("RaggedBatch [constructor, mask]", lambda s: (
    lambda t, m: lambda: RaggedBatch(t, mask=m))(
        s.dense(s.B, MAX_LEN, FEATURES),
        torch.arange(MAX_LEN, device="cuda") < s.device_lengths()[:, None]), host=False)
audit("RaggedBatch.FromOversizeTensor", lambda s: (
    lambda t, n: lambda: RaggedBatch.FromOversizeTensor(t, sample_sizes=n))(
        s.dense(s.B, MAX_LEN, FEATURES), s.device_lengths()), host=False)
audit("RaggedBatch.FromFullTensor", lambda s: (
    lambda t: lambda: RaggedBatch.FromFullTensor(t))(s.dense(s.B, MAX_LEN, FEATURES)),
    host=False)
audit("RaggedBatch.Empty", lambda s: lambda: RaggedBatch.Empty(3, 1, "cuda", batch_shape=s.B),
      host=False)


_NUM_ENTRIES = 16


def _index_args(s: Inputs) -> tuple:
    data = s.dense(s.B, _NUM_ENTRIES, FEATURES)
    return data, s.index_batch(8, _NUM_ENTRIES)


for _check in (True, False):
    _suffix = "" if _check else " [check_bounds=False]"
    audit(f"nb.batched_indexing_access{_suffix}", (lambda c: lambda s: (
        lambda d, i: lambda: nb.batched_indexing_access(d, i, check_bounds=c))(
            *_index_args(s)))(_check), host=False)
    audit(f"nb.batched_indexing_write{_suffix}", (lambda c: lambda s: (
        lambda d, i, w: lambda: nb.batched_indexing_write(w, i, d, check_bounds=c))(
            *_index_args(s), s.dense(s.B, 8, FEATURES)))(_check), host=False)
    audit(f"nb.batched_inverse_indexing_access{_suffix}", (lambda c: lambda s: (
        lambda d, i, w: lambda: nb.batched_inverse_indexing_access(
            w, i, _NUM_ENTRIES, check_bounds=c))(
            *_index_args(s), s.dense(s.B, 8, FEATURES)))(_check), host=False)
    audit(f"nb.batched_index_mapping{_suffix}", (lambda c: lambda s: (
        lambda d, i: lambda: nb.batched_index_mapping(
            d, i, RaggedBatch(torch.zeros_like(i.tensor), sample_sizes=i.sample_sizes),
            s.dense(s.B, _NUM_ENTRIES, FEATURES), check_bounds=c))(*_index_args(s)))(_check),
        host=False)
    audit(f"nb.get_mask_from_indices{_suffix}", (lambda c: lambda s: (
        lambda d, i: lambda: nb.get_mask_from_indices(_NUM_ENTRIES, i, check_bounds=c))(
            *_index_args(s)))(_check), host=False)


def _mask(s: Inputs) -> torch.Tensor:
    return s.dense(s.B, _NUM_ENTRIES, dtype=torch.bool)


audit("nb.batched_bool_indexing", lambda s: (lambda d, m: lambda: nb.batched_bool_indexing(
    d, m))(s.dense(s.B, _NUM_ENTRIES, FEATURES), _mask(s)), host=False)
def _bool_write(s: Inputs) -> Callable[[], Any]:
    mask = _mask(s)
    data = s.dense(s.B, _NUM_ENTRIES, FEATURES)
    to_write = nb.batched_bool_indexing(data, mask)
    into = s.dense(s.B, _NUM_ENTRIES, FEATURES)
    return lambda: nb.batched_bool_indexing_write(to_write, mask, into)


audit("nb.batched_bool_indexing_write", _bool_write, host=False)


audit("nb.get_indices_from_mask", lambda s: (lambda m: lambda: nb.get_indices_from_mask(m))(
    _mask(s)), host=False)
audit("nb.apply_mask_to_tensor", lambda s: (lambda d, m: lambda: nb.apply_mask_to_tensor(d, m))(
    s.dense(s.B, _NUM_ENTRIES, FEATURES), _mask(s)), host=False)
audit("nb.average_over_targets", lambda s: (lambda r: lambda: nb.average_over_targets(r))(
    s.ragged(FEATURES)), host=False)
audit("nb.sum_over_targets", lambda s: (lambda r: lambda: nb.sum_over_targets(r))(
    s.ragged(FEATURES)), host=False)
audit("nb.squeeze_except_batch_and_sample", lambda s: (
    lambda r: lambda: nb.squeeze_except_batch_and_sample(r))(s.ragged(FEATURES, 1)), host=False)
audit("nb.combine_data", lambda s: (lambda x: lambda: nb.combine_data(x))(s.samples()))
audit("nb.get_compact_lists", lambda s: (lambda m, d: lambda: nb.get_compact_lists(m, [d, 3]))(
    _mask(s), s.dense(s.B, _NUM_ENTRIES, FEATURES)), host=False)


class _Pair(NamedTuple):
    boxes: torch.Tensor
    scores: torch.Tensor


audit("nb.get_compact_from_named_tuple", lambda s: (
    lambda m, d: lambda: nb.get_compact_from_named_tuple(m, d))(
        _mask(s), _Pair(s.dense(s.B, _NUM_ENTRIES, FEATURES), s.dense(s.B, _NUM_ENTRIES))),
    host=False)


# ================================================================= nestbatch.convert.*
def _kaolin_args(s: Inputs) -> tuple:
    packed = s.values()
    shape_per_tensor = torch.tensor([[n] for n in s.lengths])  # on the CPU, as kaolin
    first_idx = torch.tensor(s.offsets, device="cuda")
    return packed, shape_per_tensor, first_idx


audit("kaolin.get_shape_per_tensor", lambda s: (lambda x: lambda: kaolin.get_shape_per_tensor(
    x))(s.samples()))
audit("kaolin.fill_max_shape", lambda s: (lambda p: lambda: kaolin.fill_max_shape(p))(
    _kaolin_args(s)[1]))
audit("kaolin.get_first_idx", lambda s: (lambda n: lambda: kaolin.get_first_idx(n))(
    torch.tensor(s.lengths, device="cuda")), host=False)
audit("kaolin.list_to_packed", lambda s: (lambda x: lambda: kaolin.list_to_packed(x))(
    s.samples()))
audit("kaolin.list_to_padded", lambda s: (lambda x: lambda: kaolin.list_to_padded(x, 0.0))(
    s.samples()))
audit("kaolin.packed_to_list", lambda s: (lambda a: lambda: kaolin.packed_to_list(*a))(
    _kaolin_args(s)))
audit("kaolin.packed_to_padded", lambda s: (lambda a: lambda: kaolin.packed_to_padded(*a, 0.0))(
    _kaolin_args(s)))
audit("kaolin.padded_to_list", lambda s: (lambda d, p: lambda: kaolin.padded_to_list(d, p))(
    s.padded_data(), _kaolin_args(s)[1]))
audit("kaolin.padded_to_packed", lambda s: (lambda d, p: lambda: kaolin.padded_to_packed(d, p))(
    s.padded_data(), _kaolin_args(s)[1]))
audit("kaolin.tile_to_packed", lambda s: (lambda v, n: lambda: kaolin.tile_to_packed(v, n))(
    s.dense(s.B, FEATURES), torch.tensor(s.lengths)))
audit("kaolin.tile_to_packed [device sizes]", lambda s: (
    lambda v, n: lambda: kaolin.tile_to_packed(v, n))(
        s.dense(s.B, FEATURES), torch.tensor(s.lengths, device="cuda")), host=False)

audit("pytorch3d.list_to_packed", lambda s: (lambda x: lambda: pytorch3d.list_to_packed(x))(
    s.samples()))
audit("pytorch3d.list_to_padded", lambda s: (lambda x: lambda: pytorch3d.list_to_padded(x))(
    s.samples()))
audit("pytorch3d.packed_to_list", lambda s: (lambda v: lambda: pytorch3d.packed_to_list(
    v, s.lengths))(s.values()))
audit("pytorch3d.padded_to_list", lambda s: (lambda d: lambda: pytorch3d.padded_to_list(
    d, s.lengths))(s.padded_data()))
audit("pytorch3d.padded_to_packed", lambda s: (lambda d: lambda: pytorch3d.padded_to_packed(
    d, s.lengths))(s.padded_data()))
audit("pytorch3d.padded_to_packed [pad_value]", lambda s: (
    lambda d: lambda: pytorch3d.padded_to_packed(d, pad_value=0.0))(s.padded_data()), host=False)

audit("tensorflow.offsets_from_row_starts", lambda s: (
    lambda: tensorflow.offsets_from_row_starts(s.offsets[:-1], s.total)))
audit("tensorflow.offsets_from_row_starts [device sizes]", lambda s: (
    lambda r: lambda: tensorflow.offsets_from_row_starts(r, s.total))(
        s.device_offsets()[:-1]), host=False)
audit("tensorflow.offsets_from_row_limits", lambda s: (
    lambda: tensorflow.offsets_from_row_limits(s.offsets[1:])))
audit("tensorflow.offsets_from_row_limits [device sizes]", lambda s: (
    lambda r: lambda: tensorflow.offsets_from_row_limits(r))(s.device_offsets()[1:]), host=False)
audit("tensorflow.lengths_without_trailing_padding", lambda s: (
    lambda d: lambda: tensorflow.lengths_without_trailing_padding(d, 0.0))(s.padded_data()),
    host=False)

for _name in ("to_packed", "to_padded", "to_list", "padded_to_packed", "padded_to_list"):
    audit(f"convert.{_name}", (lambda n: lambda s: (
        lambda p: lambda: getattr(convert, n)(p))(s.batch().padded()))(_name), device=True)
for _name in ("packed_to_padded", "packed_to_list"):
    audit(f"convert.{_name}", (lambda n: lambda s: (
        lambda p: lambda: getattr(convert, n)(p))(s.batch().packed()))(_name), device=True)
for _name in ("list_to_packed", "list_to_padded"):
    audit(f"convert.{_name}", (lambda n: lambda s: (
        lambda p: lambda: getattr(convert, n)(p))(s.batch().tensor_list()))(_name), device=True)
audit("convert.refill_padding", lambda s: (lambda p: lambda: convert.refill_padding(p, 1.0))(
    s.batch().padded()), device=True)


# ===================================================================== the audit itself
# ragged rank 2: B samples of host_lengths(B) rows, row j of 1 + j % 3 values
def _nested(s: Inputs) -> NestedBatch:
    inner = [1 + j % 3 for j in range(s.total)]
    lengths = [s.lengths, inner]
    if s.device_sizes:
        lengths = [torch.tensor(n, device="cuda") for n in lengths]
    return NestedBatch.from_nested_row_lengths(s.dense(sum(inner), FEATURES), lengths)


NESTED_CALLS: dict[str, Callable[[NestedBatch], Any]] = {
    "padded": lambda b: b.padded(), "packed": lambda b: b.packed(), "mask": lambda b: b.mask,
    "values": lambda b: b.values, "flat_values": lambda b: b.flat_values,
    "to_padded_tensor": lambda b: b.to_padded_tensor(0.0), "unbind": lambda b: b.unbind(),
    "tolist": lambda b: b.tolist(), "b + b": lambda b: b + b, "b * 2": lambda b: b * 2,
    "torch.exp": torch.exp, "b.add_(1)": lambda b: b.add_(1),
    "sum [outer level]": lambda b: b.sum(1), "sum [inner level]": lambda b: b.sum(2),
    "sum [both levels]": lambda b: b.sum((1, 2)), "amax [inner level]": lambda b: b.amax(2),
    "mean [outer level]": lambda b: b.mean(1), "sum [feature]": lambda b: b.sum(-1),
    "b[0]": lambda b: b[0], "b[:, :2]": lambda b: b[:, :2], "b[:, 1:]": lambda b: b[:, 1:],
    "b[[0, 2]]": lambda b: b[[0, 2]], "torch.cat": lambda b: torch.cat([b, b]),
    "nested_row_lengths": lambda b: b.nested_row_lengths(),
}
PER_SAMPLE.add("nested: unbind")
EXCEPTIONS["nested: tolist"] = _PYTHON_DATA
for _name, _call in NESTED_CALLS.items():
    audit(f"nested: {_name}", lambda s, f=_call: (lambda b: lambda: f(b))(_nested(s)),
          device=True)


def run(name: str, batch_size: int) -> Trace:
    torch.manual_seed(0)  # (random masks and indices: the same at every run)
    with fake_cuda():
        inputs = Inputs(batch_size, False)
        call = CALLS[name].make(inputs)
        return trace(call, allow_syncs=True)[1]


def problems(name: str, small: Trace, large: Trace) -> list[str]:
    """What breaks the audit's rules (see the module docstring)."""
    found = []
    b_small, b_large = CALLS[name].sizes
    allowed = 1 if name in EXCEPTIONS else 0
    if CALLS[name].host_sizes and len(large.syncs) > allowed:
        found.append(f"{len(large.syncs)} syncs with host sizes ({allowed} allowed): "
                     f"{large.syncs} at {large.sync_sites}")
    if len(small.ops) != len(large.ops):
        found.append(f"ops depend on B: {len(small.ops)} at B={b_small}, {len(large.ops)} at "
                     f"B={b_large} ({len(large.host_to_device)} host->device copies at "
                     f"{large.copy_sites[:6]})")
    if len(small.syncs) != len(large.syncs):
        found.append(f"syncs depend on B: {len(small.syncs)} at B={b_small}, "
                     f"{len(large.syncs)} at B={b_large}, at {large.sync_sites[:6]}")
    base = _out_of_place_name(name)
    if base in CALLS:
        out_of_place = run(base, SIZES[0])
        if (len(small.ops) > len(out_of_place.ops)
                or len(small.syncs) > len(out_of_place.syncs)):
            found.append(f"in place {len(small.ops)} ops {small.ops} and {len(small.syncs)} "
                         f"syncs, out of place {len(out_of_place.ops)} {out_of_place.ops} and "
                         f"{len(out_of_place.syncs)}")
    return found


@pytest.mark.parametrize("name", sorted(CALLS))
def test_gpu_path_audit(name):
    try:
        small, large = (run(name, size) for size in CALLS[name].sizes)
    except Exception as error:
        if name in KNOWN_PROBLEMS:
            pytest.xfail(f"{KNOWN_PROBLEMS[name]} ({type(error).__name__}: {error})")
        raise
    found = problems(name, small, large)
    if name in KNOWN_PROBLEMS:
        if found:
            pytest.xfail(f"{KNOWN_PROBLEMS[name]}: {found}")
        pytest.fail(f"{name} passes the audit now: remove it from KNOWN_PROBLEMS")
    if name in EXCEPTIONS and not large.syncs:
        pytest.fail(f"{name} no longer syncs: remove it from EXCEPTIONS")
    assert not found, f"{name}: {found}"


# =========================================================================== meta-tests
def _audited_prefixes() -> set[str]:
    """Entry names without their ``[variant]`` suffix."""
    return {name.split(" [")[0].split("(")[0] for name in CALLS}


def test_every_registered_function_is_audited():
    missing = []
    for func in registry.registered_functions():
        name = qualified_name(func)
        if name in AUDITED_BY:
            assert AUDITED_BY[name] in CALLS, name
        elif name not in CALLS and name not in NOT_AUDITED:
            missing.append(name)
    assert not missing, f"registered functions with no audit entry (add a recipe): {missing}"


def _public(names: Any) -> list[str]:
    return [n for n in names if not n.startswith("_")]


def test_every_public_name_is_audited():
    audited = _audited_prefixes()
    sources = {name: qualified_name(func) for name, func in registry._METHOD_SOURCES.items()}
    wanted = []
    for name in _public(dir(NestedBatch)):
        if name in sources:  # a method the registry made: its function is audited
            if sources[name] not in CALLS and sources[name] not in NOT_AUDITED:
                wanted.append(f"NestedBatch.{name} (from {sources[name]})")
            continue
        wanted.append(f"NestedBatch.{name}")
    wanted += [f"RaggedBatch.{name}" for name in _public(dir(RaggedBatch))]
    wanted += [f"nb.{name}" for name in nb.__all__ if name not in ("NestedBatch", "RaggedBatch")]
    wanted += [f"nb.{name}" for name in helpers.__all__ if name != "RaggedBatch"]
    wanted += [f"convert.{name}" for name in convert.__all__]
    for module, prefix in ((kaolin, "kaolin"), (pytorch3d, "pytorch3d"),
                           (tensorflow, "tensorflow")):
        names = getattr(module, "__all__", None) or [
            n for n, v in vars(module).items()
            if isinstance(v, types.FunctionType) and v.__module__ == module.__name__
        ]
        # (TF's names attached to the batch are audited as NestedBatch.<name>.)
        attached = getattr(module, "METHODS", {})
        wanted += [f"{prefix}.{name}" for name in _public(names) if name not in attached]
    missing = sorted({w for w in wanted if w not in audited and w not in NOT_AUDITED})
    assert not missing, f"public API with no audit entry: {missing}"


def test_listed_names_exist():
    stale = [n for n in (*EXCEPTIONS, *KNOWN_PROBLEMS) if n not in CALLS]
    assert not stale, f"EXCEPTIONS / KNOWN_PROBLEMS name no audited call: {stale}"
    for table in (EXCEPTIONS, KNOWN_PROBLEMS, NOT_AUDITED):
        assert all(isinstance(why, str) and len(why) > 20 for why in table.values())

