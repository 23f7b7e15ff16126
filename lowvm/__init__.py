"""lowvm: thread-block-level VM programs for low-precision LLM serving kernels.

``lowvm.dtype("int3")`` and module attributes (``lowvm.int3``, ``lowvm.float6_e3m2``)
give the data types; :mod:`lowvm.layouts` holds the layout algebra.
"""

from lowvm import dtypes, layouts
from lowvm.driver import CompiledProgram, compile, generate_cuda  # noqa: A004
from lowvm.dtypes import *  # noqa: F403  (every data type constant, dtype(), DType)
from lowvm.dtypes import __all__ as _dtype_names
from lowvm.errors import DTypeError, LayoutError, LowvmError
from lowvm.interpreter import InterpretError, interpret
from lowvm.ir import ProgramError
from lowvm.kernels.schedule_source import set_schedule_source as _set_schedule_source
from lowvm.nn.hf.hook import install as _install_hf_hook
from lowvm.nn.quantize.recorder import set_model_recorder as _set_model_recorder
from lowvm.version import __version__ as __version__

_install_hf_hook()  # lowvm checkpoints load through transformers' from_pretrained


def _tuned_schedule(m: int, weight: object) -> object:
    """quant_linear's schedule source: the autotuner's cache (imported on first use)."""
    from lowvm.tune.lookup import tuned_schedule

    return tuned_schedule(m, weight)


_set_schedule_source(_tuned_schedule)


def _record_quantization(*settings: object) -> None:
    """quantize_model's recorder: a LowvmConfig and the model card on a Hugging Face model
    (imported on first use)."""
    from lowvm.nn.hf.record import record_quantization

    record_quantization(*settings)


_set_model_recorder(_record_quantization)

_NN_NAMES = ("QuantLinear", "quantize_model", "LowvmConfig", "from_pretrained",
             "dequantize_model", "fuse_projections", "FuseReport", "use_decode_attention",
             "tensor_parallel")
_KERNEL_NAMES = ("overlapped_launches",)


def __getattr__(name: str) -> object:
    """The quantized layers load on first use: ``import lowvm`` stays free of torch."""
    if name == "tensor_parallel":  # the whole-model function, not a name lowvm.nn exports
        from lowvm.nn.serve.tensor_parallel import tensor_parallel

        return tensor_parallel
    if name in _NN_NAMES:
        import lowvm.nn

        return getattr(lowvm.nn, name)
    if name in _KERNEL_NAMES:
        import lowvm.runtime.workspaces

        return getattr(lowvm.runtime.workspaces, name)
    raise AttributeError(f"module 'lowvm' has no attribute {name!r}")

__all__ = [
    "dtypes",
    "layouts",
    "interpret",
    "compile",
    "generate_cuda",
    "CompiledProgram",
    "LowvmError",
    "DTypeError",
    "LayoutError",
    "ProgramError",
    "InterpretError",
    *_NN_NAMES,
    *_KERNEL_NAMES,
    *_dtype_names,
]
