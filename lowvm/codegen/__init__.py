"""CUDA C++ emission for VM programs."""

from lowvm.codegen.cuda import CudaSource, generate_cuda

__all__ = ["CudaSource", "generate_cuda"]
