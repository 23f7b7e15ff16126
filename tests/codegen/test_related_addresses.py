"""The related-address lowering of ``ldmatrix`` / ``cp.async`` computes the same addresses as
the per-access one, for every thread, in every example kernel — checked without a GPU.

Each selected instruction is emitted twice (``LOWVM_PLAIN_ADDRESSES=1`` and unset) and the
emitted lines are run by a small evaluator of the C subset they use (integer declarations,
conjunctions, guards, the asm operands), with ``tid`` a numpy array of every thread and
the runtime sizes and loop variables fixed. Each asm's shared address, bytes copied and
(where any are copied) global source must agree between the two lowerings.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import lowvm.lang as vm
from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters import emitter_for
from lowvm.codegen.emitters.memory_selected import related_addresses_enabled
from lowvm.codegen.shared_alloc import allocate_shared
from lowvm.codegen.thread_offsets import Relation, relation, swizzled_offsets
from lowvm.instructions.plans import CpAsyncPlan, LdmatrixPlan
from lowvm.layouts import shared_row_major, swizzle_128b
from lowvm.passes import run_passes
from tests.helpers.programs import EXAMPLES

_SIZES = {"__half": 2, "__nv_bfloat16": 2, "float": 4, "lowvm_u8": 1, "lowvm_i8": 1,
          "int": 4}


class _Runtime(dict):
    """Names the emitted code reads: sizes (m = 5 masks rows of the first tiles), block
    0, loop variables 1."""

    def __missing__(self, name: str) -> int:
        return 1


def _python(expr: str) -> str:
    """The C expression ``expr`` as numpy-evaluable Python."""
    expr = re.sub(r"\(lowvm_u32\)__cvta_generic_to_shared\(&reinterpret_cast<(\w+)\*>"
                  r"\(lowvm_smem \+ (\d+)\)\[(.*?)\]\)",
                  lambda mt: f"({mt.group(2)} + ({mt.group(3)}) * {_SIZES[mt.group(1)]})", expr)
    expr = re.sub(r"\(const void\*\)\(?&?(\w+)\[(.*)\]\)?$", r"(\2)", expr)
    expr = re.sub(r"\(const void\*\)", "", expr).replace("(lowvm_i64)", "")
    expr = expr.replace("(unsigned)", "_u32")
    expr = expr.replace("blockIdx.", "blockIdx_").replace("/", "//")
    if "&&" in expr:
        expr = " & ".join(f"({part})" for part in expr.split("&&"))
    return expr


def _value(expr: str, env: _Runtime) -> np.ndarray:
    expr = expr.strip()
    ternary = re.fullmatch(r"(\w+) \? (.*) : (.*)", expr)
    if ternary:
        cond, yes, no = ternary.groups()
        return np.where(env[cond], _value(yes, env), _value(no, env))
    return np.asarray(eval(_python(expr), {"np": np}, env))


def _u32(value) -> np.ndarray:
    """C's conversion to ``unsigned``: the value modulo 2^32."""
    return np.asarray(value, dtype=np.int64) & 0xFFFFFFFF


def _operands(line: str) -> list[str]:
    """The input operands of an asm statement (``"r"(...)``/``"l"(...)``), parens matched."""
    out, i = [], 0
    while (i := line.find('"(', i)) >= 0:
        kind = line[i - 1]
        start = depth = i + 1
        depth = 0
        for j in range(start, len(line)):
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            if depth == 0:
                break
        if kind in "rl" and line[i - 2] == '"':
            out.append(line[start + 1:j])
        i = j
    return out


def _run(lines: list[str], threads: int, **values: int) -> list[tuple]:
    """Every asm's (active threads, shared address, bytes, global source) in order;
    ``values`` binds runtime names besides the defaults."""
    env = _Runtime(tid=np.arange(threads), m=5, n=128, k=4096,
                   blockIdx_x=0, blockIdx_y=0, blockIdx_z=0, _u32=_u32)
    env.update(values)
    masks, out, skip = [np.ones(threads, dtype=bool)], [], 0
    for raw in lines:
        line = raw.strip()
        if skip:  # inside an else branch (the generic per-element code): not compared
            skip += line.endswith("{") - (line == "}")
            continue
        if line.startswith(("//", "#pragma")) or not line:
            continue
        if line == "else {":
            skip = 1
        elif line.endswith("{"):
            head = line[:-1].strip()
            cond = re.fullmatch(r"if \((.*)\)", head)
            masks.append(masks[-1] & (_value(cond.group(1), env) if cond else True))
        elif line == "}":
            masks.pop()
        elif line.startswith("const auto* "):
            name, expr = re.fullmatch(r"const auto\* (\w+) = &\w+\[(.*)\];", line).groups()
            env[name] = _value(expr, env)
        elif line.startswith("const "):
            name, expr = re.fullmatch(r"const [\w* ]*?(\w+) = (.*);", line).groups()
            env[name] = _value(expr, env)
        elif line.startswith("asm volatile"):
            operands = _operands(line)
            if "cp.async" in line:
                out.append((masks[-1].copy(), _value(operands[0], env), _value(operands[2], env),
                            _value(operands[1], env)))
            else:
                out.append((masks[-1].copy(), _value(operands[-1], env), None, None))
        else:
            raise AssertionError(f"the evaluator does not know this line: {line}")
    return out


