"""The quantized layer: ``QuantLinear``, its forward paths (the custom op, the eager CUDA
launch, the CPU reference), its stored format and round-to-nearest quantization.

The lowest wing of :mod:`lowvm.nn`: it imports only :mod:`lowvm.nn.errors` and
:mod:`lowvm.nn.swap`, and every other wing builds on it.
"""
