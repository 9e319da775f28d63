"""Build the CUDA kernels of ``csrc/`` for the host emulation of the CUDA execution model.

The real kernel sources are compiled by the host C++ compiler, unchanged but for two mechanical
rewrites:

* every launch ``kernel<...><<<grid, block, shared, stream>>>(args...)`` becomes a call of the
  emulation engine, ``nestbatch_emulation::launch(site, kernel<...>, LaunchConfig(grid, block,
  shared, stream), args...)`` (:func:`rewrite_launches`);
* ``bindings.cpp`` registers the same schemas in the ``nestbatch_emulated`` namespace, for the
  CPU dispatch key instead of ``nestbatch_cuda`` / CUDA (:func:`rewrite_bindings`).

The shim headers of ``include/`` come first on the include path and stand in for the CUDA ones;
``engine.cpp`` runs the launches (blocks in turn, the threads of a block as fibers). The library
is built with :func:`torch.utils.cpp_extension.load` into ``build/cuda_emulation/<key>/``, where
the key hashes every input of the build, so later runs load it without compiling.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "BUILD_ROOT",
    "CSRC_DIR",
    "EmulationBuildError",
    "EmulationUnavailable",
    "Launch",
    "emulation_settings",
    "find_launches",
    "load",
    "rewrite_bindings",
    "rewrite_launches",
    "state",
]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CSRC_DIR = ROOT / "csrc"
INCLUDE_DIR = HERE / "include"
BUILD_ROOT = ROOT / "build" / "cuda_emulation"
LIBRARY_NAME = "nestbatch_emulated"

#: Translation units of the emulation besides the rewritten ``csrc/*.cu`` and ``bindings.cpp``.
ENGINE_SOURCES = ("emulation_ops.cu", "engine.cpp")

#: ``-O2`` builds about as fast as ``-O1`` here (the torch headers dominate) and runs the
#: long block scans twice as fast as ``-O0``. Hidden visibility keeps the emulated
#: ``nestbatch::*_cuda`` host functions from interposing with those of a real CUDA build
#: loaded in the same process.
CXX_FLAGS = ("-O2", "-fvisibility=hidden", "-Wall", "-Wno-unknown-pragmas")


class EmulationUnavailable(RuntimeError):
    """The emulation cannot be built in this environment (no compiler, missing headers)."""


class EmulationBuildError(RuntimeError):
    """The sources do not compile: a genuine error, to be reported rather than skipped."""


# ------------------------------------------------------------------------------ launch rewriting
@dataclass(frozen=True)
class Launch:
    """One ``kernel<<<config>>>(args)`` launch found in a source.

    Attributes
    ----------
    start, end : int
        The launch is ``text[start:end]``, from the kernel name to the closing parenthesis.
    kernel : str
        The kernel expression, e.g. ``row_copy_kernel<Unit, Map>``.
    config : list of str
        The 2 to 4 launch parameters (grid, block, shared memory bytes, stream).
    args : str
        The argument list, without its parentheses.
    gaps : tuple of str
        The whitespace between the kernel and ``<<<`` and between ``>>>`` and ``(``, kept so
        that the rewritten source keeps its line numbers.
    line : int
        1-based line of the kernel name.
    """

    start: int
    end: int
    kernel: str
    config: list[str]
    args: str
    gaps: tuple[str, str]
    line: int


_OPENERS = {"(": ")", "[": "]", "{": "}"}
_IDENTIFIER = re.compile(r"[A-Za-z0-9_]")


def _code_only(text: str) -> str:
    """``text`` with comments and string/character literals blanked (newlines kept).

    The scanners below work on this shadow copy, so a ``<<<`` or a parenthesis inside a comment
    or a string never counts; offsets are the same as in ``text``. (Raw string literals and
    prefixed character literals such as ``u8'x'`` are not recognized; the kernels use neither.)
    """
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        two = text[i : i + 2]
        if two == "//":
            end = text.find("\n", i)
            end = n if end < 0 else end
        elif two == "/*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif text[i] in "\"'" and not (text[i] == "'" and i > 0 and text[i - 1].isalnum()):
            # A quote right after a digit or letter is a digit separator (1'000), not a literal.
            quote, end = text[i], i + 1
            while end < n and text[end] != quote:
                end += 2 if text[end] == "\\" else 1
            end = min(end + 1, n)
        else:
            i += 1
            continue
        for k in range(i, end):
            if out[k] != "\n":
                out[k] = " "
        i = end
    return "".join(out)


def _match_forward(code: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``code[start]`` (``(``, ``[``, ``{``)."""
    stack = []
    for i in range(start, len(code)):
        c = code[i]
        if c in _OPENERS:
            stack.append(_OPENERS[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                raise ValueError(f"unbalanced {c!r} at offset {i}")
            if not stack:
                return i + 1
    raise ValueError(f"unclosed {code[start]!r} at offset {start}")


def _skip_space_back(code: str, i: int) -> int:
    while i > 0 and code[i - 1].isspace():
        i -= 1
    return i


def _kernel_start(code: str, end: int) -> int:
    """Start of the kernel expression that ends at ``end``: ``ns::name<T, (a > b)>``.

    Scans back over identifiers, ``::`` and balanced template argument lists.
    """
    i = end
    while True:
        i = _skip_space_back(code, i)
        if i > 0 and code[i - 1] == ">":
            # Angle brackets inside parentheses are comparisons: `pair<int, (2 > 1)>`.
            angles, parens, i = 0, 0, i - 1
            while i >= 0:
                c = code[i]
                if c in ")]":
                    parens += 1
                elif c in "([":
                    parens -= 1
                elif parens == 0 and c in "<>":
                    angles += 1 if c == ">" else -1
                if angles == 0 and parens == 0:
                    break
                i -= 1
            if i < 0:
                raise ValueError("unbalanced template arguments before <<<")
            i = _skip_space_back(code, i)
        name_end = i
        while i > 0 and _IDENTIFIER.match(code[i - 1]):
            i -= 1
        if i == name_end:
            raise ValueError("no kernel name before <<<")
        before = _skip_space_back(code, i)
        if before >= 2 and code[before - 2 : before] == "::":
            i = before - 2
            continue
        return i


def _opens_template(text: str, i: int) -> bool:
    """Whether the ``<`` at ``text[i]`` opens a template argument list (follows an identifier
    and is not part of ``<<`` or ``<=``)."""
    if text[i + 1 : i + 2] in ("<", "=") or text[i - 1 : i] == "<":
        return False
    before = _skip_space_back(text, i)
    return before > 0 and _IDENTIFIER.match(text[before - 1]) is not None


def split_top_level(text: str) -> list[str]:
    """Split on the commas outside brackets and template argument lists.

    A ``<`` opens a template argument list when :func:`_opens_template` says so; the next ``>``
    at its depth (not part of ``->`` or ``>=``) closes it. The rewrite passes the parameters on
    verbatim, so a comparison taken for a template argument list can only merge two parameters,
    which the parameter count check then reports.
    """
    parts, depth, angles, start = [], 0, 0, 0
    for i, c in enumerate(text):
        if c in _OPENERS:
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "<" and _opens_template(text, i):
            angles += 1
        elif c == ">" and angles > 0 and text[i - 1] != "-" and text[i + 1 : i + 2] != "=":
            angles -= 1
        elif c == "," and depth == 0 and angles == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def find_launches(text: str) -> list[Launch]:
    """Every ``kernel<<<config>>>(args)`` launch of a C++/CUDA source, in order.

    Raises
    ------
    ValueError
        On a launch whose parts cannot be delimited, or with other than 2 to 4 parameters.
    """
    code = _code_only(text)
    launches = []
    position = 0
    while (open_at := code.find("<<<", position)) >= 0:
        line = code.count("\n", 0, open_at) + 1
        try:
            start = _kernel_start(code, open_at)
            close_at = open_at + 3
            depth = 0
            while not (depth == 0 and code.startswith(">>>", close_at)):
                if close_at >= len(code):
                    raise ValueError("no >>> after <<<")
                depth += code[close_at] in _OPENERS
                depth -= code[close_at] in ")]}"
                close_at += 1
            paren = close_at + 3
            while paren < len(code) and code[paren].isspace():
                paren += 1
            if code[paren : paren + 1] != "(":
                raise ValueError("no argument list after >>>")
            end = _match_forward(code, paren)
        except ValueError as error:
            raise ValueError(f"line {line}: cannot parse the kernel launch: {error}") from None
        config = split_top_level(text[open_at + 3 : close_at])
        if not 2 <= len(config) <= 4 or not all(config):
            raise ValueError(f"line {line}: a launch takes 2 to 4 parameters, got {config}")
        kernel_end = _skip_space_back(code, open_at)
        launches.append(
            Launch(
                start=start,
                end=end,
                kernel=text[start:kernel_end],
                config=config,
                args=text[paren + 1 : end - 1],
                gaps=(text[kernel_end:open_at], text[close_at + 3 : paren]),
                line=code.count("\n", 0, start) + 1,
            )
        )
        position = end
    return launches


def _c_string(text: str) -> str:
    return json.dumps(" ".join(text.split()))  # a JSON string of ASCII is a valid C literal


def _launch_call(launch: Launch) -> str:
    """The engine call replacing ``launch``."""
    site = f"::nestbatch_emulation::KernelSite{{{_c_string(launch.kernel)}, __FILE__, __LINE__}}"
    config = ", ".join(launch.config)
    args = f", {launch.args}" if launch.args.strip() else ""
    return (
        f"::nestbatch_emulation::launch({site}, {launch.kernel}{launch.gaps[0]}, "
        f"::nestbatch_emulation::LaunchConfig({config}){launch.gaps[1]}{args})"
    )


def rewrite_launches(text: str, path: str | Path) -> tuple[str, int]:
    """Rewrite every launch of a source into an engine call; returns the text and the count.

    The result starts with a ``#line`` directive naming ``path``, and keeps every other line
    where it was, so compiler diagnostics and ``__FILE__``/``__LINE__`` point into the original.
    """
    launches = find_launches(text)
    pieces, position = [f'#line 1 "{Path(path).as_posix()}"\n'], 0
    for launch in launches:
        pieces.append(text[position : launch.start])
        original = text[launch.start : launch.end]
        call = _launch_call(launch)
        # Keep the line count: the split config lost its own newlines, add them at the end.
        call += "\n" * (original.count("\n") - call.count("\n"))
        pieces.append(call)
        position = launch.end
    pieces.append(text[position:])
    rewritten = "".join(pieces)
    if "<<<" in _code_only(rewritten):
        raise ValueError(f"{path}: a kernel launch was left unrewritten")
    return rewritten, len(launches)


def rewrite_bindings(text: str, path: str | Path) -> str:
    """``bindings.cpp`` registering its schemas as ``nestbatch_emulated::*`` for the CPU key.

    Raises
    ------
    ValueError
        If the source does not have exactly one ``TORCH_LIBRARY(nestbatch_cuda, ...)`` and one
        ``TORCH_LIBRARY_IMPL(nestbatch_cuda, CUDA, ...)`` (the rewrite would silently miss).
    """
    text, defs = re.subn(
        r"\bTORCH_LIBRARY\(\s*nestbatch_cuda\s*,", "TORCH_LIBRARY(nestbatch_emulated,", text
    )
    text, impls = re.subn(
        r"\bTORCH_LIBRARY_IMPL\(\s*nestbatch_cuda\s*,\s*CUDA\s*,",
        "TORCH_LIBRARY_IMPL(nestbatch_emulated, CPU,",
        text,
    )
    if (defs, impls) != (1, 1):
        raise ValueError(
            f"{path}: expected one TORCH_LIBRARY(nestbatch_cuda, ...) and one "
            f"TORCH_LIBRARY_IMPL(nestbatch_cuda, CUDA, ...), found {defs} and {impls}"
        )
    return f'#line 1 "{Path(path).as_posix()}"\n' + text


# ------------------------------------------------------------------------------------- building
def _compiler() -> str | None:
    """The C++ compiler :mod:`torch.utils.cpp_extension` will run (``$CXX``, else ``c++``)."""
    return shutil.which(os.environ.get("CXX", "c++"))


def _inputs() -> list[Path]:
    """Every file whose content the built library depends on."""
    own = [HERE / name for name in ENGINE_SOURCES] + [Path(__file__).resolve()]
    headers = sorted(p for p in INCLUDE_DIR.rglob("*") if p.is_file())
    return sorted(p for p in CSRC_DIR.iterdir() if p.is_file()) + own + headers


def build_key(compiler: str) -> str:
    """Hash of the sources, the shims, the builder, the compiler, the flags and torch."""
    digest = hashlib.sha256()
    for path in _inputs():
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    for fact in (compiler, *CXX_FLAGS, torch.__version__, sys.version):
        digest.update(fact.encode() + b"\0")
    return digest.hexdigest()[:16]


def _write_sources(directory: Path) -> list[Path]:
    """Write the rewritten sources into ``directory``; returns the translation units.

    Every file of ``csrc/`` is copied, launches rewritten, ``.cu`` renamed ``.cpp`` (so that g++
    compiles it), and ``bindings.cpp`` re-registered for the emulation. Headers land next to the
    units that include them, so the rewritten ``common.cuh`` shadows the original.
    """
    directory.mkdir(parents=True, exist_ok=True)
    originals = sorted(p for p in CSRC_DIR.iterdir() if p.suffix in {".cu", ".cuh", ".h", ".cpp"})
    originals += [HERE / name for name in ENGINE_SOURCES]
    units = []
    for path in originals:
        text = path.read_text()
        if path.parent == CSRC_DIR and path.name == "bindings.cpp":
            text = rewrite_bindings(text, path)
        else:
            text, _ = rewrite_launches(text, path)
        target = directory / (path.stem + ".cpp" if path.suffix == ".cu" else path.name)
        if target.exists() and target in units:
            raise ValueError(f"two sources would both become {target.name}")
        target.write_text(text)
        if target.suffix == ".cpp":
            units.append(target)
    # ninja starts the units in this order: bindings.cpp, which includes all of
    # <torch/extension.h>, takes as long as the others together, so it goes first.
    return sorted(units, key=lambda unit: unit.name != "bindings.cpp")


@contextmanager
def _build_environment() -> Iterator[None]:
    """The environment of the build.

    * This interpreter's ``bin/`` (where ``pip install ninja`` puts ``ninja``) is on ``PATH``:
      :mod:`torch.utils.cpp_extension` looks ninja up there, and compiles the translation units
      in parallel only with it.
    * ``MAX_JOBS`` (the parallelism cpp_extension gives ninja) defaults to the number of cores:
      ninja's own default, two more, only slows the longest unit (``bindings.cpp``) down.
    """
    previous = {name: os.environ.get(name) for name in ("PATH", "MAX_JOBS")}
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), previous["PATH"] or ""])
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_MISSING_HEADER = re.compile(r"fatal error: ([^:\s]+): No such file or directory")


