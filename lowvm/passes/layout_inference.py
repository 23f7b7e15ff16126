"""Layout inference: every register tile gets a concrete layout.

Guarantees, for the program :func:`infer_layouts` returns:

- every :class:`~lowvm.ir.RegisterTensor` has a layout over the block's threads;
- a tile the author annotated keeps its layout and its object (a program with nothing to
  infer is returned as it is);
- every instruction's ``check()`` passed with the assigned layouts;
- where two instructions demand different layouts for one tile, a
  :class:`~lowvm.ir.ProgramError` names both instructions, their source lines and both
  layouts, instead of a layout being picked silently.

How layouts are found. Constraints run in both directions along the instructions until
nothing changes:

- ``cast``, ``assign``: the same layout on both sides; ``permute``: the permuted one;
  ``reduce``: the reduced one (forward only);
- elementwise: the result has the layout of a full-shape operand, full-shape operands
  that of the result, broadcast operands the result's layout reduced over their size-1
  dims (``layouts.reduce(..., keepdims=True)``);
- ``view``: each thread keeps its bits, so the innermost local run along the last dim
  is rescaled by the ratio of the bit widths (in either direction);
- ``dot``: ``out`` and ``c`` are equal; a, b and c come from one block-MMA composition
  (:func:`lowvm.layouts.mma_tiling.block_mma_layouts`) matching whatever is known.

Then, in order, until every tile is known (propagating after each step):

1. dots with no known operand get the preferred composition: the m16n8k16 atom for
   f16/bf16 (m16n8k8 if K needs it), m16n8k32 for int8/uint8 (m16n8k16 if K needs it),
   warps spread over M as far as M allows, the rest over N;
2. tiles nothing constrains and that are made from nothing (loads, ``register_tensor``,
   elementwise results with only broadcast operands), largest first, get
   :func:`default_layout`: contiguous 16-byte runs per thread along the last dim, so
   the global access vectorizes.

A tile still unknown after that (e.g. a ``view`` whose source layout cannot be
rescaled) is an error at the instruction that defines it, asking for ``layout=``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, fields
from fractions import Fraction

from lowvm.dtypes import DType, bfloat16, float16, int8, uint8
from lowvm.errors import LowvmError
from lowvm.instructions import (
    Assign,
    Cast,
    Dot,
    DotShared,
    Elementwise,
    Instruction,
    LoadGlobal,
    LoadShared,
    Permute,
    Reduce,
    RegisterInit,
    View,
)
from lowvm.instructions.base import gather_map
from lowvm.ir import Program, ProgramError, RegisterTensor
from lowvm.layouts import RegisterLayout, local, mma_layouts, permute, reduce, spatial
from lowvm.passes.rewrite import map_instructions

__all__ = ["infer_layouts", "default_layout", "view_layout", "mma_candidates"]

#: Bytes each thread moves in one access by default (``ld.global.v4``, ``cp.async`` 16).
DEFAULT_RUN_BYTES = 16

#: MMA atoms to try per operand type, preferred first.
MMA_ATOMS: dict[DType, tuple[str, ...]] = {
    float16: ("m16n8k16", "m16n8k8"),
    bfloat16: ("m16n8k16", "m16n8k8"),
    int8: ("m16n8k32", "m16n8k16"),
    uint8: ("m16n8k32", "m16n8k16"),
}


# ---------------------------------------------------------------------------------------
# layouts inference can choose


def _replicated(layout: RegisterLayout, copies: int) -> RegisterLayout:
    """``layout`` held by ``copies`` groups of threads (the most significant digit)."""
    if copies == 1:
        return layout
    ones = [1] * (layout.rank - 1)
    return reduce(spatial(copies, *ones), [0], keepdims=True) * layout


def _spread(shape: tuple[int, ...], run: int, threads: int) -> tuple[RegisterLayout, int]:
    """Runs of ``run`` along the last dim, threads over the dims from the last: the
    layout and how many times it is replicated to occupy all ``threads``."""
    rest = list(shape)
    rest[-1] //= run
    per_dim = [1] * len(shape)
    left = threads
    for d in reversed(range(len(shape))):
        per_dim[d] = math.gcd(rest[d], left)
        rest[d] //= per_dim[d]
        left //= per_dim[d]
    layout = spatial(*per_dim)
    if math.prod(rest) > 1:  # the tile is larger than one run per thread: repeat
        layout = local(*rest) * layout
    if run > 1:
        layout = layout.local(*([1] * (len(shape) - 1)), run)
    return _replicated(layout, left), left


def default_layout(shape: tuple[int, ...], dtype: DType, threads: int,
                   granule: int = 1) -> RegisterLayout:
    """A layout for a tile nothing else constrains: every thread holds contiguous runs
    of up to 16 bytes along the last dim, consecutive threads hold consecutive runs (a
    warp reads contiguous memory), and as few threads as possible hold copies.

    Run lengths are the divisors of the last dim that are multiples of ``granule``
    (e.g. 3 bytes when the tile is viewed as 3-bit values, so no value straddles two
    runs) and at most 16 bytes long; the one needing the least replication wins, the
    longer on ties.
    """
    last = shape[-1]
    longest = max(granule, DEFAULT_RUN_BYTES * 8 // dtype.nbits)
    runs = [r for r in range(granule, min(last, longest) + 1, granule) if last % r == 0]
    if not runs:  # no run of whole granules fits: plain runs (a view will say why)
        runs = [r for r in range(1, min(last, longest) + 1) if last % r == 0]
    best: tuple[int, int, RegisterLayout] | None = None
    for run in runs:
        layout, copies = _spread(shape, run, threads)
        if best is None or (copies, -run) < (best[0], -best[1]):
            best = (copies, run, layout)
    assert best is not None  # runs always holds 1 or granule
    return best[2]


def _run(layout: RegisterLayout) -> int:
    """Consecutive elements along the last dim each thread holds in its innermost
    registers (1 when the innermost local digit runs elsewhere)."""
    last_mode = len(layout.mode_sizes) - 1
    if (layout.local_modes and layout.mode_shape[-1]
            and layout.local_modes[-1] == last_mode):
        return layout.mode_sizes[last_mode]
    return 1


_RUN_RECIPE = re.compile(r"\.local\(((?:1, )*)(\d+)\)$")


def view_layout(src: RegisterLayout, src_bits: int, dst_bits: int,
                dst_shape: tuple[int, ...]) -> RegisterLayout | None:
    """The layout of ``src``'s registers read as ``dst_bits``-wide values, or None.

    Each thread keeps its bits; that is a layout of ``dst_shape`` when the innermost
    local digit runs along the last dim at stride 1, so that run can be rescaled by
    ``src_bits / dst_bits`` (e.g. 16 bytes -> 32 int4 values), or, for a narrower
    type, when each source element becomes a new innermost run of ``src_bits /
    dst_bits`` values (one byte per thread -> 2 int4 values).
    """
    if src_bits == dst_bits:
        return src if src.shape == dst_shape else None
    last_dim = src.rank - 1
    last_mode = len(src.mode_sizes) - 1  # modes are numbered dim by dim
    if (not src.local_modes or not src.mode_shape[last_dim]
            or src.local_modes[-1] != last_mode):
        return _split_elements(src, src_bits, dst_bits, dst_shape)
    run = src.mode_sizes[last_mode]
    if (run * src_bits) % dst_bits:
        return None
    new_run = run * src_bits // dst_bits
    modes = src.mode_shape[last_dim][:-1] + (new_run,)
    shape = src.shape[:-1] + (src.shape[-1] // run * new_run,)
    if shape != tuple(dst_shape):
        return None
    recipe = ""
    match = _RUN_RECIPE.search(src.recipe)
    if match and int(match.group(2)) == run:
        recipe = src.recipe[: match.start()] + f".local({match.group(1)}{new_run})"
    elif src.recipe:
        recipe = f"view({src.recipe}, {src_bits}->{dst_bits} bits)"
    return RegisterLayout(shape, src.mode_shape[:-1] + (modes,), src.spatial_modes,
                          src.local_modes, recipe=recipe)


def _split_elements(src: RegisterLayout, src_bits: int, dst_bits: int,
                    dst_shape: tuple[int, ...]) -> RegisterLayout | None:
    """``src`` with each element split into ``src_bits / dst_bits`` narrower values: a
    new innermost local mode, the last of the last dim (``src.local(1, ..., r)``)."""
    if src_bits % dst_bits:
        return None
    run = src_bits // dst_bits
    shape = src.shape[:-1] + (src.shape[-1] * run,)
    if shape != tuple(dst_shape):
        return None
    new_mode = len(src.mode_sizes)  # the last mode of the last dim: numbered last
    recipe = f"{src.recipe}.local({'1, ' * (src.rank - 1)}{run})" if src.recipe else ""
    return RegisterLayout(shape, src.mode_shape[:-1] + (src.mode_shape[-1] + (run,),),
                          src.spatial_modes, src.local_modes + (new_mode,), recipe=recipe)


@dataclass(frozen=True)
class MmaChoice:
    """One way to compute a dot: an MMA atom repeated over a grid of warps."""

    atom: str
    warps_m: int
    warps_n: int
    a: RegisterLayout
    b: RegisterLayout
    c: RegisterLayout

    def __str__(self) -> str:
        return f"{self.atom} MMA over {self.warps_m}x{self.warps_n} warps"


def mma_candidates(m: int, n: int, k: int, dtype: DType, num_warps: int) -> Iterator[MmaChoice]:
    """Block-MMA layouts for ``[m, k] @ [k, n]``, preferred first (see module doc)."""
    from lowvm.layouts.mma_tiling import block_mma_layouts

    for shape in MMA_ATOMS.get(dtype, ()):
        atom = mma_layouts(shape, dtype)
        for warps_m in range(num_warps, 0, -1):
            if num_warps % warps_m:
                continue
            warps_n = num_warps // warps_m
            if m % (atom.m * warps_m) or n % (atom.n * warps_n) or k % atom.k:
                continue
            lay = block_mma_layouts(m, n, k, warps_m, warps_n, dtype, shape)
            yield MmaChoice(shape, warps_m, warps_n, lay.a, lay.b, lay.c)


# ---------------------------------------------------------------------------------------
# the solver


def _tiles(inst: Instruction) -> Iterator[RegisterTensor]:
    out = inst.output()
    if isinstance(out, RegisterTensor):
        yield out
    for t in inst.operands():
        if isinstance(t, RegisterTensor):
            yield t


def _where(inst: Instruction | None) -> str:
    if inst is None:
        return "(no instruction)"
    return f"{inst.loc or '(unknown line)'}  [{inst.mnemonic}]"


@dataclass(frozen=True)
class _Origin:
    """Which instruction fixed a tile's layout, and why."""

    inst: Instruction | None
    why: str


