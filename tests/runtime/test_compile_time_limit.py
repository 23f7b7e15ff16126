"""A compile has a time limit; nvcc's whole process group (cicc, ptxas) ends with it, and
with an interrupt of the caller."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import lowvm.runtime.compiler as compiler
from lowvm.runtime import CompileOptionError, RuntimeCompileError

SOURCE = 'extern "C" __global__ void k() {}\n'


@pytest.fixture
def slow_nvcc(tmp_path, monkeypatch) -> Path:
    """An ``nvcc`` that answers ``--version`` and otherwise starts a child that would run
    for a minute (as nvcc's cicc does on a huge kernel), writing the child's pid."""
    pid_file = tmp_path / "child.pid"
    script = tmp_path / "nvcc"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, V99.0.1"; exit 0; fi\n'
        f"sleep 60 & echo $! > {pid_file}\n"
        "wait\n")
    script.chmod(0o755)
    monkeypatch.setattr(compiler, "find_nvcc", lambda: str(script))
    return pid_file


def _gone(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_nvcc_past_the_limit_is_ended_with_its_children(slow_nvcc):
    start = time.perf_counter()
    with pytest.raises(RuntimeCompileError, match="nvcc did not finish compiling for "
                                                  "arch='sm_80' within 1 s"):
        compiler.compile_cubin(SOURCE, "sm_80", compiler="nvcc", timeout_s=1)
    assert time.perf_counter() - start < 10
    assert _gone(slow_nvcc)


def test_the_limit_comes_from_the_environment(slow_nvcc, monkeypatch):
    monkeypatch.setenv("LOWVM_COMPILE_TIMEOUT", "0.5")
    with pytest.raises(RuntimeCompileError, match="within 0.5 s"):
        compiler.compile_cubin(SOURCE, "sm_80", compiler="nvcc")
    assert _gone(slow_nvcc)


def test_an_interrupted_compile_ends_nvcc_and_its_children(slow_nvcc):
    main = threading.main_thread().ident  # ^C: SIGINT to the thread waiting for nvcc
    timer = threading.Timer(1.0, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    try:
        start = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            compiler.compile_cubin(SOURCE, "sm_80", compiler="nvcc", timeout_s=60)
    finally:
        timer.cancel()
    assert time.perf_counter() - start < 10
    assert _gone(slow_nvcc)


def test_nvrtc_past_the_limit_returns_to_the_caller(monkeypatch):
    monkeypatch.setattr(compiler, "_nvrtc_cubin", lambda *args: time.sleep(5))
    start = time.perf_counter()
    with pytest.raises(RuntimeCompileError, match="NVRTC did not finish .* within 0.2 s"):
        compiler._compile_nvrtc(SOURCE, "sm_80", (), 0.2)
    assert time.perf_counter() - start < 2


def test_nvrtc_errors_reach_the_caller(monkeypatch):
    def fails(*args):
        raise RuntimeCompileError("bad source")

    monkeypatch.setattr(compiler, "_nvrtc_cubin", fails)
    with pytest.raises(RuntimeCompileError, match="bad source"):
        compiler._compile_nvrtc(SOURCE, "sm_80", (), 5)
    monkeypatch.setattr(compiler, "_nvrtc_cubin", lambda *args: b"\x7fELF")
    assert compiler._compile_nvrtc(SOURCE, "sm_80", (), 5) == b"\x7fELF"


@pytest.mark.parametrize("value", ["abc", "0", "-3", "inf"])
def test_a_bad_limit_in_the_environment_is_named(monkeypatch, value):
    monkeypatch.setenv("LOWVM_COMPILE_TIMEOUT", value)
    with pytest.raises(CompileOptionError, match="LOWVM_COMPILE_TIMEOUT must be a number of "
                                                 "seconds > 0"):
        compiler.compile_timeout()


def test_the_limit_argument():
    assert compiler.compile_timeout(2) == 2.0
    assert compiler.compile_timeout() == compiler.DEFAULT_COMPILE_TIMEOUT_S
    with pytest.raises(CompileOptionError, match="timeout_s must be .* got True"):
        compiler.compile_timeout(True)
