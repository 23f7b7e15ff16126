"""Where, in the user's source, something happened.

Errors carry these :class:`~lowvm.ir.SourceLoc` so that they point at the line the user
wrote, not into the libraries between that line and the error. Three kinds of frames are
never the user's: lowvm's own, torch's (a layer's ``forward`` runs lowvm inside
``torch.ops.lowvm.*`` custom ops, several torch frames deep) and the standard library's
(``contextlib`` sits between a ``with vm.if_(...)`` line and lowvm).

A traced program has a second notion of "its line": the line of the program that made
an instruction. For a program the user wrote, that is the user's line; for a program of
lowvm's own kernel library it is the library's line, never the line of whichever call
happened to build (and cache) the program first. :func:`program_location` finds it.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig
from collections.abc import Iterator
from types import CodeType, FrameType, TracebackType

from lowvm.ir import SourceLoc

__all__ = ["user_location", "program_location", "traceback_location", "is_user_file"]

_LOWVM_DIR = os.path.dirname(os.path.abspath(__file__))
_LOWVM_PARENT = os.path.dirname(_LOWVM_DIR)
#: lowvm's language machinery: the packages a ``vm.*`` call passes through on its way to
#: the builder (everything up to :mod:`lowvm.lang` in the layering). The packages above
#: it (the kernel library, the layers) write programs; their lines are program lines.
_LANGUAGE = tuple(os.path.join(_LOWVM_DIR, name) for name in (
    "dtypes.py", "errors.py", "expr.py", "source_location.py", "layouts", "ir",
    "instructions", "interpreter", "passes", "codegen", "runtime", "driver.py", "lang"))


def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(sorted({os.path.abspath(paths[k]) for k in ("stdlib", "platstdlib")
                         if paths.get(k)}))


_STDLIB = _stdlib_dirs()
_SITE = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_torch_dir: str | None = None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root if root.endswith(os.sep) else root + os.sep)


def _torch_root() -> str | None:
    """torch's package folder, once torch is imported (lowvm never imports it for this)."""
    global _torch_dir
    if _torch_dir is None:
        torch = sys.modules.get("torch")
        file = getattr(torch, "__file__", None)
        if file:
            _torch_dir = os.path.dirname(os.path.abspath(file))
    return _torch_dir


def is_user_file(filename: str) -> bool:
    """Whether a frame of ``filename`` is the user's: not lowvm, torch or the stdlib."""
    return _is_user_file(filename, _torch_root())


@functools.lru_cache(maxsize=4096)
def _is_user_file(filename: str, torch_dir: str | None) -> bool:
    # cached: tracing asks for every frame of every instruction, and files are few
    if filename.startswith("<"):  # <stdin>, <string>, notebooks; not <frozen importlib...>
        return not filename.startswith("<frozen ")
    path = os.path.abspath(filename)
    if _under(path, _LOWVM_DIR):
        return False
    if torch_dir is not None and _under(path, torch_dir):
        return False
    return not any(_under(path, root) and not any(s in path[len(root):] for s in _SITE)
                   for root in _STDLIB)


@functools.lru_cache(maxsize=4096)
def _is_language_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    return any(_under(path, part) for part in _LANGUAGE)


@functools.lru_cache(maxsize=4096)
def _display_name(filename: str, cwd: str) -> str:
    """``filename`` relative to ``cwd``; lowvm's own files by their package path,
    wherever the caller runs from."""
    if filename.startswith("<"):
        return filename
    path = os.path.abspath(filename)
    return os.path.relpath(path, _LOWVM_PARENT if _under(path, _LOWVM_DIR) else cwd)


def _location(filename: str, lineno: int) -> SourceLoc:
    code = linecache.getline(filename, lineno)
    return SourceLoc(_display_name(filename, os.getcwd()), lineno, code.strip())


def _frames(frame: FrameType | None) -> Iterator[tuple[CodeType, int]]:
    """(code, line) of ``frame`` and of each frame that called it, inner to outer."""
    while frame is not None:
        yield frame.f_code, frame.f_lineno
        frame = frame.f_back


def _first_user(frames: Iterator[tuple[CodeType, int]]) -> SourceLoc | None:
    for code, line in frames:
        if is_user_file(code.co_filename):
            return _location(code.co_filename, line)
    return None


def user_location() -> SourceLoc | None:
    """The innermost stack frame that is the user's (see module doc): the line of the
    call being made now."""
    return _first_user(_frames(sys._getframe(1)))


def _program_frame(frames: Iterator[tuple[CodeType, int]], program: CodeType
                   ) -> tuple[SourceLoc | None, bool]:
    """The innermost user frame among ``frames`` (inner to outer) up to the frame of
    ``program``, else the innermost frame outside the language machinery there; and
    whether ``program``'s frame was reached."""
    library = None
    for code, line in frames:
        if is_user_file(code.co_filename):
            return _location(code.co_filename, line), True
        if library is None and not _is_language_file(code.co_filename):
            library = (code.co_filename, line)
        if code is program:
            return (_location(*library) if library else None), True
    return None, False


def program_location(program: CodeType | None) -> SourceLoc | None:
    """While the function whose code is ``program`` is being traced: the program line
    that made the current ``vm.*`` call (see module doc). Without ``program``, or called
    from outside it, :func:`user_location`."""
    if program is not None:
        found, reached = _program_frame(_frames(sys._getframe(1)), program)
        if reached:
            return found
    return _first_user(_frames(sys._getframe(1)))


def traceback_location(tb: TracebackType | None, program: CodeType | None = None
                       ) -> SourceLoc | None:
    """Where an error raised while ``program`` was traced happened from the program's
    point of view (:func:`program_location`'s rule over the traceback's frames); without
    ``program``, the innermost user frame of the traceback."""
    frames: list[tuple[CodeType, int]] = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    frames.reverse()  # inner to outer
    if program is not None:
        found, reached = _program_frame(iter(frames), program)
        if reached:
            return found
    return _first_user(iter(frames))
