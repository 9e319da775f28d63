"""Optional ahead-of-time build of the CUDA kernels (``csrc/``) as ``nestbatch.kernels._C``.

A plain ``pip install .`` builds no extension: the kernels are compiled just in time on first CUDA
use instead (see ``nestbatch/kernels/extension.py``), or nestbatch runs its PyTorch
implementation. To compile them at install time, with PyTorch already installed::

    NESTBATCH_BUILD_CUDA=1 pip install --no-build-isolation -e .

(``--no-build-isolation`` so the build sees the installed torch and its CUDA version.)
``TORCH_CUDA_ARCH_LIST`` picks the GPU architectures, as for any PyTorch extension.
"""

import os

from setuptools import setup


def _extensions() -> tuple[list, dict]:
    if os.environ.get("NESTBATCH_BUILD_CUDA") != "1":
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    sources = ["bindings.cpp", "packed_padded.cu", "batched_indexing.cu", "mask_indices.cu"]
    extension = CUDAExtension(
        name="nestbatch.kernels._C",
        sources=[os.path.join("csrc", name) for name in sources],
        extra_compile_args={
            "cxx": ["-O3"],
            "nvcc": ["-O3", "--expt-relaxed-constexpr", "-lineinfo"],
        },
    )
    return [extension], {"build_ext": BuildExtension}


ext_modules, cmdclass = _extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
