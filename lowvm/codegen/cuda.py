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
from dataclasses import dataclass

from lowvm.codegen.context import CudaContext, c_type
from lowvm.codegen.emitters import emit_instruction
from lowvm.codegen.prelude import PRELUDE
from lowvm.codegen.shared_alloc import allocate_shared, reused_space
from lowvm.instructions.plans import WgmmaPlan
from lowvm.ir import (
    ForStmt,
    IfStmt,
    InstStmt,
    LetStmt,
    PointerType,
    Program,
    ProgramError,
    SeqStmt,
    Stmt,
)

__all__ = ["CudaSource", "emit_cuda"]


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


def _emit(stmt: Stmt, cg: CudaContext) -> None:
    if isinstance(stmt, InstStmt):
        emit_instruction(stmt.inst, cg)
    elif isinstance(stmt, SeqStmt):
        for s in stmt.stmts:
            _emit(s, cg)
    elif isinstance(stmt, ForStmt):
        var = stmt.var.name
        step = cg.expr(stmt.step)
        compare = ">" if step.startswith("-") else "<"
        if stmt.unroll:
            cg.line(f"#pragma unroll {stmt.unroll}")
        with cg.block(f"for (int {var} = {cg.expr(stmt.start)}; {var} {compare} "
                      f"{cg.expr(stmt.stop)}; {var} += {step})"):
            _emit(stmt.body, cg)
    elif isinstance(stmt, IfStmt):
        with cg.block(f"if ({cg.expr(stmt.cond)})"):
            _emit(stmt.then_body, cg)
        if stmt.else_body is not None:
            with cg.block("else"):
                _emit(stmt.else_body, cg)
    elif isinstance(stmt, LetStmt):
        cg.line(f"const auto {stmt.var.name} = {cg.expr(stmt.value)};")
    else:
        raise ProgramError(f"cannot lower the statement {type(stmt).__name__}")


def emit_cuda(program: Program) -> CudaSource:
    """The CUDA C++ source of the lowered ``program``."""
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
    digest = hashlib.sha256("\n".join(cg.lines).encode()).hexdigest()[:10]
    name = f"lowvm_{program.name}_{digest}"
    consts = ", ".join(f"{k}={v}" for k, v in program.constants)
    bounds = f"{program.num_threads}" + (
        f", {program.min_blocks}" if program.min_blocks is not None else "")
    header = [
        f"// lowvm program {program.name}" + (f" [{consts}]" if consts else ""),
        f"// grid [{', '.join(str(g) for g in program.grid)}], {program.num_threads} threads, "
        f"{shared_bytes} bytes of shared memory",
        f'extern "C" __global__ void __launch_bounds__({bounds}) '
        f"{name}({', '.join(params)}) {{",
        f"  extern __shared__ __align__({1024 if cg.uses_async_proxy else 16}) "
        "unsigned char lowvm_smem[];",
        "  const int tid = threadIdx.x;",
        f"  const int lowvm_scratch = {scratch_at};",
        "  (void)lowvm_smem; (void)tid; (void)lowvm_scratch;",
    ]
    decls = ["  " + d for d in cg.declared]
    source = "\n".join([PRELUDE.strip(), "", *header, *decls, *cg.lines, "}", ""])
    return CudaSource(name, source, program.num_threads, shared_bytes, cg.waits_prior_grid,
                      cg.uses_async_proxy)