def _classify(error: Exception) -> Exception:
    """:class:`EmulationUnavailable` for what the environment lacks (a header of Python or
    torch, a library to link, a tool), :class:`EmulationBuildError` for everything else."""
    text = str(error)
    # The compiler's diagnostics, without ninja's echo of every (long) command line.
    lines = [line for line in text.splitlines() if "-DTORCH_EXTENSION_NAME=" not in line]
    tail = "\n".join(lines)[-6000:]
    ours = {p.name for p in _inputs()}
    missing = [h for h in _MISSING_HEADER.findall(text) if Path(h).name not in ours]
    if missing:
        return EmulationUnavailable(f"a header the build needs is not installed: {missing[0]}")
    if "cannot find -l" in text:
        return EmulationUnavailable(f"a library the build links is missing:\n{tail}")
    if isinstance(error, OSError):
        return EmulationUnavailable(f"a build tool cannot run: {error}")
    return EmulationBuildError(f"the emulated CUDA kernels do not compile:\n{tail}")


def _remove_stale_builds(keep: Path) -> None:
    """Remove the builds of older sources (their directories are named by other keys)."""
    for path in BUILD_ROOT.iterdir():
        if path != keep and path.is_dir() and re.fullmatch(r"[0-9a-f]{16}", path.name):
            shutil.rmtree(path, ignore_errors=True)


