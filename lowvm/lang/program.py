"""``@vm.program``: a Python function that builds a VM program.

Parameters are classified by annotation: ``vm.ptr[dtype]`` is a pointer,
a data type (``vm.int32``, ``vm.float32``) is a runtime scalar, anything else (or no
annotation) is a compile-time constant. ``build(**constants)`` traces the function once
per set of constant values and caches the resulting :class:`~lowvm.ir.Program`.

A pointer may take its element type from a compile-time constant
(``vm.ptr[vm.dtype_of("adtype")]``), so one program serves float16 and bfloat16
activations alike; each build resolves it to the constant's data type. Such a type
constant names the specialisation instead of being listed with the others: a value other
than its default appends its short name (``quant_gemm_bf16``), as C++ names a template's
instance by its type arguments.
"""

from __future__ import annotations

import inspect
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Any

from lowvm.driver import elaborate
from lowvm.dtypes import DType
from lowvm.errors import LowvmError
from lowvm.ir import Param, PointerType, Program, ProgramError, SourceLoc, located_message
from lowvm.lang.builder import (
    DEFAULT_MAX_SHARED_BYTES,
    MAX_WARPS,
    Builder,
    Pointer,
    activate,
    is_warp_count,
    traceback_location,
    user_location,
)
from lowvm.source_location import user_location as call_location

__all__ = ["program", "ProgramTemplate", "ptr", "constexpr", "dtype_of", "PointerOf"]


@dataclass(frozen=True)
class dtype_of:  # noqa: N801 - used inside annotations, like vm.ptr
    """``vm.dtype_of("adtype")``: the data type the compile-time parameter ``adtype`` holds,
    as the element type of a pointer parameter (``x: vm.ptr[vm.dtype_of("adtype")]``).

    A name string inside ``vm.ptr[...]`` already means a data type by name
    (``vm.ptr["float16"]``), hence a spelling of its own."""

    constant: str


@dataclass(frozen=True)
class PointerOf:
    """The annotation ``vm.ptr[vm.dtype_of(constant)]``: a pointer parameter whose element
    type each build takes from the compile-time parameter ``constant``."""

    constant: str

    def __str__(self) -> str:
        return f"ptr<{self.constant}>"


class _PointerFactory:
    """``vm.ptr[vm.float16]`` (or ``vm.ptr(vm.float16)``): a pointer parameter type;
    ``vm.ptr[vm.dtype_of("adtype")]``: one whose element type is a compile-time constant."""

    def __getitem__(self, dtype: DType | str | dtype_of) -> PointerType | PointerOf:
        from lowvm.dtypes import dtype as as_dtype

        if isinstance(dtype, dtype_of):
            if not isinstance(dtype.constant, str) or not dtype.constant.isidentifier():
                raise ProgramError(f"vm.dtype_of: the name of a compile-time parameter, such "
                                   f"as 'adtype', got {dtype.constant!r}", user_location())
            return PointerOf(dtype.constant)
        return PointerType(as_dtype(dtype))

    __call__ = __getitem__


ptr = _PointerFactory()


class constexpr:  # noqa: N801 - used as an annotation, like typing names
    """Annotation for a compile-time parameter (the default for unannotated ones)."""


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _locate(exc: LowvmError, program: CodeType) -> None:
    """Re-raise an error from tracing with the program's line, if it does not name one.

    Errors from the lower layers (an expression used as a Python ``bool``, a layout or
    type that cannot be built) do not know which program line caused them; the
    traceback does.
    """
    if isinstance(exc, ProgramError) and exc.loc is not None:
        raise exc
    loc = traceback_location(exc.__traceback__, program)
    if loc is None:
        raise exc
    if isinstance(exc, ProgramError):
        raise type(exc)(exc.message, loc).with_traceback(exc.__traceback__) from None
    try:
        located = type(exc)(located_message(str(exc), loc, call_location()))
    except Exception:  # an error class with another constructor: leave it as it is
        raise exc from None
    raise located.with_traceback(exc.__traceback__) from None


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


#: the types a compile-time parameter may declare (by annotation, or by its default when
#: it has none or is annotated ``vm.constexpr``), each with its test and its description
_KINDS: dict[type, tuple[Callable[[Any], bool], str]] = {
    int: (_integer, "an integer"),
    float: (_number, "a number"),
    bool: (lambda v: isinstance(v, (bool, numbers.Integral)), "a bool"),
    str: (lambda v: isinstance(v, str), "a string"),
}


