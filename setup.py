"""Packaging of the CUDA sources, and the optional ahead-of-time build of the kernels.

Every build copies ``csrc/`` into the package (``nestbatch/kernels/csrc/``), so that an installed
wheel can compile the kernels just in time on first CUDA use (see
``nestbatch/kernels/extension.py``); a plain ``pip install .`` compiles nothing. To compile the
extension ``nestbatch.kernels._C`` at install time instead, with PyTorch already installed::

    NESTBATCH_BUILD_CUDA=1 pip install --no-build-isolation -e .

(``--no-build-isolation`` so the build sees the installed torch and its CUDA version.)
``TORCH_CUDA_ARCH_LIST`` picks the GPU architectures, as for any PyTorch extension.
"""

import os
import runpy
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# By path: the package itself imports torch, which a build environment may lack.
CONFIG = runpy.run_path(str(ROOT / "nestbatch" / "kernels" / "build_config.py"))


class BuildPyWithSources(build_py):
    """``build_py`` that also puts a copy of ``csrc/`` into the built package."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "nestbatch" / "kernels" / "csrc"
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted((ROOT / "csrc").iterdir()):
            if path.suffix in CONFIG["CSRC_SUFFIXES"]:
                shutil.copyfile(path, target / path.name)


def _extensions() -> tuple[list, dict]:
    if os.environ.get("NESTBATCH_BUILD_CUDA") != "1":
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    extension = CUDAExtension(
        name="nestbatch.kernels._C",
        sources=[os.path.join("csrc", name) for name in CONFIG["SOURCES"]],
        extra_compile_args={"cxx": list(CONFIG["CXX_FLAGS"]), "nvcc": list(CONFIG["CUDA_FLAGS"])},
    )
    return [extension], {"build_ext": BuildExtension}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass={"build_py": BuildPyWithSources, **cmdclass})
