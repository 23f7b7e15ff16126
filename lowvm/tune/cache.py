"""The tuning cache: the best schedule per (GPU, dtype, group, N, K, M bucket), on disk.

Tuning costs GPU minutes, so its answers persist across processes in one JSON file:
``$LOWVM_TUNE_CACHE`` if set, else ``$XDG_CACHE_HOME/lowvm/tune.json`` (default
``~/.cache/lowvm/tune.json``). M is bucketed to the next power of two (capped at 8192)
because the best schedule changes with M's magnitude, not its exact value. Writes go
to a temporary file in the same folder and are renamed over the old one, so readers
never see half a file; each write re-reads the file first so entries another process
added meanwhile are kept.

An entry's ``schedule`` holds every field of the
:class:`~lowvm.kernels.gemm_schedule.GemmSchedule` and ``schedule_type`` names it, so a
cached pick is rebuilt exactly, ``x_whole``, ``x_rows``, ``prefetch`` and ``k_slice``
included. Entries of the first format (no ``schedule_type``: seven tile constants) still
load, mapped to a ``GemmSchedule`` with a one-time warning to re-tune (they cannot hold
what makes the decode schedules fast).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowvm.errors import LowvmError
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.tune.errors import TuneError

__all__ = ["ENV_VAR", "MAX_BUCKET", "TuneKey", "m_bucket", "default_cache_path", "TuneCache",
           "schedule_to_json", "schedule_from_entry"]

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


_BOOL_FIELDS = {"weights_shared", "fused_split", "swap_ab", "wgmma"}


def schedule_to_json(s: GemmSchedule) -> dict[str, Any]:
    """``{"schedule_type": ..., "schedule": every field}`` for a cache entry (all fields,
    defaults too: the entry must not change meaning if a default changes)."""
    if isinstance(s, GemmSchedule):
        return {"schedule_type": "GemmSchedule", "schedule": dataclasses.asdict(s)}
    raise TuneError(f"schedule={s!r}: the cache stores a GemmSchedule")


def _gemm_schedule(fields: Any) -> GemmSchedule:
    """A GemmSchedule from stored fields, each checked for its type (JSON has no
    tuples and a hand-edited file may hold anything); missing fields take the defaults."""
    if not isinstance(fields, dict):
        raise TuneError(f"cached GemmSchedule {fields!r} is not a JSON object")
    names = {f.name for f in dataclasses.fields(GemmSchedule)}
    unknown = set(fields) - names
    if unknown:
        raise TuneError(f"cached GemmSchedule has unknown fields {sorted(unknown)} (written "
                        f"by a newer lowvm?); accepted: {sorted(names)}")
    for name, value in fields.items():
        ok = (isinstance(value, bool) if name in _BOOL_FIELDS
              else (value is None or _is_int(value)) if name == "stages"
              else _is_int(value))
        if not ok:
            raise TuneError(f"cached GemmSchedule field {name}={value!r}: expected "
                            f"{'true/false' if name in _BOOL_FIELDS else 'an integer'}"
                            f"{' or null' if name == 'stages' else ''}")
    return GemmSchedule(**fields)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: the constants of an entry of the first format, and their defaults
_FIRST_FORMAT = {"bm": None, "bn": None, "bk": None, "warps_m": None, "warps_n": None,
                 "stages": 2, "split_k": 1}
_LEGACY_WARNED: set[str] = set()


def _first_format_schedule(constants: Any, m: int) -> GemmSchedule:
    """The ``GemmSchedule`` an entry of the first format stands for at batch ``m``: the
    mapping the library made then (``split_k`` -> ``split``, ``stages`` <= 1 -> None,
    prefetch 1, split sums fused at M <= 16), warned about once per process: such an
    entry has no ``x_whole``/``prefetch``/``k_slice`` and so is slower than the built-in
    choice at decode; re-tuning replaces it."""
    required = [name for name, default in _FIRST_FORMAT.items() if default is None]
    if (not isinstance(constants, dict) or set(constants) - set(_FIRST_FORMAT)
            or set(required) - set(constants)
            or not all(_is_int(v) and v >= 1 for v in constants.values())):
        raise TuneError(f"cached schedule {constants!r} (first format): accepted positive "
                        f"integers {', '.join(_FIRST_FORMAT)} ({', '.join(required)} "
                        "required)")
    c = {**_FIRST_FORMAT, **constants}
    if "legacy" not in _LEGACY_WARNED:
        _LEGACY_WARNED.add("legacy")
        warnings.warn("lowvm: the tuning cache holds entries of the first format (no "
                      "x_whole, x_rows, prefetch or k_slice); they are used as before, but "
                      "re-tune (Autotuner.tune(..., force=True)) to search the library's "
                      "schedules", stacklevel=4)
    return GemmSchedule(bm=c["bm"], bn=c["bn"], bk=c["bk"], warps_m=c["warps_m"],
                        warps_n=c["warps_n"], split=c["split_k"],
                        stages=c["stages"] if c["stages"] > 1 else None, prefetch=1,
                        fused_split=m <= 16)


def schedule_from_entry(entry: dict[str, Any], m: int) -> GemmSchedule:
    """The ``GemmSchedule`` of a cache entry used at batch ``m``: every field as stored,
    or for an entry of the first format (no ``schedule_type``) its mapping."""
    if not isinstance(entry, dict) or "schedule" not in entry:
        raise TuneError(f"cache entry {entry!r} has no 'schedule'")
    kind = entry.get("schedule_type")
    if kind not in (None, "GemmSchedule"):
        raise TuneError(f"cache entry schedule_type={kind!r}: accepted GemmSchedule (or "
                        "none, the first format)")
    try:
        if kind is None:
            return _first_format_schedule(entry["schedule"], m)
        return _gemm_schedule(entry["schedule"])
    except TuneError:
        raise
    except LowvmError as exc:  # a combination of fields GemmSchedule refuses
        raise TuneError(f"cached schedule {entry['schedule']!r}: {exc}") from None
