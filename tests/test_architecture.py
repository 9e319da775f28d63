"""The layering of the package, read from its source: no import cycles, ``kernels/`` a leaf,
``batch.py`` below the ops, and the upper layers using ``batch.py``'s internal API rather than
its private attributes. Imports inside functions count as imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nestbatch"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p for p in PACKAGE.rglob("*.py") if "csrc" not in p.parts
    }


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The nestbatch modules ``name`` imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known and m != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_no_import_cycles(graph):
    cycles = [(a, b) for a in graph for b in graph[a] if a in _reachable(graph, b)]
    assert cycles == []


def test_kernels_is_a_leaf(graph):
    for name, deps in graph.items():
        if name.startswith("nestbatch.kernels"):
            outside = {d for d in deps if not d.startswith("nestbatch.kernels")}
            assert outside == set(), f"{name} imports {outside}"


@pytest.mark.parametrize(
    "upper", ["nestbatch.ops", "nestbatch.selection", "nestbatch.ragged_batch",
              "nestbatch.batching_helpers"],
)
def test_batch_does_not_reach_its_upper_layers(graph, upper):
    below = _reachable(graph, "nestbatch.batch")
    assert not any(m == upper or m.startswith(upper + ".") for m in below)


def test_upper_layers_use_no_private_attribute_of_a_batch():
    private = re.compile(r"\b(?!self\b)\w+\._(cache|primary|remember|map_primary|"
                         r"with_ragged_dim|partition|ragged_dim)\b")
    offenders = []
    for path in [*PACKAGE.glob("ops/*.py"), PACKAGE / "selection.py", PACKAGE / "ragged_batch.py",
                 PACKAGE / "batching_helpers.py"]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if private.search(line):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
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
