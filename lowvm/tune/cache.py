"""The tuning cache: the best schedule per (GPU, dtype, group, N, K, M bucket), on disk.

Tuning costs GPU minutes, so its answers persist across processes in one JSON file:
``$LOWVM_TUNE_CACHE`` if set, else ``$XDG_CACHE_HOME/lowvm/tune.json`` (default
``~/.cache/lowvm/tune.json``). M is bucketed to the next power of two (capped at 8192)
because the best schedule changes with M's magnitude, not its exact value. Writes go
to a temporary file in the same folder and are renamed over the old one, so readers
never see half a file; each write re-reads the file first so entries another process
added meanwhile are kept.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowvm.tune.errors import TuneError

__all__ = ["ENV_VAR", "MAX_BUCKET", "TuneKey", "m_bucket", "default_cache_path", "TuneCache"]

ENV_VAR = "LOWVM_TUNE_CACHE"
MAX_BUCKET = 8192
_VERSION = 1


def m_bucket(m: int) -> int:
    """The next power of two >= ``m``, at most :data:`MAX_BUCKET`."""
    if not isinstance(m, int) or m < 1:
        raise TuneError(f"m={m!r}: the token count must be a positive integer")
    return min(1 << (m - 1).bit_length(), MAX_BUCKET)


@dataclass(frozen=True)
class TuneKey:
    """What a tuned schedule is valid for."""

    gpu: str
    dtype: str
    group: int
    n: int
    k: int
    m_bucket: int

    @classmethod
    def for_problem(cls, gpu: str, dtype: str, group: int, n: int, k: int, m: int
                    ) -> TuneKey:
        return cls(gpu, dtype, group, n, k, m_bucket(m))

    def __str__(self) -> str:
        return (f"{self.gpu}|{self.dtype}|g{self.group}|n{self.n}|k{self.k}"
                f"|m{self.m_bucket}")


def default_cache_path() -> Path:
    """``$LOWVM_TUNE_CACHE``, else the user cache folder's ``lowvm/tune.json``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lowvm" / "tune.json"


class TuneCache:
    """A JSON file of ``{str(key): entry}``; entries are plain JSON objects."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TuneError(f"tuning cache {str(self.path)!r} cannot be read ({exc}); "
                            f"delete it or point {ENV_VAR} elsewhere") from None
        if not (isinstance(doc, dict) and isinstance(doc.get("entries"), dict)):
            raise TuneError(f"tuning cache {str(self.path)!r} is not a lowvm tuning cache "
                            f"(no 'entries' object); delete it or point {ENV_VAR} elsewhere")
        return doc["entries"]

    def entries(self) -> dict[str, Any]:
        """Every entry, by key string."""
        return dict(self._read())

    def get(self, key: TuneKey) -> dict[str, Any] | None:
        """The entry for ``key``, or ``None``."""
        return self._read().get(str(key))

    def put(self, key: TuneKey, entry: dict[str, Any]) -> None:
        """Store ``entry`` under ``key`` (atomic replace of the whole file)."""
        entries = self._read()
        entries[str(key)] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name + ".",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"version": _VERSION, "entries": entries}, f, indent=1,
                          sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
