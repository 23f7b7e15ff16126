"""The kernel library, written as VM programs (run on the CPU with ``lowvm.interpret``)."""
