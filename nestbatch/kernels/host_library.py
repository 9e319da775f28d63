"""The C conversions and row gathers / scatters of ``csrc/host_kernels.c``, compiled on first
use into a Python extension module (``csrc/host_module.c``).

The kernels are plain C over bytes (no torch headers), so the system's C compiler builds the
module in a fraction of a second, for every torch release, from the Python headers of the
running interpreter. It is built once per machine and interpreter into ``$NESTBATCH_CACHE_DIR``
(default ``~/.cache/nestbatch``) under a name that carries a hash of the sources and of the
compiler command, and reused by every later process. Where it cannot be built (no compiler, no
``Python.h``, no private writable cache directory, Windows) or
``NESTBATCH_DISABLE_HOST_KERNELS=1`` is set, :func:`library` returns ``None`` and the
conversions run on their PyTorch implementation; :func:`status` says which and why.

The functions here take host tensors and return ``None`` where the C path does not apply (no
library, tensors not contiguous or with a lazy conjugation or negation pending, a filler the
dtype does not hold, offsets outside the C function's contract): the caller then runs the
PyTorch implementation. Each decides that itself, inline, in the one frame it adds to a host
conversion. Rows are bytes to the C functions, so every dtype takes this path. Callers run it
only where autograd records nothing (the operators' CPU implementations). The module releases
the GIL while a kernel runs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor
from torch.types import Number

from nestbatch.kernels.build_config import HOST_MODULE_SOURCE, HOST_SOURCE, csrc_dir
from nestbatch.kernels.host_memory import MIN_HUGE_PAGES, empty_for_write

__all__ = [
    "fill_padding", "gather_rows", "held_exactly", "host_sizes", "library", "packed_to_padded",
    "padded_to_packed", "scatter_rows", "status",
]

_FLAGS = ("-O3", "-std=gnu11", "-shared", "-fPIC")
_MODULE_NAME = "nestbatch_host"  # (its PyInit_ function's name)
#: The width the C functions take for each index dtype (their int64 / int32 variants).
_INDEX_BYTES = {torch.int64: 8, torch.int32: 4}
_status = "not loaded yet"


def status() -> str:
    """How the conversions run on the CPU: the C module's path, or why they use PyTorch."""
    library()
    return _status


@functools.cache
def library() -> ModuleType | None:
    """The compiled module, or ``None`` where it is missing."""
    global _status
    if os.environ.get("NESTBATCH_DISABLE_HOST_KERNELS") == "1":
        _status = "PyTorch: NESTBATCH_DISABLE_HOST_KERNELS=1"
        return None
    try:
        path = _built_library()
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, ImportError, subprocess.SubprocessError, RuntimeError) as error:
        _status = f"PyTorch: the C conversions could not be built ({error})"
        return None
    _status = f"C module {path}"
    return module


