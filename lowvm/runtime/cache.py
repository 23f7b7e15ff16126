"""A disk cache of compiled cubins, so a process start does not recompile every kernel.

Compiling one generated kernel takes from a fraction of a second (NVRTC) to several
seconds (nvcc with a large unrolled body); a model has dozens. The cubin depends only on
the source, the target architecture, the compiler and its version, the options, and the
lowvm version (which decides how sources are generated and what the cubin is used for),
so the SHA-256 of those is the cache key.

Entries are written atomically (a temporary file in the same directory, then
``os.replace``) so concurrent processes never read half a file, and each holds a SHA-256
of its payload so a truncated or corrupted entry is noticed and recompiled rather than
handed to the driver. A cache directory that cannot be written only costs speed: the
cubin is still returned, with a warning.

Location: ``$LOWVM_CACHE_DIR``, else ``$XDG_CACHE_HOME/lowvm``, else ``~/.cache/lowvm``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import lowvm.runtime.compiler as _compiler
from lowvm.version import __version__

__all__ = ["cache_dir", "cache_key", "cached_cubin"]

_DIGEST_BYTES = 32  # sha256 of the payload, stored in front of it
_SUFFIX = ".cubin"


def cache_dir() -> Path:
    """Where cubins are cached (not created until the first write).

    ``$LOWVM_CACHE_DIR`` if set and non-empty, else ``$XDG_CACHE_HOME/lowvm``, else
    ``~/.cache/lowvm``; ``~`` is expanded in each.
    """
    explicit = os.environ.get("LOWVM_CACHE_DIR")
    if explicit:
        return Path(os.path.expanduser(explicit))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = os.path.expanduser(xdg) if xdg else os.path.expanduser(os.path.join("~", ".cache"))
    return Path(base, "lowvm")


def _lowvm_version() -> str:
    return str(__version__)


def cache_key(
    source: str,
    arch: str,
    compiler_name: str,
    compiler_version: str,
    extra_options: Sequence[str] = (),
) -> str:
    """Hex SHA-256 of everything the cubin depends on (plus the lowvm version)."""
    fields = {
        "source": source,
        "arch": arch,
        "compiler": compiler_name,
        "compiler_version": compiler_version,
        "options": list(extra_options),
        "lowvm": _lowvm_version(),
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _read_entry(path: Path) -> bytes | None:
    """The cached cubin at ``path``, or None when missing or corrupt."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, payload = data[:_DIGEST_BYTES], data[_DIGEST_BYTES:]
    if hashlib.sha256(payload).digest() != digest or not payload.startswith(b"\x7fELF"):
        return None
    return payload


def _write_entry(path: Path, cubin: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(hashlib.sha256(cubin).digest())
            f.write(cubin)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def cached_cubin(
    source: str, arch: str, compiler: str = "auto", *, extra_options: Sequence[str] = (),
    timeout_s: float | None = None,
) -> bytes:
    """:func:`~lowvm.runtime.compiler.compile_cubin`, memoised on disk.

    The key resolves ``compiler="auto"`` to the compiler that would actually run, so a
    machine that gains NVRTC gets fresh entries. A corrupt entry is recompiled and
    overwritten; compile errors propagate and are not cached.
    """
    name, version = _compiler.compiler_identity(compiler)
    key = cache_key(source, arch, name, version, extra_options)
    path = cache_dir() / key[:2] / (key + _SUFFIX)
    hit = _read_entry(path)
    if hit is not None:
        return hit
    cubin = _compiler.compile_cubin(source, arch, compiler=name, extra_options=extra_options,
                                    timeout_s=timeout_s)
    try:
        _write_entry(path, cubin)
    except OSError as exc:
        warnings.warn(
            f"cached_cubin: could not write the cache entry {path} ({exc}); set "
            f"LOWVM_CACHE_DIR to a writable directory to keep compiled kernels",
            RuntimeWarning,
            stacklevel=2,
        )
    return cubin
