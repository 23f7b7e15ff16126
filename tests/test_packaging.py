"""pyproject declares every third-party module lowvm imports, in the extra that needs it.

The imports are read with ``ast`` (function-local ones included), so an undeclared
dependency fails here rather than on a user's machine. The core (``import lowvm``, the
interpreter, CUDA generation) is run in a subprocess where every optional module is
made unimportable, and the errors of a missing extra are checked to name the pip command.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from lowvm.extras import CUDA_HINT, EXTRAS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {"lowvm", "tests", "serving_examples"}
STDLIB = set(sys.stdlib_module_names) | {"tomllib"}  # tomllib: 3.11 on, imported guarded

#: import name -> distribution, where the two differ (a dotted key: a namespace package)
DISTRIBUTION = {
    "cuda.bindings": "cuda-bindings",
    "cuda.pathfinder": "cuda-pathfinder",
    "pynvml": "nvidia-ml-py",
    "ml_dtypes": "ml-dtypes",
    "nvidia": "nvidia-cuda-nvdisasm",  # the test suite looks for the nvdisasm binary in it
}

#: imported but deliberately not declared, with the reason
UNDECLARED = {
    "gemlite": "a baseline the benchmark measures where it is installed (it pins its own "
               "torch and triton); lowvm.bench reports it as unavailable otherwise",
}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _declared(extra: str | None) -> dict[str, Requirement]:
    """Distribution -> requirement of ``dependencies`` plus ``extra``, self-references
    (``lowvm[torch]``) followed."""
    project = _pyproject()["project"]
    found: dict[str, Requirement] = {}
    todo = [None] + ([extra] if extra else [])
    seen: set[str | None] = set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        lines = (project["dependencies"] if current is None
                 else project["optional-dependencies"][current])
        for line in lines:
            req = Requirement(line)
            if _normalize(req.name) == "lowvm":
                todo.extend(req.extras)
            else:
                found[_normalize(req.name)] = req
    return found


@functools.cache
def imported_modules(root: Path) -> dict[str, set[str]]:
    """Third-party import names under ``root`` (``cuda.bindings`` for namespace
    packages) -> the files importing them; the standard library and lowvm left out."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in STDLIB or top in LOCAL:
                    continue
                key = ".".join(name.split(".")[:2]) if top == "cuda" else top
                found.setdefault(key, set()).add(str(path.relative_to(root)))
    return found


def _distribution(module: str) -> str:
    return _normalize(DISTRIBUTION.get(module, module))


