"""Serving a quantized model and measuring it: what ``python -m lowvm.serving`` runs.

* :mod:`~lowvm.serving.models`: random Llamas of preset shapes (``tiny``, ``llama3-8b``)
  built where they run, quantized copies sharing the float16 model's other tensors, and
  their weight bytes;
* :mod:`~lowvm.serving.decode_loop`: :class:`DecodeLoop`, greedy decoding with one CUDA
  graph per decode step, as serving engines run it;
* :mod:`~lowvm.serving.measure`: tokens/s, step and forward milliseconds of one model in
  ``eager``, ``graphs`` or ``loop`` mode;
* :mod:`~lowvm.serving.quality`: logit and per-layer errors against float16;
* :mod:`~lowvm.serving.report`: the results table;
* :mod:`~lowvm.serving.cli` and :mod:`~lowvm.serving.compare`: the command line and the
  comparison it runs (``python -m lowvm.serving --help``).
"""

from __future__ import annotations

from lowvm.extras import reraise_missing

try:  # the library runs Hugging Face models on torch: pip install 'lowvm[hf]'
    from lowvm.serving.clock import timed
    from lowvm.serving.decode_loop import DecodeLoop, chunked_argmax
    from lowvm.serving.errors import ServingError
    from lowvm.serving.generation import generate, leading_equal, prompts, sample_tokens
    from lowvm.serving.measure import MODES, Settings, measure, release
    from lowvm.serving.models import (
        PRESETS,
        init_random,
        load_pretrained,
        quantized_copy,
        random_config,
        shared_copy,
        weight_bytes,
    )
    from lowvm.serving.quality import layer_errors, logit_errors
    from lowvm.serving.report import format_table, load_results
except ModuleNotFoundError as _exc:
    reraise_missing(_exc, "lowvm.serving", extra="hf")
    raise

__all__ = ["timed", "DecodeLoop", "chunked_argmax", "ServingError", "generate",
           "leading_equal", "prompts", "sample_tokens", "MODES", "Settings", "measure",
           "release", "PRESETS", "init_random", "load_pretrained", "quantized_copy",
           "random_config", "shared_copy", "weight_bytes", "layer_errors", "logit_errors",
           "format_table", "load_results"]
