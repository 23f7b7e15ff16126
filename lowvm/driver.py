"""The compiler pipeline, one way: traced program -> passes -> CUDA -> running kernel.

- :func:`elaborate`: what every traced program gets before anything else sees it (the
  front end calls it from ``build``): layout inference, then software pipelining, so the
  interpreter and the GPU run the same program.
- :func:`lower`: the lowering passes (:data:`lowvm.passes.PIPELINE`).
- :func:`generate_cuda`: lower, then emit (:mod:`lowvm.codegen`).
- :func:`compile`: generate, compile (disk-cached), load; ``lowvm.compile(program,
  **constants)`` returns a :class:`CompiledProgram` whose ``source`` is the generated
  CUDA and which launches like a function with torch tensors.

``LOWVM_DEBUG=1`` prints the VM program (and the program after each pass), ``2`` also
the CUDA source, ``3`` also the compiler's resource report.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

from lowvm.codegen import CudaSource, emit_cuda
from lowvm.expr import compile_exprs, evaluate_int32, free_vars, is_const
from lowvm.ir import (
    DEFAULT_MAX_SHARED_BYTES,
    ForStmt,
    PointerType,
    Program,
    ProgramError,
    located_message,
    walk,
)
from lowvm.passes import run_passes
from lowvm.passes.layout_inference import infer_layouts
from lowvm.passes.software_pipeline import pipeline_loops

__all__ = ["elaborate", "lower", "generate_cuda", "CompiledProgram", "compile",
           "current_arch", "arch_for", "check_shared_memory"]


def elaborate(program: Program, max_shared_bytes: int = DEFAULT_MAX_SHARED_BYTES) -> Program:
    """A traced program made whole: every tile gets a concrete layout, then loops with
    ``vm.range(stages=...)`` become pipelines (within ``max_shared_bytes`` of shared
    memory per block), so the interpreter and codegen both run the pipelined program."""
    return pipeline_loops(infer_layouts(program), max_shared_bytes)


def lower(program: Program, upto: str | None = None) -> Program:
    """``program`` after the lowering passes (stopping after the pass named ``upto``)."""
    return run_passes(program, upto)


def _built(program: Any, constants: dict[str, Any], what: str) -> Program:
    """``program`` itself, or the program a ``@vm.program`` template builds with
    ``constants``."""
    if isinstance(program, Program):
        if constants:
            raise ProgramError(f"{what}: {program.name} is already built; constants "
                               f"{sorted(constants)} cannot be given again")
        return program
    build = getattr(program, "build", None)
    if build is None:
        raise ProgramError(f"{what}: expected a lowvm Program or a @vm.program function, "
                           f"got {type(program).__name__}")
    return build(**constants)


def generate_cuda(program: Any, **constants: Any) -> CudaSource:
    """The CUDA C++ source of ``program`` (a Program, or a ``@vm.program`` function built
    with ``constants``), after the lowering passes."""
    return emit_cuda(lower(_built(program, constants, "generate_cuda")))


def check_shared_memory(program: Program, cuda: CudaSource, arch: str) -> None:
    """Refuse a kernel whose block uses more shared memory than ``arch`` allows, before it
    is compiled (the launch would refuse it, and only on that GPU)."""
    from lowvm.runtime.arch_limits import shared_bytes_limit

    limit = shared_bytes_limit(arch)
    used = cuda.shared_bytes + cuda.static_shared_bytes
    if limit is not None and used > limit:
        raise ProgramError(f"{program.name} uses {used} bytes of shared memory per block; "
                           f"{arch} allows at most {limit} ({limit // 1024} KiB): use fewer "
                           "pipeline stages or smaller tiles, or compile for a GPU with more")


def current_arch() -> str:
    """``sm_XY`` of the current CUDA device (an error without one)."""
    import torch

    if not torch.cuda.is_available():
        raise ProgramError("no CUDA device: pass arch='sm_80' (or another) to compile only")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def arch_for(cuda: CudaSource, arch: str) -> str:
    """``arch``, or its ``a`` variant where the kernel uses sm_90a instructions (``wgmma``,
    from ``dot_shared``); an error on GPUs without them, and on GPUs before sm_90 for a
    kernel with mbarriers or tensor copies."""
    if cuda.needs_sm90 and _arch_number(arch) < 90:
        raise ProgramError(f"{cuda.kernel_name} uses mbarriers or the copy engine "
                           f"(vm.mbarriers, copy_tma, copy_bulk, store_tma), which sm_90 "
                           f"(H100/H200) and newer run; got arch={arch!r}")
    if not cuda.needs_sm90a or arch.endswith("a"):
        return arch
    if arch != "sm_90":
        raise ProgramError(f"{cuda.kernel_name} uses wgmma (dot_shared), which only "
                           f"sm_90a (H100/H200) runs; got arch={arch!r}. Build the "
                           "program for sm_80 without dot_shared (e.g. the mma.sync "
                           "kernels)")
    return "sm_90a"


def _arch_number(arch: str) -> int:
    """90 for ``sm_90`` / ``sm_90a`` (0 where the name is not of that form)."""
    digits = "".join(c for c in arch.removeprefix("sm_") if c.isdigit())
    return int(digits) if digits else 0


class CompiledProgram:
    """A program's CUDA source, its cubin, and a launcher taking the runtime arguments."""

    def __init__(self, program: Program, cuda: CudaSource, arch: str, cubin: bytes) -> None:
        from lowvm.runtime import Kernel

        self.program, self.cuda, self.arch, self.cubin = program, cuda, arch, cubin
        specs = [
            (p.name, "pointer" if isinstance(p.type, PointerType) else "scalar",
             p.type.dtype if isinstance(p.type, PointerType) else p.type)
            for p in program.params
        ]
        specs += [(m.name, "tensor_map", m.dtype) for m in cuda.tensor_maps]
        self.kernel = Kernel(cubin, cuda.kernel_name, cuda.num_threads, cuda.shared_bytes, specs)
        self._pointer_index = {p.name: i for i, p in enumerate(program.params)
                               if isinstance(p.type, PointerType)}
        self._maps: dict[tuple, bytes] = {}
        self._scalars = [(i, p.name) for i, p in enumerate(program.params)
                         if not isinstance(p.type, PointerType)]
        grid = tuple(program.grid) + (1,) * (3 - len(program.grid))
        self._grid = compile_exprs(grid, tuple(name for _, name in self._scalars))
        self._scalar_index = tuple(i for i, _ in self._scalars)
        #: runtime loop steps the scalar arguments alone decide: checked before a launch
        #: (a step of 0 would stop the kernel; a step computed on the GPU is left to it)
        names = {name for _, name in self._scalars}
        self._steps = [(stmt.step, stmt.loc) for stmt in walk(program.body)
                       if isinstance(stmt, ForStmt) and not is_const(stmt.step)
                       and {v.name for v in free_vars(stmt.step)} <= names]

    @property
    def source(self) -> str:
        """The generated CUDA C++."""
        return self.cuda.source

    def grid(self, args: tuple[Any, ...]) -> tuple[int, int, int]:
        """The launch grid for these runtime arguments."""
        return self._grid(*[args[i] for i in self._scalar_index])

    def __call__(self, *args: Any, stream: Any = None, overlap: bool = False) -> None:
        """Launch on torch's current stream (or ``stream``) with these arguments.

        ``overlap=True``: start while the stream's previous kernel is still finishing
        (sm_90+, programmatic dependent launch); only for programs that wait for it
        themselves (``vm.wait_prior_grid``), else a ProgramError.
        """
        if len(args) != len(self.program.params):
            names = ", ".join(str(p) for p in self.program.params)
            raise ProgramError(f"{self.program.name} takes {len(self.program.params)} "
                               f"arguments ({names}), got {len(args)}")
        if overlap and not self.cuda.waits_prior_grid:
            raise ProgramError(f"{self.program.name}: overlap=True needs a program that "
                               "calls vm.wait_prior_grid() before it reads what earlier "
                               "kernels wrote; this one does not")
        if self._steps:
            self._check_steps(args)
        if self.cuda.tensor_maps:
            args = (*args, *self.tensor_maps(args))
        self.kernel.launch(self.grid(args), args, stream=stream, overlap=overlap)

    def tensor_maps(self, args: tuple[Any, ...]) -> list[bytes]:
        """The encoded tensor maps of a launch with ``args`` (each made once per pointer
        address and scalar values: a decode step's repeated launches find them)."""
        from lowvm.runtime.tensor_map import encode_tensor_map

        scalars = {name: args[i] for i, name in self._scalars}
        values = tuple(scalars.values())
        out = []
        for spec in self.cuda.tensor_maps:
            x = args[self._pointer_index[spec.pointer]]
            address = x.data_ptr() if hasattr(x, "data_ptr") else int(x)
            key = (spec.name, address, values)
            made = self._maps.get(key)
            if made is None:
                if len(self._maps) >= 1024:
                    self._maps.clear()
                made = self._maps[key] = encode_tensor_map(spec, address, scalars)
            out.append(made)
        return out

    def _check_steps(self, args: tuple[Any, ...]) -> None:
        """Refuse arguments that make a loop's step 0, naming the loop's line."""
        from lowvm.runtime import LaunchError

        env = {name: args[i] for i, name in self._scalars}
        if not all(isinstance(v, numbers.Integral) for v in env.values()):
            return  # the launch's argument check names the bad one
        env = {name: int(v) for name, v in env.items()}
        for step, loc in self._steps:
            if evaluate_int32(step, env) == 0:
                raise LaunchError(located_message(
                    f"{self.program.name}: the vm.range step {step} is 0 for the arguments "
                    f"{env}; a loop with step 0 never ends (the kernel would stop at it)",
                    loc))


def compile(program: Any, arch: str | None = None, compiler: str = "auto",  # noqa: A001
            **constants: Any) -> CompiledProgram:
    """Generate, compile (disk-cached) and wrap a program for launching."""
    from lowvm.runtime import cached_cubin

    program = _built(program, constants, "compile")
    debug = int(os.environ.get("LOWVM_DEBUG", "0") or 0)
    if debug >= 1:
        print(program)
    cuda = generate_cuda(program)
    if debug >= 2:
        print(cuda.source)
    arch = arch_for(cuda, arch or current_arch())
    check_shared_memory(program, cuda, arch)
    cubin = cached_cubin(cuda.source, arch, compiler)
    if debug >= 3:
        from lowvm.runtime import resource_usage

        print(resource_usage(cuda.source, arch))
    return CompiledProgram(program, cuda, arch, cubin)
