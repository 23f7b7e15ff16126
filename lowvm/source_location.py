"""Where, in the user's source, something happened.

Errors carry these :class:`~lowvm.ir.SourceLoc` so that they point at the line the user
wrote, not into the libraries between that line and the error. Three kinds of frames are
never the user's: lowvm's own; those of the libraries a call passes through on its way
into lowvm (:data:`LIBRARIES`: a layer's ``forward`` runs inside ``torch.nn``'s module
call and ``torch.ops.lowvm.*`` custom ops, several torch frames deep, under a
transformers model's ``forward`` and accelerate's hooks); and the standard library's
(``contextlib`` sits between a ``with vm.if_(...)`` line and lowvm). A frame is a
library's by its module name (``torch._library.custom_ops``) or, where the frame has
none, by its file lying inside the library's package folder.

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
from typing import Any

from lowvm.ir import SourceLoc

__all__ = ["user_location", "program_location", "traceback_location", "is_user_file",
           "is_user_frame", "LIBRARIES"]

#: top-level packages whose frames are never the user's: those a call passes through
#: between the user's line and lowvm (torch's module call, custom ops and compile
#: wrappers; Hugging Face models, their hooks and loaders), and the array library
LIBRARIES = frozenset({"torch", "torchvision", "functorch", "triton", "transformers",
                       "accelerate", "huggingface_hub", "safetensors", "peft", "optimum",
                       "numpy"})

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
#: the package folders of the imported LIBRARIES, by the modules they were found from
_roots: tuple[tuple[Any, ...], tuple[str, ...]] = ((), ())


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root if root.endswith(os.sep) else root + os.sep)


def _library_roots() -> tuple[str, ...]:
    """The package folders of the :data:`LIBRARIES` imported so far, as imported and with
    symbolic links resolved (lowvm never imports one for this)."""
    global _roots
    modules = tuple(sys.modules.get(name) for name in _LIBRARY_NAMES)
    if modules != _roots[0]:
        folders: set[str] = set()
        for module in modules:
            for folder in getattr(module, "__path__", None) or ():
                folders.update({os.path.abspath(folder), os.path.realpath(folder)})
        _roots = modules, tuple(sorted(folders))
    return _roots[1]


def is_user_file(filename: str) -> bool:
    """Whether a frame of ``filename`` is the user's: not lowvm, one of the
    :data:`LIBRARIES` or the stdlib."""
    return _is_user_file(filename, _library_roots())


def is_user_frame(code: CodeType, module: str | None) -> bool:
    """Whether a frame running ``code`` in the module named ``module`` (its globals'
    ``__name__``; None where it has none) is the user's (see the module doc)."""
    if module is not None and module.partition(".")[0] in _NOT_USERS:
        return False
    return _is_user_file(code.co_filename, _library_roots())


_NOT_USERS = LIBRARIES | {"lowvm"}
_LIBRARY_NAMES = tuple(sorted(LIBRARIES))


@functools.lru_cache(maxsize=4096)
def _is_user_file(filename: str, libraries: tuple[str, ...]) -> bool:
    # cached: tracing asks for every frame of every instruction, and files are few
    if filename.startswith("<"):  # <stdin>, <string>, notebooks; not <frozen importlib...>
        return not filename.startswith("<frozen ")
    paths = {os.path.abspath(filename), os.path.realpath(filename)}
    if any(_under(path, root) for path in paths for root in (_LOWVM_DIR, *libraries)):
        return False
    path = os.path.abspath(filename)
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


#: (code, line, module name) of one frame
_Frame = tuple[CodeType, int, "str | None"]


def _module_name(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else None


def _frames(frame: FrameType | None) -> Iterator[_Frame]:
    """(code, line, module) of ``frame`` and of each frame that called it, inner to
    outer."""
    while frame is not None:
        yield frame.f_code, frame.f_lineno, _module_name(frame)
        frame = frame.f_back


def _first_user(frames: Iterator[_Frame]) -> SourceLoc | None:
    for code, line, module in frames:
        if is_user_frame(code, module):
            return _location(code.co_filename, line)
    return None


def user_location() -> SourceLoc | None:
    """The innermost stack frame that is the user's (see module doc): the line of the
    call being made now."""
    return _first_user(_frames(sys._getframe(1)))


def _program_frame(frames: Iterator[_Frame], program: CodeType
                   ) -> tuple[SourceLoc | None, bool]:
    """The innermost user frame among ``frames`` (inner to outer) up to the frame of
    ``program``, else the innermost frame outside the language machinery there; and
    whether ``program``'s frame was reached."""
    library = None
    for code, line, module in frames:
        if is_user_frame(code, module):
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
    frames: list[_Frame] = []
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno, _module_name(tb.tb_frame)))
        tb = tb.tb_next
    frames.reverse()  # inner to outer
    if program is not None:
        found, reached = _program_frame(iter(frames), program)
        if reached:
            return found
    return _first_user(iter(frames))