class _Solver:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.threads = program.num_threads
        self.insts = list(program.instructions())
        self.layout: dict[RegisterTensor, RegisterLayout] = {}
        self.origin: dict[RegisterTensor, _Origin] = {}
        self.definer: dict[RegisterTensor, Instruction] = {}
        self.unknown: list[RegisterTensor] = []
        self._links: dict[RegisterTensor, list[tuple[RegisterTensor, Fraction, str]]] | None \
            = None
        self._granules: dict[RegisterTensor, int] = {}
        self._closures: dict[tuple[RegisterTensor, tuple[str, ...]],
                             dict[RegisterTensor, Fraction]] = {}
        for inst in self.insts:
            out = inst.output()
            if isinstance(out, RegisterTensor) and out not in self.definer:
                self.definer[out] = inst
        seen: set[RegisterTensor] = set()
        for inst in self.insts:
            for t in _tiles(inst):
                if t in seen:
                    continue
                seen.add(t)
                if t.layout is None:
                    self.unknown.append(t)
                else:
                    self.layout[t] = t.layout
                    self.origin[t] = _Origin(self.definer.get(t, inst), "annotated")

    # assignments ----------------------------------------------------------------------
    def conflict(self, tile: RegisterTensor, inst: Instruction, wanted: RegisterLayout,
                 why: str) -> ProgramError:
        have = self.layout[tile]
        first = self.origin[tile]
        return ProgramError(
            f"layout conflict for %{tile.name} ({tile.dtype.name}"
            f"[{', '.join(map(str, tile.shape))}]): two instructions need different layouts\n"
            f"    {_where(first.inst)}\n      needs {have} ({first.why})\n"
            f"    {_where(inst)}\n      needs {wanted} ({why})\n"
            "  annotate one of them with layout=... or convert through shared memory",
            inst.loc,
        )

    def demand(self, tile: RegisterTensor, layout: RegisterLayout, inst: Instruction,
               why: str) -> bool:
        """Give ``tile`` ``layout`` (True if that is new); a different known one conflicts."""
        have = self.layout.get(tile)
        if have is None:
            self.layout[tile] = layout
            self.origin[tile] = _Origin(inst, why)
            return True
        if have != layout:
            raise self.conflict(tile, inst, layout, why)
        return False

    # one instruction's constraints ------------------------------------------------------
    def apply(self, inst: Instruction, seed: bool) -> bool:
        """Derive what ``inst`` implies from the layouts known so far (True on progress)."""
        if isinstance(inst, Cast) and inst.relayout:
            return False  # the result's layout is given, not the source's
        if isinstance(inst, (Cast, Assign)):
            return self._same(inst, inst.src, inst.out,
                              f"{inst.mnemonic}: the result has the layout of the source")
        if isinstance(inst, Permute):
            return self._permute(inst)
        if isinstance(inst, Reduce):
            src = self.layout.get(inst.src)
            if src is None:
                return False
            out = reduce(src, [inst.dim], keepdims=inst.keepdims)
            return self.demand(inst.out, out, inst, f"%{inst.src.name} reduced over dim "
                               f"{inst.dim}")
        if isinstance(inst, View):
            return self._view(inst)
        if isinstance(inst, Elementwise):
            return self._elementwise(inst)
        if isinstance(inst, Dot):
            return self._dot(inst, seed)
        if isinstance(inst, DotShared):
            return self._same(inst, inst.c, inst.out, "dot_shared's result has c's layout")
        return False

    def _same(self, inst: Instruction, a: RegisterTensor, b: RegisterTensor, why: str) -> bool:
        if a in self.layout:
            return self.demand(b, self.layout[a], inst, why)
        if b in self.layout:
            return self.demand(a, self.layout[b], inst, why)
        return False

    def _permute(self, inst: Permute) -> bool:
        if inst.src in self.layout:
            return self.demand(inst.out, permute(self.layout[inst.src], inst.dims), inst,
                               f"%{inst.src.name} permuted by {list(inst.dims)}")
        if inst.out in self.layout:
            inverse = [inst.dims.index(d) for d in range(len(inst.dims))]
            return self.demand(inst.src, permute(self.layout[inst.out], inverse), inst,
                               f"%{inst.out.name} permuted back by {inverse}")
        return False

    def _view(self, inst: View) -> bool:
        src, out = inst.src, inst.out
        if src in self.layout and out in self.layout:
            # an inferred side must keep each thread's bits in the natural order (the
            # meaning of a view without a layout), not merely their count
            if self.origin[src].why == "annotated" and self.origin[out].why == "annotated":
                return False
            lay = view_layout(self.layout[src], src.dtype.nbits, out.dtype.nbits, out.shape)
            if lay is not None and lay != self.layout[out]:
                raise self.conflict(out, inst, lay, f"the bits each thread holds of "
                                                    f"%{src.name}")
            return False
        if src in self.layout and out not in self.layout:
            lay = view_layout(self.layout[src], src.dtype.nbits, out.dtype.nbits, out.shape)
            why = f"the bits each thread holds of %{src.name}"
            return lay is not None and self.demand(out, lay, inst, why)
        if out in self.layout and src not in self.layout:
            lay = view_layout(self.layout[out], out.dtype.nbits, src.dtype.nbits, src.shape)
            why = f"the bits each thread holds of %{out.name}"
            return lay is not None and self.demand(src, lay, inst, why)
        return False

    def _elementwise(self, inst: Elementwise) -> bool:
        out = inst.out
        tiles = [a for a in inst.args if isinstance(a, RegisterTensor)]
        progress = False
        if out not in self.layout:
            full = [t for t in tiles if t.shape == out.shape and t in self.layout]
            if not full:
                return False
            progress = self.demand(out, self.layout[full[0]], inst,
                                   f"the layout of its operand %{full[0].name}")
        result = self.layout[out]
        for t in tiles:
            dims = [d for d, (s, o) in enumerate(zip(t.shape, out.shape)) if s == 1 and o != 1]
            wanted = reduce(result, dims, keepdims=True) if dims else result
            why = (f"%{out.name}'s layout reduced over the broadcast dims {dims}" if dims
                   else f"the layout of the result %{out.name}")
            if t not in self.layout:
                progress |= self.demand(t, wanted, inst, why)
                continue
            probe_out = dataclasses.replace(out, layout=result)
            probe = dataclasses.replace(t, layout=self.layout[t])
            try:
                gather_map(probe_out, probe, inst.op)
            except ProgramError:
                raise self.conflict(t, inst, wanted, why) from None
        return progress

    def _dot(self, inst: Dot, seed: bool) -> bool:
        progress = self._same(inst, inst.c, inst.out, "a dot's result has the layout of c")
        known = {name: self.layout[t] for name, t in (("a", inst.a), ("b", inst.b),
                                                     ("c", inst.c)) if t in self.layout}
        if len(known) == 3 or (not known and not seed):
            return progress
        (m, k), n = inst.a.shape, inst.b.shape[1]
        choices = list(mma_candidates(m, n, k, inst.a.dtype, self.program.num_warps))
        if not choices:
            raise ProgramError(
                f"dot: cannot choose MMA layouts for [{m}, {k}] @ [{k}, {n}] "
                f"({inst.a.dtype.name}) over {self.program.num_warps} warps: no atom of "
                f"{', '.join(MMA_ATOMS.get(inst.a.dtype, ()))} tiles it (M must be a "
                "multiple of 16 x warps along M, N of 8 x warps along N, K of the atom's "
                "K); change the tile or the warps, or give a, b and c layouts",
                inst.loc,
            )
        for choice in choices:
            if all(getattr(choice, name) == lay for name, lay in known.items()):
                for name in ("a", "b", "c"):
                    progress |= self.demand(getattr(inst, name), getattr(choice, name), inst,
                                            f"operand {name} of the {choice}")
                return progress
        # nothing matches what is known: report against the first known operand
        name = next(iter(known))
        raise self.conflict(getattr(inst, name), inst, getattr(choices[0], name),
                            f"operand {name} of the {choices[0]} (no block-MMA layout of "
                            f"this dot matches the known layout)")

    # the whole program ------------------------------------------------------------------
    def propagate(self, seed: bool) -> None:
        """Apply every instruction's constraints until nothing changes.

        With ``seed``, the first dot with nothing known gets its preferred MMA layouts,
        then propagation resumes (so dots later in the program see its effects).
        """
        while True:
            progress = False
            for inst in self.insts:
                progress |= self.apply(inst, seed=False)
            if progress:
                continue
            if seed:
                for inst in self.insts:
                    if isinstance(inst, Dot) and self.apply(inst, seed=True):
                        progress = True
                        break
            if not progress:
                return

    def is_source(self, tile: RegisterTensor) -> bool:
        """Made from nothing that has a layout: a default layout may be chosen for it."""
        inst = self.definer.get(tile)
        if isinstance(inst, (LoadGlobal, LoadShared, RegisterInit)):
            return True
        if isinstance(inst, Elementwise):
            return not any(isinstance(a, RegisterTensor) and a.shape == tile.shape
                           for a in inst.args)
        return False

    def granule(self, tile: RegisterTensor) -> int:
        """Elements a default run of ``tile`` must be a multiple of, so that every view
        of a tile laid out with it keeps whole values in each thread (3 bytes for 3-bit
        values; 2 int4 values for a view of int4 as bytes).

        Layouts are shared along casts, assignments and elementwise ops, and views
        rescale a thread's run by the ratio of the widths; tiles met through a reduction
        or a broadcast must spread their rows over the threads alike, hence hold runs
        alike, so their views count too. The run is followed through all of them, both
        ways."""
        if tile in self._granules:
            return self._granules[tile]
        ratio = self._closure(tile, ("exact", "runs", "wide"))
        granule = 1
        for inst in self.insts:
            if isinstance(inst, View) and inst.src in ratio:
                src_bits, dst_bits = inst.src.dtype.nbits, inst.out.dtype.nbits
                whole = dst_bits // math.gcd(src_bits, dst_bits)  # source elements
                r = ratio[inst.src]  # R elements of ``tile`` are R * r source elements
                step = whole * r.denominator
                granule = math.lcm(granule, step // math.gcd(step, r.numerator))
        self._granules[tile] = granule
        return granule

    def _closure(self, tile: RegisterTensor, kinds: tuple[str, ...]
                 ) -> dict[RegisterTensor, Fraction]:
        """The tiles tied to ``tile`` by links of these kinds (see :meth:`_layout_links`),
        each with how many of its elements a run of one element of ``tile`` holds."""
        key = (tile, kinds)
        if key in self._closures:
            return self._closures[key]
        links = self._layout_links()
        ratio = {tile: Fraction(1)}
        queue = [tile]
        while queue:
            t = queue.pop()
            for other, factor, kind in links.get(t, ()):
                if other not in ratio and kind in kinds:
                    ratio[other] = ratio[t] * factor
                    queue.append(other)
        self._closures[key] = ratio
        return ratio

    def _default_order(self, tile: RegisterTensor) -> tuple[bool, bool, int, int, int]:
        """Which source gets its default first (the largest key): one whose layout a
        view between widths passes on (a view keeps whole values only for some runs:
        the others adapt to it), then one whose layout a reduction carries on (a
        reduction's result cannot give its source a layout back), then the largest
        (by the largest tile of its layout: packed bytes count as their values), then
        the one whose views need the longest runs, then the largest of the tiles met
        through reductions and broadcasts."""
        sharing = self._closure(tile, ("exact",))
        viewed = any(isinstance(inst, View) and inst.src in sharing
                     and inst.src.dtype.nbits != inst.out.dtype.nbits for inst in self.insts)
        feeds_reduce = any(isinstance(inst, Reduce) and inst.src in sharing
                           for inst in self.insts)
        family = self._closure(tile, ("exact", "runs", "wide"))
        return (viewed, feeds_reduce, max(math.prod(t.shape) for t in sharing),
                self.granule(tile), max(math.prod(t.shape) for t in family))

    def _layout_links(self) -> dict[RegisterTensor, list[tuple[RegisterTensor, Fraction, str]]]:
        """For each tile, the tiles whose layout is tied to its own, how many of their
        elements a run of one of its elements holds, and how: ``exact`` (the same
        layout, up to a view's rescaling), ``runs`` (one is the other's reduction or
        broadcast along the leading dims: the last dim's runs are the same) or ``wide``
        (along the last dim: only which threads hold the rows is shared)."""
        if self._links is not None:
            return self._links
        links: dict[RegisterTensor, list[tuple[RegisterTensor, Fraction, str]]] = {}

        def link(a: RegisterTensor, b: RegisterTensor, factor: Fraction, kind: str) -> None:
            links.setdefault(a, []).append((b, factor, kind))
            links.setdefault(b, []).append((a, 1 / factor, kind))

        def kind_of(small: RegisterTensor, big: RegisterTensor) -> str:
            if small.shape == big.shape:
                return "exact"
            return "runs" if small.shape[-1] == big.shape[-1] else "wide"
        for inst in self.insts:
            if isinstance(inst, (Cast, Assign)) and not getattr(inst, "relayout", False):
                link(inst.src, inst.out, Fraction(1), "exact")
            elif isinstance(inst, View):
                link(inst.src, inst.out, Fraction(inst.src.dtype.nbits, inst.out.dtype.nbits),
                     "exact")
            elif isinstance(inst, Elementwise):
                for a in inst.args:  # a broadcast operand has the result's layout reduced
                    if isinstance(a, RegisterTensor):
                        link(a, inst.out, Fraction(1), kind_of(a, inst.out))
            elif isinstance(inst, Reduce):
                link(inst.src, inst.out, Fraction(1),
                     "wide" if kind_of(inst.out, inst.src) == "wide" else "runs")
        self._links = links
        return links

    def solve(self) -> dict[RegisterTensor, RegisterLayout]:
        """The layout of every unknown tile (or a ProgramError)."""
        self.propagate(seed=False)
        self.propagate(seed=True)
        while True:
            open_ = [t for t in self.unknown if t not in self.layout and self.is_source(t)]
            if not open_:
                break
            tile = max(open_, key=self._default_order)
            granule = self.granule(tile)
            # a tile of a shape some tile already has a layout of takes that layout
            # (unless views need longer runs): tiles that only meet through a
            # reduction and a broadcast must agree on which thread holds which column
            # the first unreplicated one (an MMA B operand is not) whose runs hold
            # whole values for the views
            same = [lay for t, lay in self.layout.items()
                    if t.shape == tile.shape and _run(lay) % granule == 0]
            layout = min(same, key=lambda lay: lay.replication > 1, default=None)
            why = "the layout of the first tile of this shape"
            if layout is None:
                layout = default_layout(tile.shape, tile.dtype, self.threads, granule)
                why = "default: contiguous runs of up to 16 bytes per thread"
            self.demand(tile, layout, self.definer[tile], why)
            self.propagate(seed=True)
        for tile in self.unknown:
            if tile not in self.layout:
                raise self.unresolved(tile)
        return {t: self.layout[t] for t in self.unknown}

    def unresolved(self, tile: RegisterTensor) -> ProgramError:
        inst = self.definer.get(tile)
        hint = ""
        if isinstance(inst, View) and inst.src in self.layout:
            hint = (f"; the view cannot keep each thread's bits of %{inst.src.name} "
                    f"(layout {self.layout[inst.src]}) as a {tile.dtype.name} layout of "
                    f"shape {list(tile.shape)}")
        message = (f"cannot infer the layout of %{tile.name} ({tile.dtype.name}"
                   f"[{', '.join(map(str, tile.shape))}]){hint}; pass layout=... here")
        return ProgramError(message, inst.loc if inst is not None else None)


def _substitute(value: object, mapping: dict[RegisterTensor, RegisterTensor]) -> object:
    if isinstance(value, RegisterTensor):
        return mapping.get(value, value)
    if isinstance(value, tuple):
        new = tuple(_substitute(v, mapping) for v in value)
        return value if all(a is b for a, b in zip(new, value)) else new
    return value


def infer_layouts(program: Program) -> Program:
    """``program`` with a concrete layout on every register tile (see module doc)."""
    solver = _Solver(program)
    if not solver.unknown:
        return program
    layouts = solver.solve()
    mapping = {t: dataclasses.replace(t, layout=lay) for t, lay in layouts.items()}

    def rebuild(inst: Instruction) -> Instruction:
        changes = {}
        for f in fields(inst):
            value = getattr(inst, f.name)
            new = _substitute(value, mapping)
            if new is not value:
                changes[f.name] = new
        return dataclasses.replace(inst, **changes) if changes else inst

    result = map_instructions(program, rebuild)
    for inst in result.instructions():
        try:
            inst.check()
        except ProgramError:
            raise
        except LowvmError as exc:  # a layout-algebra error: name the instruction
            raise ProgramError(str(exc), inst.loc) from None
    return result