def _emit(program, inst, plain: bool, monkeypatch) -> list[str]:
    """``inst``'s CUDA lines, with (``plain``) or without the related addresses; with
    ``monkeypatch`` None, under the environment as the caller set it."""
    if monkeypatch is not None and plain:
        monkeypatch.setenv("LOWVM_PLAIN_ADDRESSES", "1")
    elif monkeypatch is not None:
        monkeypatch.delenv("LOWVM_PLAIN_ADDRESSES", raising=False)
    cg = CudaContext(program)
    cg.shared_offsets = allocate_shared(program)[0]
    emit = emitter_for(inst, type(inst.impl))  # the selected implementation's emitter
    assert emit is not None
    emit(inst, cg)
    return cg.lines


def _selected(name: str):
    template, constants = EXAMPLES[name]
    program = run_passes(template.build(**constants))
    return program, [i for i in program.instructions()
                     if isinstance(getattr(i, "impl", None), (LdmatrixPlan, CpAsyncPlan))]


@pytest.mark.parametrize("name", sorted(n for n in EXAMPLES if _selected(n)[1]))
def test_related_addresses_match_the_per_access_ones(name, monkeypatch):
    program, insts = _selected(name)
    assert _agree(program, insts, monkeypatch), f"{name}: no access took the related lowering"


def _agree(program, insts, monkeypatch, **values: int) -> int:
    """Compare both lowerings of every instruction in ``insts``; how many differ in code."""
    related_seen = 0
    for inst in insts:
        plain_lines = _emit(program, inst, True, monkeypatch)
        lines = _emit(program, inst, False, monkeypatch)
        related_seen += lines != plain_lines
        plain = _run(plain_lines, program.num_threads, **values)
        related = _run(lines, program.num_threads, **values)
        assert len(plain) == len(related), inst
        for (ma, aa, sa, ga), (mb, ab, sb, gb) in zip(plain, related):
            assert np.array_equal(ma, mb), inst
            assert np.array_equal(np.broadcast_to(aa, ma.shape)[ma],
                                  np.broadcast_to(ab, mb.shape)[mb]), inst
            if sa is not None:
                sa, sb = (np.broadcast_to(v, ma.shape)[ma] for v in (sa, sb))
                assert np.array_equal(sa, sb), inst
                copied = sa > 0
                assert np.array_equal(np.broadcast_to(ga, ma.shape)[ma][copied],
                                      np.broadcast_to(gb, mb.shape)[mb][copied]), inst
    return related_seen


@pytest.mark.parametrize("row", [-70, -3, -1, 0, 2])
def test_a_tile_that_starts_before_the_tensor_copies_its_rows_inside(row, monkeypatch):
    """A thread whose first chunk lies above the tensor still copies its later chunks
    that lie inside it (each chunk tests its own lower bound where the offset may be
    negative)."""
    @vm.program(warps=1)
    def prog(r: vm.int32, m: vm.int32, x: vm.ptr[vm.float16]):
        vm.set_grid(1)
        s = vm.shared_tensor(vm.float16, [64, 64])
        vm.copy_async(s, vm.global_view(x, [m, 64]), [r, 0])
        vm.commit_group()
        vm.wait_group(0)
        vm.free_shared(s)

    program = run_passes(prog.build())
    insts = [i for i in program.instructions() if isinstance(getattr(i, "impl", None),
                                                             CpAsyncPlan)]
    assert insts and _agree(program, insts, monkeypatch, r=row, m=40)
    lines = _emit(program, insts[0], False, monkeypatch)
    copied = sum(int(np.sum(b[mask] > 0)) for mask, _, b, _ in
                 _run(lines, program.num_threads, r=row, m=40))
    assert copied == 8 * max(0, min(40, row + 64) - max(0, row))  # 8 chunks a row


def test_plain_switch_names_parts(monkeypatch):
    monkeypatch.setenv("LOWVM_PLAIN_ADDRESSES", "cp_async")
    assert not related_addresses_enabled("cp_async") and related_addresses_enabled("ldmatrix")
    monkeypatch.setenv("LOWVM_PLAIN_ADDRESSES", "1")
    assert not related_addresses_enabled("ldmatrix")
    monkeypatch.delenv("LOWVM_PLAIN_ADDRESSES")
    assert related_addresses_enabled("ldmatrix") and related_addresses_enabled("cp_async")


def test_relation_finds_adds_xors_and_their_mix():
    base = np.arange(32, dtype=np.int64) * 8
    assert relation(base, base + 1024) == Relation(0, 1024)
    assert relation(base, base ^ 16) == Relation(16, 0)
    assert relation(base, (base ^ 16) + 2048) == Relation(16, 2048)
    assert relation(base, base * 2) is None
    assert Relation(16, 2048).apply("b") == "((b) ^ 16) + 2048"


