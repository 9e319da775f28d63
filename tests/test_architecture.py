"""The layering of the package, read from its source (imports inside functions count too).

Layers, lowest first; a module imports only modules of its own layer or lower ones, with no
import cycle, and reads no other module's underscore names:

1. ``kernels/``: the operators and their implementations (a leaf);
2. ``checks``, ``errors``: argument validation, every message once;
3. ``layouts/``: the partition (the one holder of ragged sizes) and the layouts over it;
4. ``conversions/``: between layouts;
5. ``batch``, ``tensor_methods``: the front object;
6. ``ops/``: torch functions, indexing and selection (one registry);
7. the compat wing: ``compat/`` and the documented import paths kept for it (``convert/``,
   ``batching_helpers``, ``distributed``, ``interop``, ``index_payloads``, ``ragged_batch``),
   then the package itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nestbatch"

#: Module-name prefixes of every layer, lowest first.
LAYERS = (
    ("nestbatch.kernels",),
    ("nestbatch.checks", "nestbatch.errors"),
    ("nestbatch.layouts",),
    ("nestbatch.conversions",),
    ("nestbatch.batch", "nestbatch.tensor_methods"),
    ("nestbatch.ops",),
    ("nestbatch.compat", "nestbatch.convert", "nestbatch.batching_helpers",
     "nestbatch.distributed", "nestbatch.interop", "nestbatch.index_payloads",
     "nestbatch.ragged_batch"),
    ("nestbatch.data",),
    ("nestbatch",),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "csrc" not in p.parts}


def _layer(module: str) -> int:
    for level, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes) and (
            module != "nestbatch" or level == len(LAYERS) - 1
        ):
            return level
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _imported(name: str, path: Path, known: set[str]) -> dict[str, set[str]]:
    """``{module it imports: {names taken from it}}`` for the nestbatch modules ``name``
    imports, at any depth of its code (an empty set for ``import module``)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                if candidate in known:
                    found.setdefault(candidate, set())
                else:
                    found.setdefault(target, set()).add(alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found.setdefault(alias.name, set())
    return {m: names for m, names in found.items() if m in known and m != name}


@pytest.fixture(scope="module")
def imports() -> dict[str, dict[str, set[str]]]:
    modules = _modules()
    return {name: _imported(name, path, set(modules)) for name, path in modules.items()}


def _reachable(graph: dict[str, dict[str, set[str]]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_every_module_is_in_a_layer(imports):
    for name in imports:
        _layer(name)


def test_no_import_runs_against_the_layers(imports):
    upward = [
        f"{name} ({LAYERS[_layer(name)][0]}) imports {dep} ({LAYERS[_layer(dep)][0]})"
        for name, deps in imports.items()
        for dep in deps
        if _layer(dep) > _layer(name)
    ]
    assert upward == []


def test_no_import_cycles(imports):
    cycles = [(a, b) for a in imports for b in imports[a] if a in _reachable(imports, b)]
    assert cycles == []


def test_kernels_is_a_leaf(imports):
    for name, deps in imports.items():
        if name.startswith("nestbatch.kernels"):
            assert {d for d in deps if not d.startswith("nestbatch.kernels")} == set(), name


def test_no_module_imports_another_ones_underscore_names(imports):
    offenders = [
        f"{name} imports {dep}.{taken}"
        for name, deps in imports.items()
        for dep, names in deps.items()
        for taken in names
        if taken.startswith("_") and not taken.startswith("__")
    ]
    assert offenders == []


#: Private attributes of the core objects: read or written only inside their own module.
_OWNED = {
    "nestbatch/batch.py": ("_cache", "_primary", "_remember", "_keep", "_map_primary",
                           "_partition", "_ragged_dim"),
    "nestbatch/layouts/partition.py": ("_max_shape", "_host_shapes", "_shapes", "_device",
                                       "_lengths_on_host", "_host_lengths_tensor",
                                       "_has_empty", "_seed"),
}


def test_no_module_reads_another_ones_private_attributes():
    offenders = []
    for owner, names in _OWNED.items():
        private = re.compile(r"\b(?!self\b|cls\b)\w+\.(" + "|".join(names) + r")\b")
        for path in PACKAGE.rglob("*.py"):
            if str(path.relative_to(PACKAGE.parent)) == owner:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if private.search(line):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


def test_no_module_writes_another_ones_instance_dict():
    """Caches are built by their own class (``memoized``), never written from outside."""
    writes = re.compile(r"\b(?!self\b)\w+\.__dict__\[")
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if writes.search(line) and path.name != "memo.py"
    ]
    assert offenders == []


def test_no_answer_depends_on_who_asks():
    """No code of the package inspects its caller's frames (answers depend on arguments only)."""
    frames = re.compile(r"sys\._getframe|inspect\.(stack|currentframe|getouterframes)|f_back\b")
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if frames.search(line)
    ]
    assert offenders == []


def _error_messages() -> dict[str, list[str]]:
    """``{message with every placeholder as {}: [where it is written]}`` for every exception
    the package raises or returns with a string message of 20 characters or more."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id.endswith("Error") and node.args):
                continue
            first = node.args[0]
            parts = first.values if isinstance(first, ast.JoinedStr) else [first]
            if not all(isinstance(p, ast.Constant | ast.FormattedValue) for p in parts):
                continue
            text = "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in parts)
            if isinstance(text, str) and len(text) >= 20:
                found.setdefault(text, []).append(f"{path.name}:{node.lineno}")
    return found


def test_every_error_message_is_written_once():
    repeated = {text: where for text, where in _error_messages().items() if len(where) > 1}
    assert repeated == {}, "write each message once (a check in nestbatch.checks)"


def test_the_error_message_scan_finds_messages():
    assert len(_error_messages()) > 200