def _build(directory: Path) -> float:
    """Compile the emulation into ``directory``; returns the seconds it took."""
    from torch.utils import cpp_extension

    units = _write_sources(directory / "src")
    start = time.perf_counter()
    with _build_environment():
        try:
            cpp_extension.load(
                name=LIBRARY_NAME,
                sources=[str(unit) for unit in units],
                extra_cflags=list(CXX_FLAGS),
                extra_include_paths=[str(INCLUDE_DIR)],
                build_directory=str(directory),
                is_python_module=False,
                verbose=False,
            )
        except Exception as error:
            raise _classify(error) from error
    seconds = time.perf_counter() - start
    (directory / "COMPLETE").write_text(json.dumps({"build_seconds": round(seconds, 1)}) + "\n")
    _remove_stale_builds(directory)
    return seconds


@functools.cache
def load() -> Path:
    """Build (once per source version) and load the emulated kernels; returns the library.

    After this, ``torch.ops.nestbatch_emulated.<op>`` runs the ``csrc/`` kernel of ``<op>`` on
    CPU tensors, and ``torch.ops.nestbatch_emulation`` holds the emulation's own operators.

    Raises
    ------
    EmulationUnavailable
        Where the environment cannot build it (not Linux, no C++ compiler, missing headers).
    EmulationBuildError
        Where the sources fail to compile.
    """
    if sys.platform != "linux":
        raise EmulationUnavailable(f"the emulation runs on Linux only, not {sys.platform}")
    if torch.version.cuda is not None and torch.cuda.is_available():
        # Its stand-ins for at::cuda's device queries clash with the real ones a CUDA build of
        # torch loads once a GPU is in use (the workers crashed in state() on an H100
        # machine); there the real kernels run instead, in the tests marked cuda. A CUDA build
        # without a GPU runs the emulation as a CPU-only build does (checked with torch 2.14.1).
        raise EmulationUnavailable(
            f"the emulation needs a machine without a CUDA device (this torch, built with CUDA "
            f"{torch.version.cuda}, has one); the CUDA kernels themselves run in the tests "
            "marked cuda"
        )
    compiler = _compiler()
    if compiler is None:
        raise EmulationUnavailable(f"no C++ compiler ({os.environ.get('CXX', 'c++')}) found")
    directory = BUILD_ROOT / build_key(compiler)
    library = directory / f"{LIBRARY_NAME}.so"
    if (directory / "COMPLETE").is_file() and library.is_file():
        torch.ops.load_library(str(library))
    else:
        _build(directory)  # cpp_extension.load loads the library it built
    return library