def test_swizzled_rows_eight_apart_differ_by_an_add_columns_by_a_xor():
    lay = swizzle_128b(16, 64, "float16")  # 8 16-byte chunks per row, XORed by row % 8
    rows, cols = np.arange(8), np.zeros(8, dtype=np.int64)
    base = swizzled_offsets(lay, [rows, cols])
    assert np.array_equal(base, [lay.offset((r, 0)) for r in rows])
    assert relation(base, swizzled_offsets(lay, [rows + 8, cols])) == Relation(0, 8 * 64)
    assert relation(base, swizzled_offsets(lay, [rows, cols + 16])).xor == 16
    plain = shared_row_major(16, 64)
    assert relation(swizzled_offsets(plain, [rows, cols]),
                    swizzled_offsets(plain, [rows, cols + 8])) == Relation(0, 8)


# ---------------------------------------------------------------------------------------
# global vector loads: one pointer and constant offsets against an address per access

_GLOBAL_SIZES = dict(m=5, n=320, k=2048, blockIdx_x=3, blockIdx_y=1, blockIdx_z=2)


def _global_value(expr: str, env: dict) -> np.ndarray:
    """A C index expression of the global loads as numpy (``lowvm_wide`` a multiply)."""
    expr = expr.replace("(lowvm_i64)", "").replace("blockIdx.", "blockIdx_")
    expr = re.sub(r"\bmin\(", "np.minimum(", expr.replace("/", "//"))
    expr = re.sub(r"\bmax\(", "np.maximum(", expr)
    return np.asarray(eval(expr, {}, env))


_LOAD = re.compile(r"\*reinterpret_cast<[\w ]+\*>\(&(\w+)\[(.*?)\]\) = "
                   r"__ld\w+\(reinterpret_cast<const [\w ]+\*>\((.*)\)\);")


def _global_loads(lines: list[str], threads: int) -> dict[int, np.ndarray]:
    """Per register slot, every thread's element index of the emitted vector load (the
    vector branch of a guarded one; the evaluator knows declarations, the unrolled
    ``l`` loop, ``lowvm_g`` and the load lines)."""
    env = _Runtime(_GLOBAL_SIZES, tid=np.arange(threads), np=np, lowvm_wide=np.multiply)
    out, body, loop = {}, [], None
    for line in (raw.strip() for raw in lines):
        if line.startswith("else"):
            break
        body.append(line)

    def run(line: str) -> None:
        if line.startswith("const auto* lowvm_g = &"):
            env["lowvm_g"] = _global_value(re.fullmatch(r".*?&\w+\[(.*)\];", line)[1], env)
        elif line.startswith("const int "):
            name, expr = re.fullmatch(r"const int (\w+) = (.*);", line).groups()
            env[name] = _global_value(expr, env)
        elif (load := _LOAD.fullmatch(line)) is not None:
            slot, address = int(_global_value(load[2], env)), load[3]
            inner = re.fullmatch(r"&\w+\[(.*)\]", address)
            index = _global_value(inner[1] if inner else address, env)
            out[slot] = np.broadcast_to(index, (threads,)).copy()

    for line in body:
        head = re.fullmatch(r"for \(int l = 0; l < (\d+); l \+= (\d+)\) \{", line)
        if head:
            loop = (int(head[1]), int(head[2]), [])
        elif loop is not None and line == "}":
            for first in range(0, loop[0], loop[1]):
                env["l"] = first
                for inner_line in loop[2]:
                    run(inner_line)
            loop = None
        elif loop is not None:
            loop[2].append(line)
        else:
            run(line)
    return out


def _global_vector_loads(name: str):
    from lowvm.instructions.memory import LoadGlobal
    from lowvm.instructions.plans import VectorAccess

    template, constants = EXAMPLES[name]
    program = run_passes(template.build(**constants))
    return program, [i for i in program.instructions() if isinstance(i, LoadGlobal)
                     and i.inbounds and isinstance(i.impl, VectorAccess)]


@pytest.mark.parametrize("name", sorted(n for n in EXAMPLES if _global_vector_loads(n)[1]))
def test_related_global_loads_match_the_per_access_ones(name, monkeypatch):
    """Every in-bounds vector load of the example kernels reads, per thread and register,
    the element its per-access lowering (``LOWVM_PLAIN_ADDRESSES=global_vector``) reads."""
    program, loads = _global_vector_loads(name)
    related_seen = 0
    for inst in loads:
        monkeypatch.setenv("LOWVM_PLAIN_ADDRESSES", "global_vector")
        plain_lines = _emit(program, inst, False, monkeypatch=None)
        monkeypatch.delenv("LOWVM_PLAIN_ADDRESSES")
        lines = _emit(program, inst, False, monkeypatch=None)
        if lines == plain_lines:
            continue
        related_seen += 1
        assert any("lowvm_g" in line for line in lines), inst
        plain = _global_loads(plain_lines, program.num_threads)
        related = _global_loads(lines, program.num_threads)
        assert plain and plain.keys() == related.keys(), inst
        for slot, index in plain.items():
            assert np.array_equal(index, related[slot]), (inst, slot)
    assert related_seen, f"{name}: no load took the related lowering"
