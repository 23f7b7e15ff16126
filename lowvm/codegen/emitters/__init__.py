"""CUDA emitters, one module per instruction family (mirroring :mod:`lowvm.instructions`),
and the registry (:mod:`.registry`) that :mod:`lowvm.codegen.cuda` looks them up in.

Importing this package registers every emitter.
"""

from lowvm.codegen.emitters import (  # noqa: F401  (each module registers its emitters)
    atomic,
    control,
    data,
    dot,
    dot_selected,
    elementwise,
    mbarrier,
    memory,
    memory_selected,
    reduce,
    tma,
)
from lowvm.codegen.emitters.registry import (
    EMITTERS,
    emit_generic,
    emit_instruction,
    emitter_for,
    register_emitter,
)

__all__ = ["EMITTERS", "emit_generic", "emit_instruction", "emitter_for", "register_emitter"]