# ------------------------------------------------------------------------------------- controls
def state() -> dict:
    """Counters of the engine (launches, blocks, barrier arrivals, fiber switches), the last
    launch (kernel, site, grid, block, ``last_pointee_bytes``: the size of what each pointer
    parameter points to, i.e. the vector unit of a row copy), ``recent_launches`` (kernel and
    pointee sizes of the last 8 launches, oldest first) and the settings."""
    return json.loads(torch.ops.nestbatch_emulation.state())


@contextmanager
def emulation_settings(
    *, sms: int | None = None, schedule: str | None = None, seed: int = 0
) -> Iterator[None]:
    """Run the block with another emulated SM count and/or thread schedule.

    Parameters
    ----------
    sms : int, optional
        What ``at::cuda::getCurrentDeviceProperties()->multiProcessorCount`` reports; grids
        are capped at 32 blocks per SM, so 1 makes every grid-stride loop of a large input
        iterate (and ``mask_to_indices`` picks its path from it).
    schedule : {"forward", "reverse", "shuffled"}, optional
        Order of the blocks, and of the threads of a block between two barriers.
    seed : int, default 0
        Seed of the shuffled order.
    """
    ops = torch.ops.nestbatch_emulation
    previous_sms = ops.set_sm_count(sms) if sms is not None else None
    previous_schedule = ops.set_schedule(schedule, seed) if schedule is not None else None
    try:
        yield
    finally:
        if previous_sms is not None:
            ops.set_sm_count(previous_sms)
        if previous_schedule is not None:
            ops.set_schedule(previous_schedule, 0)
