"""CPU tests of the tuning cache and the autotuner, with fake measure functions."""

from __future__ import annotations

import json

import pytest

from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.tune import (
    H100_SXM,
    Autotuner,
    Problem,
    TuneCache,
    TuneError,
    TuneKey,
    builtin_schedule,
    default_cache_path,
    estimate,
    library_space,
    m_bucket,
    rank,
)
from lowvm.tune import cache as cache_mod

PROBLEM = Problem(1, 4096, 4096, 4, 128)
BUILTIN = builtin_schedule(PROBLEM)


def _ranked(problem=PROBLEM):
    return [s for s, _ in rank(library_space(problem), problem, H100_SXM)]


def _predicted(s):
    """The model's time on PROBLEM (1 ms for a schedule of another problem's format)."""
    t = estimate(s, PROBLEM, H100_SXM).seconds
    return t if t < 1 else 1e-3


class FakeMeasure:
    """Seconds from a formula; remembers every schedule it was asked about."""

    def __init__(self, fn=None):
        self.fn = fn or _predicted
        self.calls: list[GemmSchedule] = []

    def __call__(self, s: GemmSchedule) -> float:
        self.calls.append(s)
        return self.fn(s)


def _tuner(tmp_path, measure, **kw):
    return Autotuner(measure, H100_SXM, cache=TuneCache(tmp_path / "tune.json"),
                     progress=False, **kw)


# -- cache -------------------------------------------------------------------------------

def test_m_buckets_are_powers_of_two_capped():
    assert [m_bucket(m) for m in (1, 2, 3, 4, 5, 16, 17, 4096, 5000, 100000)] == [
        1, 2, 4, 4, 8, 16, 32, 4096, 8192, 8192]
    with pytest.raises(TuneError):
        m_bucket(0)


def test_key_holds_every_part():
    key = TuneKey.for_problem("NVIDIA H100 80GB HBM3", "int4", 128, 28672, 4096, 3)
    assert key.m_bucket == 4
    assert str(key) == "NVIDIA H100 80GB HBM3|int4|g128|n28672|k4096|m4"


