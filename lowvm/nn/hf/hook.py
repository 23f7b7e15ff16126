"""Register lowvm with transformers when transformers' quantizer registry loads.

``import lowvm`` must make ``from_pretrained`` understand lowvm checkpoints, yet importing
transformers costs seconds. So ``install()`` registers at once if the registry module is
already imported, and otherwise adds a meta-path finder that registers right after
``transformers.quantizers.auto`` is first executed (which every ``from_pretrained`` does).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["install", "register_now"]

_TARGET = "transformers.quantizers.auto"


def register_now() -> None:
    """Import lowvm's quantizer (which registers itself); a failure only warns."""
    importing = sys.modules.get("lowvm.nn.hf.quantizer")
    if importing is not None and not hasattr(importing, "register"):
        return  # its own import pulled transformers' registry in: it registers at its end
    try:
        from lowvm.nn.hf import quantizer

        quantizer.register()
    except Exception as exc:  # noqa: BLE001 - never break the user's transformers import
        warnings.warn(f"lowvm: could not register with transformers ({exc!r}); "
                      "lowvm checkpoints will not load through from_pretrained", stacklevel=2)


class _RegisteringLoader(importlib.abc.Loader):
    """Runs the real loader, then registers lowvm."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        register_now()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... of the real one
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Make sure lowvm is (or will be) registered with transformers."""
    if _TARGET in sys.modules:
        register_now()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
