"""Hugging Face: the transformers quantizer (``LowvmConfig``, quantizing on load,
tensor-parallel plans), ``from_pretrained`` of lowvm and GPTQ/AWQ/compressed-tensors
checkpoints, and the model card saved beside a checkpoint.

Nothing here is imported at package import time: :mod:`lowvm.nn.hf.hook`, which
``import lowvm`` loads, must stay free of torch and transformers.
"""
