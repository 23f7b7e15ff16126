"""The text every machine has: the Python standard library's ``.py`` sources, as bytes.

Tokens are bytes (vocabulary 256), so no tokenizer is needed and perplexity is per byte.
Files are read in sorted order; a file is held out when a hash of its path relative to
the library root says so (about 5 %), so the split is the same on every machine with the
same Python and never depends on how many bytes were read. Files are joined with a NUL
byte, which Python sources practically never contain.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from lowvm.evaluation.errors import EvaluationError

__all__ = ["HELDOUT_FRACTION", "SEPARATOR", "Corpus", "stdlib_root", "source_files",
           "is_heldout", "load_corpus", "sequences", "random_batch"]

HELDOUT_FRACTION = 0.05
SEPARATOR = 0
_EXCLUDED_DIRS = ("site-packages", "dist-packages", "__pycache__")


@dataclass(frozen=True)
class Corpus:
    """The two splits as 1-D uint8 tensors, with the files each holds (relative paths)."""

    root: str
    train: torch.Tensor
    heldout: torch.Tensor
    train_files: tuple[str, ...]
    heldout_files: tuple[str, ...]

    def describe(self) -> dict[str, object]:
        """JSON-able sizes of the splits."""
        return {"root": self.root, "train_files": len(self.train_files),
                "heldout_files": len(self.heldout_files), "train_bytes": self.train.numel(),
                "heldout_bytes": self.heldout.numel()}


def stdlib_root() -> Path:
    """The standard library folder of the running Python."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: str | Path | None = None) -> list[str]:
    """Every ``.py`` file under ``root`` (default: the standard library) as sorted POSIX
    paths relative to it, leaving out installed packages and caches."""
    base = Path(root) if root is not None else stdlib_root()
    if not base.is_dir():
        raise EvaluationError(f"corpus root {str(base)!r} is not a folder; accepted: a "
                              "folder holding .py files (default: the standard library)")
    found = []
    for path in base.rglob("*.py"):
        rel = path.relative_to(base)
        if path.is_file() and not any(part in _EXCLUDED_DIRS for part in rel.parts[:-1]):
            found.append(rel.as_posix())
    return sorted(found)


def is_heldout(relpath: str, fraction: float = HELDOUT_FRACTION) -> bool:
    """Whether the file at ``relpath`` belongs to the held-out split: the first 8 bytes of
    its path's SHA-256 as a number in [0, 1) below ``fraction``."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def load_corpus(root: str | Path | None = None, max_bytes: int | None = None,
                fraction: float = HELDOUT_FRACTION) -> Corpus:
    """Read the sources under ``root`` into a training and a held-out split.

    ``max_bytes`` caps the bytes kept: the training split stops at ``(1 - fraction) *
    max_bytes`` and the held-out one at ``fraction * max_bytes`` (a file cut at the cap),
    so both fill in proportion however small the cap. Either split coming out empty is an
    :class:`EvaluationError`.
    """
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes <= 0):
        raise EvaluationError(f"max_bytes={max_bytes!r}: accepted: a positive int or None")
    if not 0 < fraction < 1:
        raise EvaluationError(f"fraction={fraction!r}: accepted: a number in (0, 1)")
    base = Path(root) if root is not None else stdlib_root()
    names = source_files(base)
    caps = ((None, None) if max_bytes is None else
            (max_bytes - int(max_bytes * fraction), int(max_bytes * fraction)))
    parts: tuple[list[bytes], list[bytes]] = ([], [])
    files: tuple[list[str], list[str]] = ([], [])
    sizes = [0, 0]
    for name in names:
        side = int(is_heldout(name, fraction))
        cap = caps[side]
        if cap is not None and sizes[side] >= cap:
            if all(c is not None and s >= c for c, s in zip(caps, sizes)):
                break
            continue
        data = (base / name).read_bytes() + bytes([SEPARATOR])
        if cap is not None:
            data = data[:cap - sizes[side]]
        parts[side].append(data)
        files[side].append(name)
        sizes[side] += len(data)
    for side, label in enumerate(("training", "held-out")):
        if not sizes[side]:
            raise EvaluationError(f"corpus under {str(base)!r} with max_bytes={max_bytes!r} "
                                  f"has an empty {label} split ({len(names)} .py files); "
                                  "accepted: a root and cap that leave both splits bytes")
    train, held = (torch.frombuffer(bytearray(b"".join(p)), dtype=torch.uint8) for p in parts)
    return Corpus(str(base), train, held, tuple(files[0]), tuple(files[1]))


def sequences(tokens: torch.Tensor, seq_len: int, max_sequences: int | None = None
              ) -> torch.Tensor:
    """``tokens`` cut into consecutive, non-overlapping ``[n, seq_len]`` int64 rows (the
    tail that does not fill a row is dropped). With ``max_sequences`` fewer than the rows,
    that many rows evenly spread over them (first and last included) are kept, so a capped
    held-out set still samples every part of the split rather than its first files."""
    if seq_len < 2:
        raise EvaluationError(f"seq_len={seq_len!r}: accepted: an int of at least 2")
    if max_sequences is not None and max_sequences < 1:
        raise EvaluationError(f"max_sequences={max_sequences!r}: accepted: a positive int "
                              "or None")
    n = tokens.numel() // seq_len
    if n == 0:
        raise EvaluationError(f"{tokens.numel()} tokens hold no sequence of seq_len={seq_len}; "
                              "accepted: a shorter seq_len or a larger corpus")
    rows = tokens[:n * seq_len].view(n, seq_len).long()
    if max_sequences is None or max_sequences >= n:
        return rows
    if max_sequences == 1:
        return rows[:1]
    keep = torch.linspace(0, n - 1, max_sequences, dtype=torch.float64).round().long()
    return rows[keep]


def random_batch(tokens: torch.Tensor, seq_len: int, batch_size: int,
                 generator: torch.Generator) -> torch.Tensor:
    """``batch_size`` windows of ``seq_len`` tokens at random offsets (drawn from
    ``generator`` on the CPU, so a seed fixes them on any device), on ``tokens``'s device
    as int64."""
    if tokens.numel() <= seq_len:
        raise EvaluationError(f"{tokens.numel()} tokens are too few for seq_len={seq_len}; "
                              "accepted: a corpus longer than one sequence")
    starts = torch.randint(0, tokens.numel() - seq_len, (batch_size, 1), generator=generator)
    index = starts.to(tokens.device) + torch.arange(seq_len, device=tokens.device)
    return tokens[index].long()