def _built_library() -> Path:
    """The compiled module: from the cache, else compiled now (raises where it cannot be)."""
    sources = csrc_dir() / HOST_MODULE_SOURCE, csrc_dir() / HOST_SOURCE
    for source in sources:
        if not source.is_file():
            raise RuntimeError(f"{source} is missing")
    if sys.platform == "win32":
        raise RuntimeError("not built on Windows")
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C compiler {compiler!r} on PATH")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise RuntimeError(f"no Python.h in {include} (the interpreter's development headers)")
    command = (compiler, *_FLAGS, f"-I{include}", f"-I{sources[0].parent}")
    text = b"".join(source.read_bytes() for source in sources)
    digest = hashlib.sha256(text + repr(command).encode()).hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    for directory in _cache_dirs():
        target = directory / f"host_kernels_{digest}{suffix}"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _private(directory):
                continue
            return target if target.is_file() else _compile(command, sources[0], target)
        except OSError:
            continue  # not writable: the next candidate
    raise RuntimeError("no private, writable cache directory")


def _cache_dirs() -> list[Path]:
    chosen = os.environ.get("NESTBATCH_CACHE_DIR")
    if chosen:
        return [Path(chosen)]
    # The temporary directory is shared: a directory of this user's own, checked by _private.
    user = os.getuid() if hasattr(os, "getuid") else "user"
    return [Path.home() / ".cache" / "nestbatch",
            Path(tempfile.gettempdir()) / f"nestbatch-{user}"]


def _private(directory: Path) -> bool:
    """Whether only this user can write ``directory``: a module is loaded from it, so another
    user able to place a file there could run code in this process."""
    if not hasattr(os, "getuid"):
        return True
    info = directory.stat()
    return info.st_uid == os.getuid() and not info.st_mode & 0o022


def _compile(command: tuple[str, ...], source: Path, target: Path) -> Path:
    # Into a private name, then renamed: processes building at once never load a partial file.
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([*command, "-o", partial, str(source)], check=True, capture_output=True,
                       timeout=120)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def held_exactly(filler: Number, dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds ``filler`` as given: any real number for a floating dtype (as
    torch rounds it), an integer in range otherwise. Elsewhere the PyTorch implementations run,
    which raise torch's error for a filler out of range or define the conversion."""
    if dtype.is_floating_point:
        return type(filler) is float or float(filler) == filler
    if dtype.is_complex:
        return True  # (fillers are real numbers)
    if isinstance(filler, float) and not filler.is_integer():
        return False
    low, high = (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
    return low <= filler <= high


def _pattern(like: Tensor, filler: Number) -> Tensor | None:
    """One row (``like.shape[2:]``) of ``filler`` in ``like``'s dtype, or ``None`` where the
    filler is all-zero bytes (a memset)."""
    if filler == 0 and type(filler) is not complex and math.copysign(1.0, filler) > 0:
        return None  # (-0.0 is not all-zero bytes; a complex zero's parts may be -0.0)
    return like.new_full(like.shape[2:], filler)


#: Outputs from this size may be advised as huge pages (:func:`empty_for_write` decides, for
#: the system's huge page size, 2 MiB or more); smaller ones are a plain ``new_empty``.
_HUGE_PAGE_CANDIDATE_BYTES = MIN_HUGE_PAGES << 21


def _output(shape: tuple[int, ...], nbytes: int, like: Tensor, out: Tensor | None
            ) -> Tensor | None:
    """``out`` when it fits the C path (contiguous, ``like``'s dtype; else ``None``), or a fresh
    output of ``shape`` (``nbytes`` of it)."""
    if out is not None:
        return out if out.is_contiguous() and out.dtype == like.dtype else None
    if nbytes < _HUGE_PAGE_CANDIDATE_BYTES:
        return like.new_empty(*shape)  # (sizes as arguments: parsed faster than a tuple)
    return empty_for_write(shape, like=like)


def _plain(data: Tensor) -> bool:
    """Whether the C functions may copy ``data``'s bytes as its values: contiguous, and no lazy
    conjugation or negation pending (``x.conj()`` of a complex tensor is contiguous, and its
    bytes are ``x``'s)."""
    return data.is_contiguous() and not (data.is_conj() or data.is_neg())


def _index_bytes(index: Tensor) -> int | None:
    """The index width the C functions take for ``index`` (8 or 4), or ``None`` where they do
    not apply (no module, an index not contiguous on the host or of another dtype)."""
    if (_module if _module is not None else _load()) is False:
        return None
    if not (index.is_cpu and index.is_contiguous()):
        return None
    return _INDEX_BYTES.get(index.dtype)


def _load() -> ModuleType | bool:
    global _module
    _module = library() or False
    return _module


_module: ModuleType | bool | None = None  # library() once asked (False where absent)


def host_sizes(sizes: object) -> tuple[bytearray, int, int, int] | None:
    """``(offsets, total, smallest, largest)`` of a list or tuple of Python ints, read in one C
    pass, with ``offsets`` the int64 running sums from 0 (``len(sizes) + 1`` of them, as bytes);
    ``None`` for anything else (no module; another sequence; bools, NumPy integers; a size or
    a sum past int64), which the caller reads in Python. Not for a function ``torch.compile``
    traces (it cannot see into C): the caller tests that first."""
    module = _module if _module is not None else _load()
    return None if module is False else module.host_sizes(sizes)


def _address(pattern: Tensor | None) -> int | None:
    return None if pattern is None else pattern.data_ptr()


def _row_bytes(data: Tensor, leading: int) -> int:
    return math.prod(data.shape[leading:]) * data.element_size()


# The two conversions below run on every host conversion a batch makes: their checks and the
# output's allocation are written out inline (the helpers above cost several microseconds when
# the caches are cold, as they are between large calls).
def packed_to_padded(values: Tensor, offsets: Tensor, width: int, filler: Number,
                     out: Tensor | None = None) -> Tensor | None:
    """``(total, *D)`` host rows -> ``(B, width, *D)`` (into ``out`` when given: that shape),
    or ``None`` where the C path does not apply (no library; ``values``, ``offsets`` or ``out``
    not contiguous or ``out`` of another dtype; a filler ``held_exactly`` refuses; offsets
    outside the C function's contract)."""
    module = _module if _module is not None else _load()
    index_bytes = _INDEX_BYTES.get(offsets.dtype)
    if module is False or index_bytes is None or not (
            offsets.is_cpu and offsets.is_contiguous() and values.is_contiguous()
            and not (values.is_conj() or values.is_neg())) or (
            filler != 0 and not held_exactly(filler, values.dtype)):
        return None
    batch = offsets.numel() - 1  # (1-d offsets)
    total, *features = values.shape  # (ints: one Size read, and new_empty parses them fastest)
    row_bytes = math.prod(features) * values.element_size()
    if out is None and batch * width * row_bytes < _HUGE_PAGE_CANDIDATE_BYTES:
        result = values.new_empty(batch, width, *features)
    else:
        result = _output((batch, width, *features), batch * width * row_bytes, values, out)
        if result is None:
            return None
    # (_pattern's zero test, inline for the default filler)
    pattern = None if filler == 0 and type(filler) is not complex and \
        math.copysign(1.0, filler) > 0 else _pattern(result, filler)
    code = module.packed_to_padded(
        index_bytes, values.data_ptr(), total, offsets.data_ptr(), batch, width,
        row_bytes, None if pattern is None else pattern.data_ptr(), result.data_ptr())
    return result if code == 0 else None


def padded_to_packed(data: Tensor, offsets: Tensor, total: int, out: Tensor | None = None
                     ) -> Tensor | None:
    """``(B, L, *D)`` host data -> ``(total, *D)`` rows (into ``out`` when given), or ``None``
    where the C path does not apply (as :func:`packed_to_padded`)."""
    module = _module if _module is not None else _load()
    index_bytes = _INDEX_BYTES.get(offsets.dtype)
    if module is False or index_bytes is None or not (
            offsets.is_cpu and offsets.is_contiguous() and data.is_contiguous()
            and not (data.is_conj() or data.is_neg())):
        return None
    batch, width, *features = data.shape  # (ints: one Size read, parsed fastest by new_empty)
    row_bytes = math.prod(features) * data.element_size()
    if out is None and total * row_bytes < _HUGE_PAGE_CANDIDATE_BYTES:
        result = data.new_empty(total, *features)
    else:
        result = _output((total, *features), total * row_bytes, data, out)
        if result is None:
            return None
    code = module.padded_to_packed(index_bytes, data.data_ptr(), batch, width, row_bytes,
                                   offsets.data_ptr(), total, result.data_ptr())
    return result if code == 0 else None


def fill_padding(data: Tensor, sizes: Tensor, filler: Number) -> Tensor | None:
    """``(B, N, *D)`` host data with slots ``>= sizes[b]`` set to ``filler``, as a new tensor,
    or ``None`` where the C path does not apply (as :func:`packed_to_padded`; ``sizes`` not
    1-d)."""
    index_bytes = _index_bytes(sizes)
    if index_bytes is None or not _plain(data) or sizes.dim() != 1 or (
            filler != 0 and not held_exactly(filler, data.dtype)):
        return None
    row_bytes = _row_bytes(data, 2)
    result = _output(tuple(data.shape), data.shape[0] * data.shape[1] * row_bytes, data, None)
    pattern = _pattern(result, filler)
    _module.fill_padding(index_bytes, data.data_ptr(), data.shape[0], data.shape[1], row_bytes,
                         sizes.data_ptr(), _address(pattern), result.data_ptr())
    return result


def _indices_bytes(*indices: Tensor) -> int | None:
    """:func:`_index_bytes` of index tensors of one dtype, all contiguous, or ``None``."""
    first = indices[0]
    for index in indices[1:]:
        if index.dtype != first.dtype or not index.is_contiguous():
            return None
    return _index_bytes(first)


def gather_rows(data: Tensor, indices: Tensor, sizes: Tensor, filler: Number) -> Tensor | None:
    """``(B, M, *D)``: ``data[b, indices[b, j]]`` for ``j < sizes[b]``, ``filler`` elsewhere;
    ``data`` ``(B, N, *D)`` contiguous, ``indices`` ``(B, M)``. ``None`` where the C path does
    not apply (as :func:`packed_to_padded`; an index of a valid slot outside ``[0, N)``
    included)."""
    index_bytes = _indices_bytes(indices, sizes)
    if index_bytes is None or not _plain(data) or (
            filler != 0 and not held_exactly(filler, data.dtype)):
        return None
    batch, width = indices.shape
    row_bytes = _row_bytes(data, 2)
    result = _output((batch, width, *data.shape[2:]), batch * width * row_bytes, data, None)
    pattern = _pattern(result, filler)
    code = _module.gather_rows(index_bytes, data.data_ptr(), batch, data.shape[1], row_bytes,
                               indices.data_ptr(), width, sizes.data_ptr(), _address(pattern),
                               result.data_ptr())
    return result if code == 0 else None


def scatter_rows(source: Tensor, source_indices: Tensor | None, target_indices: Tensor,
                 sizes: Tensor, out: Tensor) -> Tensor | None:
    """``out`` (``(B, T, *D)``, contiguous, holding what the other slots keep) with
    ``out[b, target_indices[b, j]] = source[b, source_indices[b, j]]`` (``source_indices``
    ``None``: slot ``j``) for ``j < sizes[b]``, in slot order; ``source`` ``(B, S, *D)``
    contiguous. ``None`` where the C path does not apply (as :func:`packed_to_padded`; an index
    outside its dim included: ``out`` may then be partly written)."""
    indices = (target_indices, sizes) if source_indices is None else \
        (target_indices, sizes, source_indices)
    index_bytes = _indices_bytes(*indices)
    if index_bytes is None or not (_plain(source) and out.is_contiguous()
                                and out.dtype == source.dtype):
        return None
    batch, width = target_indices.shape
    code = _module.scatter_rows(index_bytes, source.data_ptr(), source.shape[1],
                                _address(source_indices), target_indices.data_ptr(),
                                out.shape[1], sizes.data_ptr(), batch, width,
                                _row_bytes(source, 2), out.data_ptr())
    return out if code == 0 else None
