"""The corpus: sorted sources, a deterministic disjoint split by path hash, the byte cap."""

from __future__ import annotations

import hashlib

import pytest
import torch

from lowvm.evaluation import EvaluationError
from lowvm.evaluation.corpus import (
    HELDOUT_FRACTION,
    SEPARATOR,
    is_heldout,
    load_corpus,
    random_batch,
    sequences,
    source_files,
)


def _tree(root, n=200):
    """``n`` small sources in two folders, plus files the corpus must leave out."""
    for i in range(n):
        folder = root / ("pkg" if i % 2 else "lib")
        folder.mkdir(exist_ok=True)
        (folder / f"m{i:03d}.py").write_bytes(f"# module {i}\nx = {i}\n".encode() * (i % 7 + 1))
    for skipped in ("site-packages/a.py", "dist-packages/b.py", "__pycache__/c.py"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_text("skip me\n")
    (root / "notes.txt").write_text("not python\n")
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("m*.py"))


def test_source_files_are_sorted_and_leave_out_packages_and_caches(tmp_path):
    expected = _tree(tmp_path)
    assert source_files(tmp_path) == expected


def test_heldout_is_the_path_hash_below_the_fraction():
    for name in ("os.py", "json/decoder.py", "test/test_re.py", "a/b/c.py"):
        value = int(hashlib.sha256(name.encode()).hexdigest()[:16], 16) / 2**64
        assert is_heldout(name) == (value < HELDOUT_FRACTION)
        assert is_heldout(name, 0.999999) != (value >= 0.999999)


def test_the_stdlib_split_holds_out_about_five_percent():
    names = source_files()
    held = [n for n in names if is_heldout(n)]
    assert len(names) > 200
    assert 0.02 < len(held) / len(names) < 0.09


def test_split_is_deterministic_disjoint_and_complete(tmp_path):
    names = _tree(tmp_path)
    a, b = load_corpus(tmp_path), load_corpus(tmp_path)
    assert torch.equal(a.train, b.train) and torch.equal(a.heldout, b.heldout)
    assert a.train_files == b.train_files and a.heldout_files == b.heldout_files
    assert not set(a.train_files) & set(a.heldout_files)
    assert sorted(a.train_files + a.heldout_files) == names
    assert list(a.heldout_files) == [n for n in names if is_heldout(n)]
    for tokens, files in ((a.train, a.train_files), (a.heldout, a.heldout_files)):
        expected = b"".join((tmp_path / f).read_bytes() + bytes([SEPARATOR]) for f in files)
        assert tokens.dtype == torch.uint8 and bytes(tokens.tolist()) == expected


def test_the_cap_fills_both_splits_in_proportion(tmp_path):
    _tree(tmp_path)
    corpus = load_corpus(tmp_path, max_bytes=1000)
    assert corpus.heldout.numel() == int(1000 * HELDOUT_FRACTION)
    assert corpus.train.numel() == 1000 - int(1000 * HELDOUT_FRACTION)
    full = load_corpus(tmp_path)
    assert torch.equal(corpus.train, full.train[:corpus.train.numel()])
    assert torch.equal(corpus.heldout, full.heldout[:corpus.heldout.numel()])


def test_a_split_left_empty_is_an_error(tmp_path):
    (tmp_path / "only.py").write_text("x = 1\n")
    with pytest.raises(EvaluationError, match="empty .* split"):
        load_corpus(tmp_path)
    with pytest.raises(EvaluationError, match="max_bytes=0"):
        load_corpus(tmp_path, max_bytes=0)
    with pytest.raises(EvaluationError, match="not a folder"):
        load_corpus(tmp_path / "missing")


def test_the_standard_library_gives_both_splits():
    corpus = load_corpus(max_bytes=100_000)
    assert corpus.train.numel() > 90_000 and corpus.heldout.numel() > 4_000
    assert not set(corpus.train_files) & set(corpus.heldout_files)


def test_sequences_are_consecutive_rows_and_batches_are_windows():
    tokens = torch.arange(100, dtype=torch.uint8)
    every = sequences(tokens, 16)
    assert every.dtype == torch.int64 and every.shape == (6, 16)
    assert every.flatten().tolist() == list(range(96))
    rows = sequences(tokens, 16, max_sequences=4)
    starts = [row[0].item() // 16 for row in rows]
    assert rows.shape == (4, 16) and starts[0] == 0 and starts[-1] == 5
    assert starts == sorted(set(starts)) and all(torch.equal(r, every[i])
                                                 for r, i in zip(rows, starts))
    assert sequences(tokens, 16, max_sequences=1).tolist() == [list(range(16))]
    with pytest.raises(EvaluationError, match="seq_len=1"):
        sequences(tokens, 1)
    with pytest.raises(EvaluationError, match="max_sequences=0"):
        sequences(tokens, 16, max_sequences=0)
    with pytest.raises(EvaluationError, match="no sequence"):
        sequences(tokens, 101)
    a = random_batch(tokens, 10, 5, torch.Generator().manual_seed(3))
    b = random_batch(tokens, 10, 5, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.shape == (5, 10)
    assert all(row.tolist() == list(range(row[0].item(), row[0].item() + 10)) for row in a)