def test_cache_location_env_var_then_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("LOWVM_TUNE_CACHE", str(tmp_path / "x.json"))
    assert default_cache_path() == tmp_path / "x.json"
    assert TuneCache().path == tmp_path / "x.json"
    monkeypatch.delenv("LOWVM_TUNE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_path() == tmp_path / "xdg" / "lowvm" / "tune.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_path() == tmp_path / "home" / ".cache" / "lowvm" / "tune.json"


def test_cache_put_get_and_keep_other_writers_entries(tmp_path):
    path = tmp_path / "sub" / "tune.json"
    a, b = TuneCache(path), TuneCache(path)   # two processes sharing one file
    k1 = TuneKey("gpu", "int4", 128, 64, 64, 1)
    k2 = TuneKey("gpu", "int4", 128, 64, 64, 2)
    assert a.get(k1) is None
    a.put(k1, {"seconds": 1.0})
    b.put(k2, {"seconds": 2.0})
    assert a.get(k1) == {"seconds": 1.0} and a.get(k2) == {"seconds": 2.0}
    assert json.loads(path.read_text())["version"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["tune.json"]


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    cache = TuneCache(tmp_path / "tune.json")
    key = TuneKey("gpu", "int4", 128, 64, 64, 1)
    cache.put(key, {"seconds": 1.0})
    before = (tmp_path / "tune.json").read_text()

    def broken_dump(obj, f, **kw):
        f.write('{"version": 1, "entr')
        raise OSError("disk full")

    monkeypatch.setattr(cache_mod.json, "dump", broken_dump)
    with pytest.raises(OSError, match="disk full"):
        cache.put(TuneKey("gpu", "int4", 128, 64, 64, 2), {"seconds": 2.0})
    assert (tmp_path / "tune.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tune.json"]


@pytest.mark.parametrize("text", ["{", "[]", '{"version": 1}'])
def test_a_foreign_or_corrupt_cache_is_an_error_naming_the_file(tmp_path, text):
    (tmp_path / "tune.json").write_text(text)
    cache = TuneCache(tmp_path / "tune.json")
    with pytest.raises(TuneError, match="tune.json"):
        cache.get(TuneKey("gpu", "int4", 128, 64, 64, 1))
    with pytest.raises(TuneError):
        cache.put(TuneKey("gpu", "int4", 128, 64, 64, 1), {})
    assert (tmp_path / "tune.json").read_text() == text   # the user's file is untouched


# -- tuner -------------------------------------------------------------------------------

def test_the_model_prunes_the_space_to_top_k_and_the_builtin_choice_is_measured(tmp_path):
    fake = FakeMeasure()
    result = _tuner(tmp_path, fake, top_k=5).tune(PROBLEM, "int4")
    ranked = _ranked()
    assert BUILTIN not in ranked[:5]                 # the model puts it lower here ...
    assert fake.calls == ranked[:5] + [BUILTIN]      # ... yet it is measured, last
    assert result.measured == 6 and result.space_size == len(ranked) > 100
    assert result.builtin == BUILTIN and result.builtin_rank_in_model > 5
    assert result.schedule in ranked[:5] + [BUILTIN] and not result.from_cache
    assert result.seconds == min(fake.fn(s) for s in fake.calls)


def test_the_builtin_choice_is_measured_even_when_the_model_ranks_it_last(tmp_path):
    space = library_space(PROBLEM)
    for top_k in (1, 3):
        fake = FakeMeasure(lambda s: 1e-6 if s == BUILTIN else 2e-6)
        result = _tuner(tmp_path, fake, top_k=top_k).tune(PROBLEM, "int4", force=True)
        assert len(fake.calls) == top_k + 1 and fake.calls[-1] == BUILTIN
        assert result.schedule == BUILTIN and result.is_builtin
        assert result.gain_over_builtin == 0 and "the built-in choice" in result.summary()
    # a given space with an explicit built-in choice outside it
    given = [GemmSchedule(split=2, stages=3)]
    fake = FakeMeasure(lambda s: 3e-6)
    result = _tuner(tmp_path, fake, top_k=1).tune(PROBLEM, "int4", space=given,
                                                  builtin=space[0], force=True)
    assert fake.calls == [given[0], space[0]] and result.is_builtin


def test_a_winner_reports_how_much_it_beat_the_builtin_choice(tmp_path):
    favourite = _ranked()[3]
    fake = FakeMeasure(lambda s: 1e-6 if s == favourite else 5e-6)
    result = _tuner(tmp_path, fake, top_k=8).tune(PROBLEM, "int4")
    assert result.schedule == favourite and result.seconds == 1e-6
    assert not result.is_builtin and result.builtin_seconds == 5e-6
    assert result.gain_over_builtin == pytest.approx(4.0)
    assert result.model_pick == _ranked()[0] and result.model_pick_seconds == 5e-6
    assert "400.0% faster than the built-in choice" in result.summary()
    cached = _tuner(tmp_path, fake, top_k=8).tune(PROBLEM, "int4")
    assert cached.from_cache and cached.builtin == BUILTIN
    assert cached.gain_over_builtin == pytest.approx(4.0)


def test_a_gain_within_noise_keeps_the_builtin_choice(tmp_path):
    other = _ranked()[0]
    fake = FakeMeasure(lambda s: 0.995e-5 if s == other else 1e-5)   # 0.5 % faster
    result = _tuner(tmp_path, fake, top_k=2).tune(PROBLEM, "int4")
    assert result.schedule == BUILTIN and result.seconds == 1e-5
    strict = _tuner(tmp_path, fake, top_k=2, min_gain=0.0).tune(PROBLEM, "int4", force=True)
    assert strict.schedule == other
    with pytest.raises(TuneError, match="min_gain=1.5"):
        _tuner(tmp_path, fake, min_gain=1.5)


def test_cache_hit_measures_nothing_and_bucket_neighbours_share(tmp_path):
    fake = FakeMeasure()
    tuner = _tuner(tmp_path, fake, top_k=3)
    first = tuner.tune(Problem(3, 4096, 4096, 4, 128), "int4")
    calls = len(fake.calls)
    assert not first.from_cache and calls in (3, 4)
    again = tuner.tune(Problem(4, 4096, 4096, 4, 128), "int4")     # same bucket (4)
    assert again.from_cache and again.schedule == first.schedule and len(fake.calls) == calls
    assert again.seconds == first.seconds


@pytest.mark.parametrize("change", [
    dict(problem=Problem(5, 4096, 4096, 4, 128)),      # bucket 8
    dict(problem=Problem(3, 8192, 4096, 4, 128)),      # N
    dict(problem=Problem(3, 4096, 8192, 4, 128)),      # K
    dict(problem=Problem(3, 4096, 4096, 4, 64)),       # group
    dict(dtype="int3"),                                 # dtype
    dict(gpu="NVIDIA H200"),                            # GPU
])
def test_each_part_of_the_key_separates_entries(tmp_path, change):
    fake = FakeMeasure()
    _tuner(tmp_path, fake, top_k=2).tune(Problem(3, 4096, 4096, 4, 128), "int4")
    calls = len(fake.calls)
    gpu = H100_SXM.with_(name=change.get("gpu", H100_SXM.name))
    other = Autotuner(fake, gpu, cache=TuneCache(tmp_path / "tune.json"), top_k=2,
                      progress=False)
    result = other.tune(change.get("problem", Problem(3, 4096, 4096, 4, 128)),
                        change.get("dtype", "int4"))
    assert not result.from_cache and len(fake.calls) > calls


def test_force_retunes_and_overwrites(tmp_path):
    fake = FakeMeasure()
    tuner = _tuner(tmp_path, fake, top_k=2)
    tuner.tune(PROBLEM, "int4")
    calls = len(fake.calls)
    forced = tuner.tune(PROBLEM, "int4", force=True)
    assert not forced.from_cache and len(fake.calls) == 2 * calls


def test_exhaustive_mode_reports_how_close_the_model_came(tmp_path):
    space = library_space(PROBLEM)[:60]
    ranked = [s for s, _ in rank(space, PROBLEM, H100_SXM)]
    truth = {s: 10e-6 + i * 1e-7 for i, s in enumerate(reversed(ranked))}  # model is backwards
    fake = FakeMeasure(lambda s: truth[s])
    result = _tuner(tmp_path, fake, top_k=4).tune(PROBLEM, "int4", space=space,
                                                  exhaustive=True)
    assert result.exhaustive and result.measured == len(ranked) == len(fake.calls)
    assert result.schedule == ranked[-1] and result.seconds == 10e-6
    assert result.best_rank_in_model == len(ranked)
    assert result.model_pick == ranked[0]
    assert result.model_gap == pytest.approx(truth[ranked[0]] / 10e-6 - 1)
    assert result.topk_gap == pytest.approx(min(truth[s] for s in ranked[:4]) / 10e-6 - 1)
    assert "slower than the best" in result.summary()


def test_exhaustive_mode_with_a_faithful_model_has_no_gap(tmp_path):
    space = library_space(PROBLEM)[:80]
    result = _tuner(tmp_path, FakeMeasure(), top_k=4).tune(PROBLEM, "int4", space=space,
                                                           exhaustive=True)
    assert result.model_gap == 0 and result.topk_gap == 0 and result.best_rank_in_model == 1


def test_failing_candidates_are_recorded_and_skipped(tmp_path):
    ranked = _ranked()

    def measure(s):
        if s == ranked[0]:
            raise RuntimeError("ptxas: too many registers")
        return 2e-6 if s == ranked[1] else float("nan")

    result = _tuner(tmp_path, FakeMeasure(measure), top_k=3).tune(PROBLEM, "int4")
    assert result.schedule == ranked[1]
    assert "ptxas" in result.failures[str(ranked[0])]
    assert "nan" in result.failures[str(ranked[2])]
    assert "nan" in result.failures[str(BUILTIN)]
    assert result.gain_over_builtin == float("inf")


def test_all_failing_is_an_error_and_caches_nothing(tmp_path):
    def measure(s):
        raise RuntimeError("no")

    with pytest.raises(TuneError, match="every measured schedule failed"):
        _tuner(tmp_path, measure, top_k=2).tune(PROBLEM, "int4")
    assert not (tmp_path / "tune.json").exists()


def test_no_fitting_schedule_and_bad_top_k(tmp_path):
    with pytest.raises(TuneError, match="no schedule"):
        _tuner(tmp_path, FakeMeasure()).tune(
            PROBLEM, "int4", space=[GemmSchedule(split=4096)])
    with pytest.raises(TuneError, match="top_k"):
        Autotuner(FakeMeasure(), H100_SXM, top_k=0)


def test_progress_bar_runs(tmp_path, capsys):
    pytest.importorskip("tqdm")
    fake = FakeMeasure()
    tuner = Autotuner(fake, H100_SXM, cache=TuneCache(tmp_path / "t.json"), top_k=3,
                      progress=True)
    assert tuner.tune(PROBLEM, "int4").measured == 4
    assert "tuning" in capsys.readouterr().err


def test_progress_without_tqdm_prints_lines(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tqdm", None)         # import tqdm fails
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    tuner = Autotuner(FakeMeasure(), H100_SXM, cache=TuneCache(tmp_path / "t.json"),
                      top_k=2, progress=True)
    tuner.tune(PROBLEM, "int4")
    err = capsys.readouterr().err
    assert "tuning " in err and ": 1/3" in err and ": 3/3" in err


# -- the cache round trip of library schedules ---------------------------------------------

def _weight(n=256, k=1024, g=128):
    import numpy as np

    from lowvm.kernels.library import prepare_weight, quantize_to_codes

    pytest.importorskip("torch")
    codes, scales = quantize_to_codes(np.random.default_rng(3).standard_normal((n, k)),
                                      "int4", g)
    return prepare_weight(codes, scales, "int4", g, device="cpu")


@pytest.mark.parametrize("m, pick", [
    (1, dict(split=4, prefetch=2, x_whole=256, x_rows=1)),
    (8, dict(split=2, prefetch=4, x_whole=512)),
    (32, dict(bm=64, warps_m=2, k_slice=16, split=2, prefetch=2, stages=2,
              fused_split=False)),
    (1, dict(bn=32, warps_n=2, split=4, stages=2, prefetch=1)),
])
def test_a_tuned_schedule_round_trips_through_the_cache_into_the_library(tmp_path,
                                                                         monkeypatch, m,
                                                                         pick):
    """Every field comes back: the tuner's cache hit and quant_linear's tuned_schedule
    rebuild the very GemmSchedule that was measured."""
    from lowvm.tune import lookup

    qw = _weight()
    problem = Problem(m, qw.n, qw.k, 4, qw.group)
    winner = GemmSchedule(**{**dict(bk=128, fused_split=m <= 16), **pick})
    assert winner in library_space(problem)
    fake = FakeMeasure(lambda s: 1e-6 if s == winner else 9e-6)
    cache = TuneCache(tmp_path / "tune.json")
    gpu = H100_SXM.with_(name="Test GPU")
    tuner = Autotuner(fake, gpu, cache=cache, top_k=len(library_space(problem)),
                      progress=False)
    assert tuner.tune(problem, "int4").schedule == winner
    entry = next(iter(json.loads((tmp_path / "tune.json").read_text())["entries"].values()))
    assert entry["schedule_type"] == "GemmSchedule"
    assert set(entry["schedule"]) == {f for f in GemmSchedule.__dataclass_fields__}
    assert entry["is_builtin"] is False and entry["builtin_seconds"] == 9e-6
    hit = tuner.tune(problem, "int4")
    assert hit.from_cache and hit.schedule == winner
    monkeypatch.setattr(lookup, "_device_name", lambda device: "Test GPU")
    assert lookup.tuned_schedule(m, qw, cache) == winner
    # the same entry at a K it cannot split is ignored rather than raised on
    assert lookup.tuned_schedule(m, _weight(k=512), cache) is None


def test_entries_of_the_first_format_still_load_with_one_warning(tmp_path, monkeypatch):
    from lowvm.tune import lookup

    qw = _weight()
    monkeypatch.setattr(cache_mod, "_LEGACY_WARNED", set())
    monkeypatch.setattr(lookup, "_device_name", lambda device: "Test GPU")
    cache = TuneCache(tmp_path / "tune.json")
    old = {"bm": 16, "bn": 64, "bk": 128, "warps_m": 1, "warps_n": 4, "stages": 3,
           "split_k": 2}
    key = TuneKey.for_problem("Test GPU", "int4", 128, 256, 1024, 1)
    cache.put(key, {"schedule": old, "seconds": 1e-5})   # what the first format wrote
    with pytest.warns(UserWarning, match="first format"):
        s = lookup.tuned_schedule(1, qw, cache)
    assert s == GemmSchedule(split=2, stages=3, prefetch=1, fused_split=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # once per process
        assert lookup.tuned_schedule(1, qw, cache) == s
    hit = Autotuner(FakeMeasure(), H100_SXM.with_(name="Test GPU"), cache=cache,
                    progress=False).tune(Problem(1, 256, 1024, 4, 128), "int4")
    assert hit.from_cache and hit.schedule == s and hit.builtin is None


@pytest.mark.parametrize("old", [
    {"bm": 16, "bn": 64, "bk": 128, "warps_m": 1},              # no warps_n
    {"bm": 16, "bn": 64, "bk": 128, "warps_m": 1, "warps_n": 4, "swizzle": 1},
    {"bm": 16, "bn": 64, "bk": 128, "warps_m": 1, "warps_n": 0},
])
def test_malformed_entries_of_the_first_format_name_what_is_accepted(tmp_path, old):
    cache = TuneCache(tmp_path / "tune.json")
    cache.put(TuneKey.for_problem("Test GPU", "int4", 128, 256, 1024, 1),
              {"schedule": old, "seconds": 1e-5})
    with pytest.raises(TuneError, match="first format.*warps_n.*split_k"):
        Autotuner(FakeMeasure(), H100_SXM.with_(name="Test GPU"), cache=cache,
                  progress=False).tune(Problem(1, 256, 1024, 4, 128), "int4")


@pytest.mark.parametrize("schedule, needle", [
    ({"bm": 16, "x_whole": "512"}, "x_whole='512'"),
    ({"bm": 16, "swizzle": 1}, "unknown fields"),
    ({"bm": 16, "stages": 2.5}, "stages=2.5"),
    ({"bm": 16, "swap_ab": True}, "swap_ab=True"),                # fields no kernel runs
])
def test_malformed_entries_are_errors_for_the_tuner_and_ignored_by_the_library(
        tmp_path, monkeypatch, schedule, needle):
    from lowvm.runtime import workspaces
    from lowvm.tune import lookup

    qw = _weight()
    monkeypatch.setattr(lookup, "_device_name", lambda device: "Test GPU")
    monkeypatch.setattr(workspaces, "_WARNED", set())
    cache = TuneCache(tmp_path / "tune.json")
    key = TuneKey.for_problem("Test GPU", "int4", 128, 256, 1024, 1)
    cache.put(key, {"schedule_type": "GemmSchedule", "schedule": schedule, "seconds": 1e-5})
    with pytest.raises(TuneError, match=needle):
        Autotuner(FakeMeasure(), H100_SXM.with_(name="Test GPU"), cache=cache,
                  progress=False).tune(Problem(1, 256, 1024, 4, 128), "int4")
    with pytest.warns(UserWarning, match=needle):
        assert lookup.tuned_schedule(1, qw, cache) is None
