"""Print the registers and spills that ``nvcc -Xptxas -v`` reports for every kernel.

Usage: ``python scripts/ptxas_registers.py LOG`` (a log of ``nvcc ... -Xptxas -v``); used by
``scripts/check_cuda_sources.sh``. Kernel names are demangled with ``c++filt`` when present
and shortened to the kernel and its first template arguments.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys


def _demangle(names: list[str]) -> list[str]:
    if not names or shutil.which("c++filt") is None:
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines() if out.returncode == 0 else names


def _short(name: str) -> str:
    name = re.sub(r"\(anonymous namespace\)::|nestbatch::", "", name)
    name = name.split("(", 1)[0]
    return name if len(name) <= 90 else name[:87] + "..."


def main(path: str) -> None:
    rows, kernel, spills = [], None, "0/0"
    for line in open(path, encoding="utf-8", errors="replace"):
        entry = re.search(r"Compiling entry function '([^']+)'", line)
        if entry:
            kernel = entry.group(1)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if spill:
            spills = f"{spill.group(1)}/{spill.group(2)}"
        used = re.search(r"Used (\d+) registers", line)
        if used and kernel:
            rows.append((kernel, int(used.group(1)), spills))
            kernel, spills = None, "0/0"
    names = _demangle([k for k, _, _ in rows])
    for name, (_, registers, spill) in sorted(zip(names, rows), key=lambda r: _short(r[0])):
        print(f"          {registers:3d} registers, spills {spill:>5} B  {_short(name)}")


if __name__ == "__main__":
    main(sys.argv[1])
