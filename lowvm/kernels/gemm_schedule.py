"""The compile-time tiling of the quantized GEMMs: one dataclass that benchmarks, the tuner
and the library pass around, and the programs take as one constant (``schedule``), kept
apart from them so that choosing a schedule needs no kernel code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lowvm.errors import LowvmError

__all__ = ["GemmSchedule", "ScheduleError", "with_fields", "gemm_listing"]


class ScheduleError(LowvmError, ValueError):
    """A :class:`GemmSchedule` whose fields no kernel runs together."""


@dataclass(frozen=True)
class GemmSchedule:
    """The compile-time tiling of one GEMM specialisation: the ``schedule`` constant of
    :func:`~lowvm.kernels.quant_gemm.quant_gemm` (every field but ``wgmma``),
    ``quant_gemm_prefill`` and ``quant_gemm_wgmma`` (the fields each one's docstring
    names)."""

    bm: int = 16
    bn: int = 64
    bk: int = 128
    warps_m: int = 1
    warps_n: int = 4
    split: int = 1
    stages: int | None = None
    prefetch: int = 1
    #: weights (and scales) come through staged shared memory (``cp.async``, ``stages``
    #: deep) instead of register prefetch buffers: more bytes in flight, fewer registers
    weights_shared: bool = False
    #: split-K sums finished inside the GEMM by the last block of each tile (vm.arrive);
    #: False: by :func:`finish_split`, a second launch (measured faster at M = 64)
    fused_split: bool = True
    #: occupancy hint (``vm.set_min_blocks``): registers capped for this many blocks/SM
    min_blocks: int = 1
    #: K steps of x brought into shared memory per copy (and per pair of block-wide
    #: barriers); 0: ``prefetch`` steps. A multiple of ``prefetch`` (register body only)
    x_steps: int = 0
    #: weights and scales of the step this many steps beyond the register buffers are
    #: asked into the L2 (``vm.prefetch_l2``) each step: more bytes in flight per SM
    #: without registers (register body only)
    l2_ahead: int = 0
    #: a K step's MMAs run over ``k_slice``-deep slices of x and of the converted weights
    #: (``vm.extract``), so x is held one slice at a time: what lets one M-warp cover
    #: bm = 64 rows and convert each weight once; 0: the whole step at once
    k_slice: int = 0
    #: x for the block's whole K range (at most this many columns, a multiple of ``bk``
    #: and >= K / split) is copied into shared memory once, before the main loop, which
    #: then has no x copy and no barrier; 0: x is copied every ``steps_per_copy`` steps
    x_whole: int = 0
    #: rows of x (and of y) per block when fewer than ``bm``: 1, with ``x_whole``: the
    #: block's one row of x is read as every row of the MMA tile (a stride-0 shared
    #: layout) and only that row of the result is stored (decode at batch 1, where 15 of
    #: 16 rows would otherwise be zeros copied into shared memory); 0: ``bm``
    x_rows: int = 0
    #: with ``x_rows=1`` (so ``x_whole``), ``warps_m=1`` and no ``k_slice``: each K step
    #: computes y^T = q^T x^T, the weights as the MMA's A operand (16 of N per MMA) and x
    #: as B (8 columns, one used), so a step needs half the MMAs, ldmatrix and scale
    #: multiplies of x as A (16 rows, one used)
    swap_ab: bool = False
    #: run :func:`~lowvm.kernels.quant_gemm_wgmma.quant_gemm_wgmma` (sm_90a): ``bm`` rows
    #: of x by ``bn`` weight rows on ``warps_m`` = 4 x warpgroups warps (``warps_n`` = 1);
    #: ``split``, ``stages`` and ``prefetch`` as above, no other option
    wgmma: bool = False

    def __post_init__(self) -> None:
        """Refuse the combinations of fields no kernel runs, naming the field, its value
        and what is accepted: the one place these rules live (what also depends on the
        weight, K or N is asked of ``schedules.plan_refusal`` / ``wgmma_refusal``)."""
        for name in ("bm", "bn", "bk", "warps_m", "warps_n", "split", "prefetch",
                     "min_blocks"):
            if getattr(self, name) < 1:
                self._refuse(name, "accepted: an integer >= 1")
        for name in ("x_steps", "l2_ahead", "k_slice", "x_whole", "x_rows"):
            if getattr(self, name) < 0:
                self._refuse(name, "accepted: 0 (off) or a positive integer")
        if self.stages is not None and self.stages < 1:
            self._refuse("stages", "accepted: None (x copied and waited for) or >= 1")
        if self.wgmma:
            self._check_wgmma()
            return
        if self.k_slice and (self.k_slice % 16 or self.bk % self.k_slice):
            self._refuse("k_slice", f"accepted: 0 (the whole step) or a multiple of 16 "
                                    f"dividing bk={self.bk}")
        if self.x_steps % self.prefetch:
            self._refuse("x_steps", f"accepted: 0 or a multiple of prefetch={self.prefetch}")
        if self.x_rows not in (0, 1, self.bm) or (self.x_rows == 1 and not self.x_whole):
            self._refuse("x_rows", f"accepted: 0 or bm={self.bm}, or 1 with x_whole (one "
                                   f"row of x held whole), got x_whole={self.x_whole}")
        if self.x_whole % self.bk:
            self._refuse("x_whole", f"accepted: 0 or a multiple of bk={self.bk}")
        if self.x_whole and (self.weights_shared or self.x_steps or self.stages):
            self._refuse("x_whole", f"x held whole takes no weights_shared, x_steps or "
                                    f"stages; got {self.weights_shared}, {self.x_steps}, "
                                    f"{self.stages}")
        if self.weights_shared and (self.prefetch != 1 or self.x_steps > 1 or self.l2_ahead):
            self._refuse("weights_shared", f"staged weights take prefetch=1, x_steps 0 or "
                                           f"1 and l2_ahead=0; got {self.prefetch}, "
                                           f"{self.x_steps}, {self.l2_ahead}")
        if self.swap_ab and not (self.x_rows == 1 and self.warps_m == 1
                                 and not self.k_slice):
            self._refuse("swap_ab", f"y^T is computed one row of x at a time: accepted "
                                    f"with x_rows=1, warps_m=1 and k_slice=0, got "
                                    f"x_rows={self.x_rows}, warps_m={self.warps_m}, "
                                    f"k_slice={self.k_slice}")

    def _check_wgmma(self) -> None:
        """The wgmma kernel's own rules (``warps_m`` = 4 x warpgroups, ``warps_n`` = 1)."""
        if self.warps_n != 1 or self.warps_m not in (4, 8):
            self._refuse("warps_m", f"the wgmma GEMM takes warps_m = 4 x warpgroups (4 or "
                                    f"8) and warps_n=1, got warps_n={self.warps_n}")
        if self.bm % 8 or not 8 <= self.bm <= 256:
            self._refuse("bm", "the wgmma GEMM takes a multiple of 8 in 8..256 rows of x")
        if self.bn % (16 * self.warps_m):
            self._refuse("bn", f"the wgmma GEMM takes a multiple of 64 x warpgroups "
                               f"({16 * self.warps_m}) weight rows")
        if self.bk not in (64, 128):
            self._refuse("bk", "the wgmma GEMM takes K tiles of 64 or 128 (group >= 64)")
        others = [f"{name}={getattr(self, name)!r}" for name in
                  ("weights_shared", "x_steps", "l2_ahead", "k_slice", "x_whole", "x_rows",
                   "swap_ab") if getattr(self, name)]
        if others or self.min_blocks != 1:
            self._refuse("wgmma", "the wgmma GEMM takes no weights_shared, min_blocks, "
                                  "x_steps, l2_ahead, k_slice, x_whole, x_rows or swap_ab; "
                                  f"got {', '.join(others or [f'min_blocks={self.min_blocks}'])}")

    def _refuse(self, name: str, accepted: str) -> None:
        raise ScheduleError(f"GemmSchedule {name}={getattr(self, name)!r}: {accepted}")

    def resplit(self, k: int, **fields: object) -> GemmSchedule:
        """This schedule with ``fields`` replaced, for K = ``k``: an ``x_whole`` one keeps
        holding exactly a block's K range (``x_whole = k / split`` for the new split)."""
        s = replace(self, **fields)
        return replace(s, x_whole=k // s.split) if s.x_whole else s

    @property
    def rows(self) -> int:
        """Rows of y per block (the grid's third dim is ``cdiv(m, rows)``)."""
        return self.x_rows or self.bm

    @property
    def warpgroups(self) -> int:
        """Warpgroups of a wgmma schedule (``warps_m`` = 4 x warpgroups)."""
        return self.warps_m // 4

    @property
    def steps_per_copy(self) -> int:
        """K steps per iteration of the main loop: the block's K steps are a multiple."""
        return self.x_steps or self.prefetch


def with_fields(base: GemmSchedule, spec: str) -> GemmSchedule:
    """``base`` with the fields named in ``spec``, ``field=value/field=value`` (integers;
    ``stages=0``: none; ``weights_shared``, ``fused_split``, ``swap_ab`` and ``wgmma`` 0
    or 1): how the benchmark
    scripts' command lines name schedules. An empty ``spec`` is ``base``."""
    fields: dict[str, object] = {}
    for item in filter(None, spec.split("/")):
        key, value = item.split("=")
        fields[key] = (bool(int(value)) if key in ("weights_shared", "fused_split", "wgmma",
                                                   "swap_ab")
                       else int(value) or None if key == "stages" else int(value))
    return replace(base, **fields)


def gemm_listing(*fields: str) -> Callable[..., dict[str, Any]]:
    """The ``listing`` of a GEMM program (``@vm.program(listing=...)``): the weight's
    constants, then the schedule's ``fields`` (those the program reads) one by one, so a
    kernel's header comment names each as a constant of its own."""

    def listing(wtype: Any, group: int, zero_point: bool, schedule: GemmSchedule,
                **_: Any) -> dict[str, Any]:
        return {"wtype": wtype, "group": group, "zero_point": zero_point,
                **{f: getattr(schedule, f) for f in fields}}

    return listing
