"""VM program -> CUDA C++ source: one ``extern "C" __global__`` kernel per program.

Each instruction's code comes from its emitter (:mod:`lowvm.codegen.emitters`, looked up
by instruction class and selected implementation), preceded by a comment with the
instruction's text, so the source reads like the program. The program must already be
lowered (:func:`lowvm.driver.lower`): emission runs no passes. Register tiles are
per-thread arrays declared at the top (their index math is compile-time after
unrolling); shared tiles and the scratch area of reductions and dots share one dynamic
shared-memory buffer.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from lowvm.codegen.context import CudaContext, c_size, c_type, is_packed
from lowvm.codegen.emitters import emit_instruction
from lowvm.codegen.prelude import PRELUDE
from lowvm.codegen.shared_alloc import allocate_shared, reused_space
from lowvm.codegen.tensor_maps import TENSOR_MAP_PRELUDE, TensorMapSpec
from lowvm.expr import const_value, is_const
from lowvm.instructions.plans import WgmmaPlan
from lowvm.ir import (
    ForStmt,
    IfStmt,
    InstStmt,
    LetStmt,
    PointerType,
    Program,
    ProgramError,
    RegisterTensor,
    SeqStmt,
    Stmt,
)

__all__ = ["CudaSource", "emit_cuda", "check_register_tiles", "register_words",
           "MAX_REGISTERS_PER_THREAD"]


@dataclass(frozen=True)
class CudaSource:
    """Generated source and what launching it needs."""

    kernel_name: str
    source: str
    num_threads: int
    shared_bytes: int
    #: the kernel waits for the prior grid itself (``vm.wait_prior_grid``), so it may be
    #: launched to overlap that grid
    waits_prior_grid: bool = False
    #: the kernel uses instructions of sm_90a only (``wgmma``): compile it for ``sm_90a``
    needs_sm90a: bool = False
    #: bytes of ``__shared__`` variables besides the dynamic ``shared_bytes``
    static_shared_bytes: int = 0
    #: the kernel uses mbarriers or the copy engine: it needs sm_90 or newer
    needs_sm90: bool = False
    #: the tensor maps to pass after the program's parameters, in order
    tensor_maps: tuple[TensorMapSpec, ...] = ()


def _emit(stmt: Stmt, cg: CudaContext) -> None:
    if isinstance(stmt, InstStmt):
        emit_instruction(stmt.inst, cg)
    elif isinstance(stmt, SeqStmt):
        for s in stmt.stmts:
            _emit(s, cg)
    elif isinstance(stmt, ForStmt):
        var, stop = stmt.var.name, cg.expr(stmt.stop)
        if is_const(stmt.step):
            step = cg.expr(stmt.step)
            test = f"{var} {'>' if const_value(stmt.step) < 0 else '<'} {stop}"
            if const_value(stmt.step) > 0 and cg.is_nonnegative(stmt.start):
                cg.signs[var] = frozenset()  # counts up from a value >= 0
        else:
            # a runtime step: up or down by its sign, as Python's range; a step of 0
            # (refused before launch where the arguments decide it) stops the kernel
            # instead of looping forever
            step = cg.fresh("lowvm_step")
            cg.line(f"const int {step} = {cg.expr(stmt.step)};")
            cg.line(f"if ({step} == 0) __trap();  // vm.range: step 0 never ends")
            test = f"({step} > 0 ? {var} < {stop} : {var} > {stop})"
        if stmt.unroll:
            cg.line(f"#pragma unroll {stmt.unroll}")
        with cg.block(f"for (int {var} = {cg.expr(stmt.start)}; {test}; {var} += {step})"):
            _emit(stmt.body, cg)
    elif isinstance(stmt, IfStmt):
        with cg.block(f"if ({cg.expr(stmt.cond)})"):
            _emit(stmt.then_body, cg)
        if stmt.else_body is not None:
            with cg.block("else"):
                _emit(stmt.else_body, cg)
    elif isinstance(stmt, LetStmt):
        cg.line(f"const auto {stmt.var.name} = {cg.expr(stmt.value)};")
        sign = cg.sign(stmt.value)
        if sign is not None:
            cg.signs[stmt.var.name] = sign
    else:
        raise ProgramError(f"cannot lower the statement {type(stmt).__name__}")


#: registers one thread may use on every GPU lowvm compiles for (sm_70 and later)
MAX_REGISTERS_PER_THREAD = 255


def register_words(tile: RegisterTensor) -> int:
    """The 32-bit registers one thread needs to hold its part of ``tile``."""
    size = tile.layout.local_size
    if is_packed(tile.dtype):
        return max(1, math.ceil(size * tile.dtype.nbits / 32))
    return max(1, math.ceil(size * c_size(tile.dtype) / 4))


def check_register_tiles(program: Program) -> None:
    """Refuse a register tile whose per-thread part alone exceeds the register file's
    share of one thread: the kernel could not keep it in registers, and the C compiler
    takes minutes unrolling its accesses before it spills them (a necessary bound, not a
    sufficient one: the tiles live at one time add up)."""
    for inst in program.instructions():
        tile = inst.output()
        if isinstance(tile, RegisterTensor) and tile.layout is not None:
            words = register_words(tile)
            if words > MAX_REGISTERS_PER_THREAD:
                raise ProgramError(
                    f"the register tile %{tile.name} {tile.type_str()} puts "
                    f"{tile.layout.local_size} elements ({words} 32-bit registers) on each of "
                    f"{tile.layout.num_threads} threads; a thread has at most "
                    f"{MAX_REGISTERS_PER_THREAD} registers: spread the tile over more warps, "
                    "make it smaller, or keep it in shared memory", inst.loc)


def emit_cuda(program: Program) -> CudaSource:
    """The CUDA C++ source of the lowered ``program``."""
    check_register_tiles(program)
    cg = CudaContext(program)
    cg.uses_async_proxy = any(isinstance(inst.impl, WgmmaPlan)
                              for inst in program.instructions())
    offsets, tiles_bytes = allocate_shared(program)
    cg.shared_offsets = offsets
    cg.reused_tiles = reused_space(program, offsets)
    _emit(program.body, cg)
    scratch_at = (tiles_bytes + 15) // 16 * 16
    shared_bytes = scratch_at + cg.scratch_bytes if cg.scratch_bytes else tiles_bytes

    params = []
    for p in program.params:
        if isinstance(p.type, PointerType):
            params.append(f"{c_type(p.type.dtype)}* __restrict__ {p.name}")
        else:
            params.append(f"{'float' if p.type.is_float else 'int'} {p.name}")
    maps = cg.tensor_maps.all()
    params += [f"const __grid_constant__ lowvm_tensor_map {m.name}" for m in maps]
    digest = hashlib.sha256("\n".join(cg.lines).encode()).hexdigest()[:10]
    name = f"lowvm_{program.name}_{digest}"
    consts = ", ".join(f"{k}={v}" for k, v in program.constants)
    bounds = f"{program.num_threads}" + (
        f", {program.min_blocks}" if program.min_blocks is not None else "")
    align = 1024 if cg.uses_async_proxy or cg.uses_tensor_copies else 16
    header = [
        f"// lowvm program {program.name}" + (f" [{consts}]" if consts else ""),
        f"// grid [{', '.join(str(g) for g in program.grid)}], {program.num_threads} threads, "
        f"{shared_bytes} bytes of shared memory",
        f'extern "C" __global__ void __launch_bounds__({bounds}) '
        f"{name}({', '.join(params)}) {{",
        f"  extern __shared__ __align__({align}) "
        "unsigned char lowvm_smem[];",
        "  const int tid = threadIdx.x;",
        f"  const int lowvm_scratch = {scratch_at};",
        "  (void)lowvm_smem; (void)tid; (void)lowvm_scratch;",
    ]
    decls = ["  " + d for d in cg.declared]
    prelude = [PRELUDE.strip(), *([TENSOR_MAP_PRELUDE] if cg.uses_tensor_copies else [])]
    source = "\n".join([*prelude, "", *header, *decls, *cg.lines, "}", ""])
    return CudaSource(name, source, program.num_threads, shared_bytes, cg.waits_prior_grid,
                      cg.uses_async_proxy, cg.static_shared_bytes, cg.uses_tensor_copies,
                      maps)