def _declared_kinds(param: inspect.Parameter) -> tuple[list[type], bool] | None:
    """The kinds ``param`` accepts and whether it accepts None: from its annotation (int,
    float, bool, str or a union of them and None), else, unannotated or ``vm.constexpr``,
    from the type of its default; None where nothing is declared (any value goes)."""
    annotation = param.annotation
    if annotation in (inspect.Parameter.empty, constexpr):
        default = param.default
        return ([type(default)], False) if type(default) in _KINDS else None
    if annotation in _KINDS:
        return [annotation], False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = typing.get_args(annotation)
        kinds = [m for m in members if m in _KINDS]
        if kinds and all(m in _KINDS or m is type(None) for m in members):
            return kinds, type(None) in members
    return None


#: annotations of compile-time parameters that declare no class their values must be of
_UNCHECKED = (inspect.Parameter.empty, constexpr, typing.Any)


def _checked_constant(program_name: str, param: inspect.Parameter, value: Any) -> Any:
    """``value`` for the compile-time parameter ``param`` when the type it declares (see
    :func:`_declared_kinds`, or any other class it is annotated with) admits it, else a
    ProgramError at the user's line naming both: a string where an integer belongs would
    otherwise fail deep inside tracing with Python's own message."""
    declared = _declared_kinds(param)
    if declared is None:
        cls = param.annotation
        if (not isinstance(cls, type) or any(cls is u for u in _UNCHECKED)
                or isinstance(value, cls)):
            return value
        raise ProgramError(f"{program_name}: the compile-time parameter {param.name!r} takes "
                           f"a {cls.__name__}, got {value!r} ({type(value).__name__})",
                           user_location())
    kinds, optional = declared
    if (optional and value is None) or any(_KINDS[k][0](value) for k in kinds):
        return value
    accepted = " or ".join([_KINDS[k][1] for k in kinds] + (["None"] if optional else []))
    source = ("" if param.annotation not in (inspect.Parameter.empty, constexpr) else
              f" (the type of its default {param.default!r})")
    raise ProgramError(f"{program_name}: the compile-time parameter {param.name!r} takes "
                       f"{accepted}{source}, got {value!r} ({type(value).__name__})",
                       user_location())


