"""Quantizing a whole model: ``quantize_model`` (round to nearest or GPTQ), calibration
and bit budgets, on top of :mod:`lowvm.nn.layer`."""
