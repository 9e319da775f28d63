"""Host emulation of the CUDA execution model: the kernels of ``csrc/`` compiled with the host
C++ compiler against shim CUDA headers and run on CPU tensors (see :mod:`.build`)."""