class ProgramTemplate:
    """A ``@vm.program`` function: builds one specialised :class:`Program` per constants."""

    def __init__(self, fn: Callable, warps: int | None, name: str | None,
                 max_shared_bytes: int,
                 listing: Callable[..., dict[str, Any]] | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.warps = warps
        self.max_shared_bytes = max_shared_bytes
        self.listing = listing
        self.signature = inspect.signature(fn, eval_str=True)
        #: the runtime parameters: name and type, a pointer's element type perhaps a
        #: compile-time parameter's (:class:`PointerOf`)
        self.runtime: list[tuple[str, PointerType | PointerOf | DType]] = []
        self.constant_names: list[str] = []
        for p in self.signature.parameters.values():
            if isinstance(p.annotation, (PointerType, PointerOf, DType)):
                self.runtime.append((p.name, p.annotation))
            else:
                self.constant_names.append(p.name)
        #: the compile-time parameters that give pointers their element types
        self.type_constants: tuple[str, ...] = tuple(dict.fromkeys(
            t.constant for _, t in self.runtime if isinstance(t, PointerOf)))
        for constant in self.type_constants:
            if constant not in self.constant_names:
                pointers = self._pointers_of(constant)
                raise ProgramError(
                    f"{self.name}: the pointer {pointers[0]!r} takes its element type from "
                    f"{constant!r} (vm.dtype_of({constant!r})), which is not a compile-time "
                    f"parameter of it; its compile-time parameters: "
                    f"{self.constant_names or 'none'}", user_location())
        self._cache: dict[Any, Program] = {}
        self.__doc__ = fn.__doc__
        self.__name__ = self.name

    def _pointers_of(self, constant: str) -> list[str]:
        """The pointer parameters whose element type is ``constant``'s value."""
        return [n for n, t in self.runtime if isinstance(t, PointerOf) and t.constant == constant]

    def build(self, **constants: Any) -> Program:
        """Trace the function with these compile-time constants (cached), then
        :func:`lowvm.driver.elaborate` it: register layouts the function left out are
        inferred, staged loops pipelined."""
        unknown = set(constants) - set(self.constant_names)
        if unknown:
            raise ProgramError(
                f"{self.name}: unknown compile-time parameters {sorted(unknown)}; it takes "
                f"{self.constant_names or 'none'}", user_location()
            )
        values: dict[str, Any] = {}
        for name in self.constant_names:
            p = self.signature.parameters[name]
            if name in constants:
                values[name] = _checked_constant(self.name, p, constants[name])
            elif p.default is not inspect.Parameter.empty:
                values[name] = p.default
            else:
                raise ProgramError(
                    f"{self.name}: the compile-time parameter {name!r} needs a value: "
                    f"build({name}=...)", user_location()
                )
        for name in self.type_constants:
            if not isinstance(values[name], DType):
                raise ProgramError(
                    f"{self.name}: the compile-time parameter {name!r} is the element type of "
                    f"{self._pointers_of(name)} (vm.dtype_of({name!r})): a lowvm data type "
                    f"such as lowvm.float16, got {values[name]!r} "
                    f"({type(values[name]).__name__})", user_location())
        key = _freeze(values)
        try:
            hash(key)
        except TypeError:
            key = repr(key)
        if key not in self._cache:
            try:
                self._cache[key] = elaborate(self._trace(values), self.max_shared_bytes)
            except ProgramError as exc:  # name the user's line of this build too
                raise exc.at_call(call_location()) from None
        return self._cache[key]

    def _specialised(self, constants: dict[str, Any]) -> tuple[str, tuple[Param, ...],
                                                              tuple[tuple[str, Any], ...]]:
        """The program's name, runtime parameters and listed constants for ``constants``
        (see the module docstring)."""
        name = self.name + "".join(
            f"_{constants[c].short_name}" for c in self.type_constants
            if constants[c] != self.signature.parameters[c].default)
        params = tuple(Param(n, PointerType(constants[t.constant]) if isinstance(t, PointerOf)
                             else t) for n, t in self.runtime)
        listed = (self.listing(**constants) if self.listing is not None else
                  {k: v for k, v in constants.items() if k not in self.type_constants})
        return name, params, tuple(listed.items())

    def _trace(self, constants: dict[str, Any]) -> Program:
        code = self.fn.__code__
        name, params, listed = self._specialised(constants)
        builder = Builder(name, self.warps, self.max_shared_bytes, code)
        kwargs: dict[str, Any] = dict(constants)
        for p in params:
            kwargs[p.name] = Pointer(p.var, p.type.dtype) if p.is_pointer else p.var  # type: ignore[union-attr]
        previous = activate(builder)
        try:
            self.fn(**kwargs)
            builder.raise_deferred()
        except LowvmError as exc:
            _locate(exc, code)
        finally:
            activate(previous)
        if len(builder.stack) != 1:  # pragma: no cover - guarded by the context managers
            raise ProgramError(f"{self.name}: unbalanced loop or branch")
        if builder.grid is None:
            raise ProgramError(
                f"{name}: the launch grid is not set; call vm.set_grid(...) in the body",
                SourceLoc(code.co_filename, code.co_firstlineno),
            )
        from lowvm.ir import SeqStmt

        return Program(
            name=name,
            params=params,
            grid=builder.grid,
            num_warps=builder.num_warps or 1,
            body=SeqStmt(tuple(builder.stack[0])),
            constants=listed,
            shared_bytes=builder.shared_peak,
            min_blocks=builder.min_blocks,
        )

    def interpret(self, *args: Any, checked: bool | None = None, **constants: Any) -> None:
        """Build with ``constants`` and run on the CPU interpreter (``checked``: see
        :func:`lowvm.interpret`)."""
        from lowvm.interpreter import run_program

        run_program(self.build(**constants), args, checked)

    def __repr__(self) -> str:
        params = ", ".join(f"{n}: {t}" for n, t in self.runtime)
        return f"<lowvm program {self.name}({params}); constants {self.constant_names}>"


def program(fn: Callable | None = None, *, warps: int | None = None, name: str | None = None,
            max_shared_bytes: int = DEFAULT_MAX_SHARED_BYTES,
            listing: Callable[..., dict[str, Any]] | None = None):
    """Decorator: turn a function into a VM program template (see module docstring).

    ``listing(**constants)``, when given, is the ``{name: value}`` a specialisation lists
    in its text and its kernel's header comment, e.g. a schedule object field by field;
    by default every constant but the pointers' element types (which the name carries).
    """

    if warps is not None and not is_warp_count(warps):
        raise ProgramError(f"@vm.program: warps must be an integer in [1, {MAX_WARPS}] "
                           f"(at most {MAX_WARPS * 32} threads per block), got {warps!r}",
                           user_location())

    def wrap(f: Callable) -> ProgramTemplate:
        return ProgramTemplate(f, warps, name, max_shared_bytes, listing)

    return wrap(fn) if fn is not None else wrap
