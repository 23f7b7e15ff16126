"""The tensor maps of a kernel's tensor copies: what the host must build before a launch.

A tensor copy (``cp.async.bulk.tensor``) reads its global tensor's shape, strides, box
and swizzle from a 128-byte *tensor map* that the host encodes
(``cuTensorMapEncodeTiled``) and passes by value as a ``__grid_constant__`` parameter.
The program describes all of it already: a global view's shape and strides are
expressions of the program's scalar parameters, the box and swizzle come from the shared
tile. So code generation collects one :class:`TensorMapSpec` per distinct (view, box,
swizzle) and appends a parameter for each; the runtime evaluates the specs with each
launch's arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.dtypes import DType
from lowvm.expr import Expr
from lowvm.ir import GlobalTensor, ProgramError, SourceLoc

__all__ = ["TensorMapSpec", "TensorMaps", "TENSOR_MAP_PRELUDE"]

#: the device-side type of a tensor map parameter (the layout of the driver's CUtensorMap)
TENSOR_MAP_PRELUDE = """\
struct __align__(64) lowvm_tensor_map { unsigned long long opaque[16]; };
__device__ __forceinline__ unsigned lowvm_smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
"""


@dataclass(frozen=True)
class TensorMapSpec:
    """One tensor map: the view of pointer parameter ``pointer`` (elements of
    ``dtype``) with ``shape`` and ``strides`` (in elements, outermost first, as the VM
    writes them), copied in boxes of ``box`` under a ``swizzle``-byte swizzle."""

    name: str
    pointer: str
    dtype: DType
    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    box: tuple[int, ...]
    swizzle: int


class TensorMaps:
    """The tensor maps of one kernel, collected while its instructions are emitted."""

    def __init__(self, scalar_params: frozenset[str]) -> None:
        self.scalars = scalar_params
        self.specs: dict[tuple, TensorMapSpec] = {}

    def name_for(self, view: GlobalTensor, box: tuple[int, ...], swizzle: int,
                 loc: SourceLoc | None) -> str:
        """The parameter name of the map for copies of ``box`` from ``view``."""
        key = (view.pointer.name, view.dtype, view.layout.shape, view.layout.strides, box,
               swizzle)
        spec = self.specs.get(key)
        if spec is None:
            unknown = sorted(v.name for v in view.layout.free_vars()
                             if v.name not in self.scalars)
            if unknown:
                raise ProgramError(
                    f"%{view.name}: a tensor copy's view must have a shape and strides made "
                    f"of the program's scalar parameters (the host builds its tensor map "
                    f"before the launch); it uses {', '.join(unknown)}", loc)
            spec = TensorMapSpec(f"lowvm_tmap_{len(self.specs)}", view.pointer.name,
                                 view.dtype, view.layout.shape, view.layout.strides, box,
                                 swizzle)
            self.specs[key] = spec
        return spec.name

    def all(self) -> tuple[TensorMapSpec, ...]:
        """Every map, in parameter order."""
        return tuple(self.specs.values())
