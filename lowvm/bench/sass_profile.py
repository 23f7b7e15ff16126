"""Where a generated kernel's main loop spends its instructions, per VM instruction — no GPU.

The decode GEMM is bounded by the instructions it issues, so the static count of its
main loop is a measure worth having on any machine: this compiles the program's CUDA
with line info (nvcc -lineinfo), disassembles it (nvdisasm -g), finds the main loop
(the longest backward branch), and files each SASS instruction under the VM instruction
whose lowering the source line belongs to (the ``// <instruction>`` comment that opens
it in the generated CUDA).

Usage: python -m lowvm.bench.sass_profile --m 1 --n 28672 --k 4096 [--type int3]
       [--variant split=8/stages=4] [--arch sm_90]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from lowvm.driver import generate_cuda
from lowvm.dtypes import dtype as as_dtype
from lowvm.instructions import INSTRUCTIONS, OPS
from lowvm.kernels.gemm_schedule import with_fields
from lowvm.kernels.library import choose_schedule
from lowvm.kernels.quant_gemm import quant_gemm

_COMMENT = re.compile(r"//\s*(.*)$")
_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_SASS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def tool(name: str) -> str:
    """``name`` from PATH, or from the nvidia wheels of this Python's environment."""
    found = shutil.which(name)
    if found:
        return found
    for base in map(Path, sys.path):
        for candidate in base.glob(f"nvidia/cu*/bin/{name}"):
            return str(candidate)
    raise SystemExit(f"{name} not found (PATH, or pip install nvidia-cuda-nvdisasm)")


def owners(source: str) -> list[str]:
    """For each line of the generated CUDA (1-based index - 1), the VM instruction whose
    lowering it belongs to ('setup' before the first one; elementwise ones by their op)."""
    current, out = "setup", []
    for line in source.splitlines():
        m = _COMMENT.search(line)
        if m:  # "// mnemonic ..." or "// %r5: type layout = mnemonic ..."
            words = re.findall(r"(?:^|= )([a-z_0-9]+)\b", m.group(1))
            current = next((w for w in words if w in INSTRUCTIONS or w in OPS), current)
        out.append(current)
    return out


def executed_path(source: str) -> str:
    """``source`` with the runtime alignment tests of vectorized accesses (``(n % 8) ==
    0`` on the shape arguments) taken as true, as the library's shapes always pass them:
    the count is then the path that runs, not its per-element fallbacks."""
    return re.sub(r"\(([nkm]) % \d+\) == 0", "1 == 1", source)


def loop_profile(source: str, arch: str) -> tuple[Counter, Counter, int]:
    """(SASS count per VM instruction, per opcode) of the main loop, and its length."""
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp, "kernel.cu"), Path(tmp, "kernel.cubin")
        cu.write_text(source)
        subprocess.run([tool("nvcc"), f"-arch={arch}", "-cubin", "-O3", "-lineinfo", "-o",
                        str(cubin), str(cu)], check=True, capture_output=True)
        listing = subprocess.run([tool("nvdisasm"), "-gi", "-c", str(cubin)], check=True,
                                 capture_output=True, text=True).stdout
    by_line = owners(source)
    where, rows, labels, pending = "setup", [], {}, []
    for text in listing.splitlines():
        m = _LINE.search(text.split(" inlined at ")[-1])  # a header's code: its caller
        if m:
            where = (by_line[int(m.group(2)) - 1] if m.group(1).endswith("kernel.cu")
                     else f"({Path(m.group(1)).name})")
            continue
        label = re.match(r"^(\.L_\w+):", text.strip())
        if label:
            pending.append(label.group(1))
            continue
        m = _SASS.search(text)
        if m:
            addr = int(m.group(1), 16)
            labels.update((name, addr) for name in pending)
            pending = []
            rows.append((addr, m.group(3), m.group(4), where))
    backward = [(labels[t], addr) for addr, op, args, _ in rows if op.startswith("BRA")
                for t in re.findall(r"\.L_\w+", args) if t in labels and labels[t] < addr]
    loop = max(backward, key=lambda r: r[1] - r[0])
    body = [r for r in rows if loop[0] <= r[0] <= loop[1]]
    return (Counter(w for *_, w in body), Counter(op.split(".")[0] for _, op, _, _ in body),
            len(body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--n", type=int, default=28672)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--type", default="int4")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--variant", default="", help="GemmSchedule fields over the chosen "
                    "schedule, field=value/field=value (stages=0: none)")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    s = with_fields(choose_schedule(args.m, args.n, args.k, min(128, args.group)),
                    args.variant)
    source = generate_cuda(quant_gemm.build(wtype=as_dtype(args.type), group=args.group,
                                            schedule=s)).source
    per_inst, per_op, total = loop_profile(executed_path(source), args.arch)
    steps = s.steps_per_copy
    print(f"{args.type} M={args.m} N={args.n} K={args.k} {args.arch}: {s}")
    print(f"main loop: {total} instructions per warp for {steps} K step(s), "
          f"{total / steps:.0f} per step\n")
    print(f"{'VM instruction':<28}{'SASS':>6}{'per step':>10}")
    for name, count in per_inst.most_common():
        print(f"{name:<28}{count:>6}{count / steps:>10.1f}")
    print("\nopcodes: " + ", ".join(f"{op} {n}" for op, n in per_op.most_common(14)))


if __name__ == "__main__":
    main()