def test_scanner_sees_function_local_and_namespace_imports(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        import os, numpy as np
        from . import sibling
        def f():
            from cuda.bindings import nvrtc
            import yaml.loader
    """))
    found = imported_modules(tmp_path)
    assert set(found) == {"numpy", "cuda.bindings", "yaml"}


def test_every_import_under_lowvm_is_declared() -> None:
    everything = _declared(None)
    for extra in _pyproject()["project"]["optional-dependencies"]:
        everything.update(_declared(extra))
    missing = {m: sorted(files) for m, files in imported_modules(ROOT / "lowvm").items()
               if _distribution(m) not in everything and m not in UNDECLARED}
    assert not missing, f"imported under lowvm/ but declared nowhere in pyproject: {missing}"


def test_the_core_depends_on_numpy_only() -> None:
    assert set(_declared(None)) == {"numpy"}


def test_lowvm_extras_table_matches_pyproject() -> None:
    """lowvm.extras names the extra in its error messages: it must be the one declaring
    the distribution, and every optional module lowvm imports must be in the table."""
    for module, (dist, extra) in EXTRAS.items():
        assert _normalize(dist) in _declared(extra), (module, dist, extra)
    optional = set(imported_modules(ROOT / "lowvm")) - {"numpy"} - set(UNDECLARED)
    assert optional <= set(EXTRAS), optional - set(EXTRAS)


def test_test_extra_covers_the_test_suite_and_examples() -> None:
    """README's set-up installs '.[test]': it must bring everything the tests import."""
    declared = _declared("test")
    for folder in ("tests", "serving_examples"):
        missing = {m for m in imported_modules(ROOT / folder)
                   if _distribution(m) not in declared}
        assert not missing, f"{folder}/ imports {sorted(missing)}, not in lowvm[test]"


@pytest.mark.parametrize("major", [12, 13])
def test_cuda_extras_hold_one_major_with_nvrtc_and_its_headers(major: int) -> None:
    """cuda-bindings, NVRTC and the runtime headers NVRTC compiles against, all of one
    CUDA major (cuda-bindings 13 needs a driver >= 580: mixing majors fails at run time)."""
    suffix = "-cu12" if major == 12 else ""
    reqs = _declared(f"cuda{major}")
    for name in ("cuda-bindings", f"nvidia-cuda-nvrtc{suffix}",
                 f"nvidia-cuda-runtime{suffix}", "cuda-pathfinder", "torch"):
        assert name in reqs, (major, name)
    for name in ("cuda-bindings", f"nvidia-cuda-nvrtc{suffix}", f"nvidia-cuda-runtime{suffix}"):
        spec = reqs[name].specifier
        assert spec.contains(f"{major}.0") or spec.contains(f"{major}.8"), (name, spec)
        assert not spec.contains(f"{major + 1}.0") and not spec.contains(f"{major - 1}.9")


def _run_without(blocked: list[str], code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where importing any of ``blocked`` fails as if
    the package were not installed."""
    prelude = textwrap.dedent(f"""
        import importlib.abc, sys
        BLOCKED = {blocked!r}
        class _Absent(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, _Absent())
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


OPTIONAL = sorted({m.split(".")[0] for m in EXTRAS} | set(UNDECLARED))


@pytest.mark.slow
def test_interpret_and_generate_cuda_with_numpy_only() -> None:
    proc = _run_without(OPTIONAL, """
        import numpy as np
        import lowvm
        from lowvm.kernels.vector_add import vector_add as add

        a, b = np.random.default_rng(0).random((2, 300), dtype=np.float32)
        c = np.zeros(300, np.float32)
        lowvm.interpret(add, 300, a, b, c)
        assert np.array_equal(c, a + b)
        source = lowvm.generate_cuda(add.build()).source
        assert '__global__' in source
        print(sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow
def test_missing_torch_names_the_extra() -> None:
    proc = _run_without(["torch"], """
        import lowvm
        from lowvm.extras import MissingDependencyError
        for attempt in (lambda: lowvm.QuantLinear, lambda: __import__("lowvm.runtime"),
                        lambda: __import__("lowvm.serving")):
            try:
                attempt()
            except MissingDependencyError as exc:
                assert isinstance(exc, lowvm.LowvmError) and isinstance(exc, ImportError)
                print(exc)
            else:
                raise SystemExit("no error")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3
    assert "lowvm.nn.QuantLinear needs the Python package 'torch'" in lines[0]
    assert lines[0].endswith("pip install 'lowvm[torch]'")
    assert lines[1].startswith("lowvm.runtime") and "'lowvm[torch]'" in lines[1]
    assert lines[2].startswith("lowvm.serving") and lines[2].endswith("'lowvm[hf]'")


@pytest.mark.slow
def test_missing_cuda_bindings_fails_at_the_first_driver_call() -> None:
    """The runtime (and so the layers on the CPU) imports without cuda-bindings; the first
    CUDA driver call says which extra brings it."""
    proc = _run_without(["cuda"], """
        import lowvm.runtime.driver as drv
        from lowvm.extras import MissingDependencyError
        assert drv.error_name(7) == "7"  # no driver: the plain code
        try:
            drv.cu.cuInit(0)
        except MissingDependencyError as exc:
            print(exc)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    message = proc.stdout.strip()
    assert "cuda.bindings.driver.cuInit" in message and "'cuda-bindings'" in message
    assert message.endswith(CUDA_HINT)


def _installed_cuda_extra() -> str | None:
    """``cuda12`` or ``cuda13`` where every package of that extra is installed at a
    version it allows (torch's CUDA builds bring NVRTC without the bindings), else None."""
    from importlib.metadata import PackageNotFoundError, version

    for extra in ("cuda13", "cuda12"):
        wanted = {n: r for n, r in _declared(extra).items() if n not in _declared("torch")}
        try:
            if all(r.specifier.contains(version(n), prereleases=True) for n, r in wanted.items()):
                return extra
        except PackageNotFoundError:
            continue
    return None


@pytest.mark.slow
@pytest.mark.skipif(_installed_cuda_extra() is None,
                    reason="no cuda extra here (pip install 'lowvm[cuda13]' or 'lowvm[cuda12]')")
def test_cuda_extra_compiles_the_library_without_a_toolkit(monkeypatch) -> None:
    """What a cuda extra installs (cuda-bindings, the NVRTC wheel, the runtime headers
    wheel) compiles the kernels on its own: the CUDA toolkit is hidden."""
    import lowvm
    from lowvm.driver import generate_cuda
    from lowvm.kernels.decode_attention import decode_attention_rope
    from lowvm.kernels.quant_gemm_wgmma import quant_gemm_wgmma
    from lowvm.runtime import compiler
    from tests.helpers.programs import EXAMPLES

    monkeypatch.setattr(compiler, "_cuda_homes", lambda: [])
    monkeypatch.setattr(compiler, "find_nvcc", lambda: None)
    assert compiler.nvrtc_version() is not None, compiler.toolchain_summary()
    assert compiler.cuda_include_dirs(), "no cuda_fp16.h outside the toolkit"
    programs = [(t.build(**c), arch) for t, c in EXAMPLES.values() for arch in ("sm_80", "sm_90")]
    programs += [(decode_attention_rope.build(kv_heads=8, group=4, head_dim=128, stages=3),
                  "sm_90"), (quant_gemm_wgmma.build(wtype=lowvm.int4, group=128), "sm_90a")]
    for program, arch in programs:
        cubin = compiler.compile_cubin(generate_cuda(program).source, arch, compiler="nvrtc")
        assert cubin.startswith(b"\x7fELF"), (program.name, arch)
