"""CUDA C++ emission for lowered VM programs (the passes run before: :mod:`lowvm.driver`)."""

from lowvm.codegen.cuda import CudaSource, emit_cuda

__all__ = ["CudaSource", "emit_cuda"]
