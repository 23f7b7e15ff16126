"""A static performance model: predict a schedule's time without running it.

The model is a roofline with the effects that decide between schedules:

* **bytes**: every row of M tiles re-reads all weights and scales (``ceil(M/rows)``
  passes), plus the activations once, the output, and for split-K the fp32 partial
  sums added into the workspace and read back; time = bytes / the bandwidth the blocks
  can draw. That bandwidth follows Little's law: HBM needs ``bandwidth x latency``
  bytes in flight to stream at full rate, and a resident block keeps ``prefetch`` K
  steps of weights in registers (``stages - 1`` tiles in shared memory when weights are
  staged there) in flight;
* **FLOPs**: MMAs on the padded tiles at the tensor-core rate of the SMs in use, wave
  by wave (``ceil(blocks / (SMs x blocks per SM))`` waves), plus the ALU work of
  converting each weight once per M tile *and per M-warp* (each M-warp converts the
  weights it multiplies; ``k_slice`` is what lets one M-warp cover 64 rows);
* **occupancy**: blocks per SM from threads, registers (accumulators, the x fragments
  of a step or of a ``k_slice``, the ``prefetch`` buffers) and shared memory: x held
  whole is ``rows x x_whole`` elements once (one row with ``x_rows=1``), streamed x is
  ``stages`` buffers of ``bm x bk x steps per copy``, staged weights add their tiles;
  a schedule that does not fit is infinitely slow;
* **latency**: a block's K loop costs per step its issue (MMAs and conversion, more
  with finer ``k_slice``) plus, for streamed x, the copy and its two barriers every
  ``steps per copy`` steps, and with ``stages=None`` an exposed L2 round trip per copy
  (the copy is waited for in place). An ``x_whole`` block pays one copy of its x
  before the loop and none inside it: what makes it the decode choice;
* **L2 traffic**: x copied into shared memory, every row of the block's (15 zero rows
  of 16 at M = 1 unless ``x_rows=1``), and the register body's prefetches clamped to a
  block's last step (``prefetch`` redundant tiles per block: deep prefetch on short
  blocks costs);
* **split-K reduction**: the partial sums' bytes plus the last block's fence and pass
  (fused) or a second launch (``fused_split=False``).

The prediction combines the bytes, FLOPs, latency and L2-traffic times as an imperfect
overlap (a 3-norm: at least the largest) plus the split-K cost. Its job is ranking, so
the tuner measures only the top candidates (and always the library's built-in choice);
the ``exhaustive`` mode of the tuner reports how good that ranking was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.tune.errors import TuneError
from lowvm.tune.gpu import GpuSpec
from lowvm.tune.problem import Problem

__all__ = ["Estimate", "occupancy", "estimate", "rank"]

_ALU_OPS_PER_WEIGHT = 3.0   # unpack, convert, scale (amortised over vector instructions)
#: addresses, loop counters (ptxas, sm_90: an int4 x_whole decode block of 128 threads
#: takes 64 registers at prefetch 1, 72 at 2, 96 at 4; a streamed one 96 at prefetch 2)
_REG_OVERHEAD = 12
_REG_STREAMED_X = 24        # x copy addresses and pipeline indices of streamed x
_MMA_K_FRAG = 16            # converted weights are consumed one MMA K step at a time
_X_COPY_SHARE = 0.4         # of a streamed step's issue: its x copy and two barriers
#                             (sm_90 SASS: 222 -> 136 instructions per warp and step
#                             without them, split-8 decode)
_SLICE_COST = 0.03          # extra issue per additional k_slice of a step (extracts,
#                             ldmatrix address math), as a share of a step


@dataclass(frozen=True)
class _View:
    """What the model needs of a schedule (``k_slice`` resolved: the step where 0)."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    split: int
    stages: int | None
    prefetch: int
    weights_shared: bool
    fused_split: bool
    steps_per_copy: int
    l2_ahead: int
    k_slice: int
    x_whole: int
    rows: int

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


def _view(s: GemmSchedule) -> _View:
    if not isinstance(s, GemmSchedule):
        raise TuneError(f"schedule={s!r}: the model takes a GemmSchedule")
    return _View(s.bm, s.bn, s.bk, s.warps_m, s.warps_n, s.split, s.stages, s.prefetch,
                 s.weights_shared, s.fused_split, s.steps_per_copy, s.l2_ahead,
                 s.k_slice or s.bk, s.x_whole, s.rows)


def _feasible(s: GemmSchedule, p: Problem) -> bool:
    from lowvm.tune.space import format_bk, runnable_reason

    return runnable_reason(s, p.m, p.n, p.k, format_bk(p)) is None


@dataclass(frozen=True)
class Estimate:
    """Predicted seconds and the parts they came from (seconds unless named)."""

    seconds: float
    memory: float
    tensor: float
    alu: float
    latency: float
    split_k: float
    blocks: int
    blocks_per_sm: int
    waves: int
    bytes_moved: int
    regs_per_thread: int
    smem_bytes: int
    l2: float = 0.0          # L2 -> SM traffic: x copies, prefetches clamped past the end

    @property
    def fits(self) -> bool:
        return math.isfinite(self.seconds)


def _weight_tile_bytes(v: _View, p: Problem) -> float:
    """Packed weights and scales of one block's K step."""
    return v.bn * v.bk * p.bits / 8 + max(1, v.bk // p.group) * v.bn * p.scale_bytes


def _smem_bytes(v: _View, p: Problem) -> int:
    if v.x_whole:  # x for the block's K range, once (one row with x_rows=1)
        return v.rows * v.x_whole * p.act_bytes
    x_tile = v.bm * v.bk * v.steps_per_copy * p.act_bytes
    if v.weights_shared:
        per_stage = x_tile + v.bn * v.bk * p.bits // 8 + max(1, v.bk // p.group) * v.bn * \
            p.scale_bytes
        return max(1, v.stages or 1) * per_stage
    return max(1, v.stages or 1) * x_tile


def _regs_per_thread(v: _View, p: Problem) -> int:
    acc = v.bm * v.bn // v.threads                                  # fp32 accumulators
    x_frag = (v.bm // v.warps_m) * v.k_slice // 64                  # fp16 pairs per lane
    w_frag = (v.bn // v.warps_n) * _MMA_K_FRAG // 64
    regs = acc + x_frag + w_frag + _REG_OVERHEAD
    if not v.weights_shared:  # `prefetch` steps of packed weights and scales per thread
        per_step = v.bn * v.bk * p.bits / 8 / v.threads / 4 + 1
        regs += math.ceil(v.prefetch * per_step)
    if not v.x_whole:
        regs += _REG_STREAMED_X
    return regs


def occupancy(s: GemmSchedule, p: Problem, gpu: GpuSpec) -> tuple[int, int, int]:
    """``(blocks per SM, registers per thread, shared bytes per block)``; 0 blocks when
    the block does not fit at all."""
    v = _view(s)
    regs = _regs_per_thread(v, p)
    smem = _smem_bytes(v, p)
    if regs > gpu.max_regs_per_thread or smem > gpu.smem_per_block or v.threads > 1024:
        return 0, regs, smem
    regs_alloc = -(-regs // 8) * 8 * v.threads   # registers are allocated per 8 per thread
    per_sm = min(gpu.max_threads_per_sm // v.threads, gpu.regs_per_sm // regs_alloc,
                 gpu.smem_per_sm // max(1, smem), gpu.max_blocks_per_sm)
    return per_sm, regs, smem


def _step_us(v: _View, gpu: GpuSpec) -> float:
    """Issue time of one K step of one block, x copy amortised over its steps."""
    mma_rows = v.bm // v.warps_m // 16              # MMA row tiles per warp
    issue = gpu.k_step_us * (1 - _X_COPY_SHARE) * (0.5 + 0.5 * mma_rows)
    issue += gpu.k_step_us * _SLICE_COST * (v.bk // v.k_slice - 1)
    if v.x_whole:
        return issue
    copy = gpu.k_step_us * _X_COPY_SHARE
    if not v.stages or v.stages < 2:  # the copy is waited for where it is issued
        copy += gpu.l2_latency_us
    return issue + copy / v.steps_per_copy


def estimate(s: GemmSchedule, p: Problem, gpu: GpuSpec) -> Estimate:
    """Predicted time of ``s`` on ``p`` (``inf`` if it does not fit or tile ``p``)."""
    v = _view(s)
    per_sm, regs, smem = occupancy(s, p, gpu)
    tiles_m, tiles_n = -(-p.m // v.rows), -(-p.n // v.bn)
    blocks = tiles_m * tiles_n * v.split
    split_bytes = 2 * v.split * p.m * p.n * 4 if v.split > 1 else 0
    moved = (p.weight_bytes * tiles_m + p.m * p.k * p.act_bytes + p.m * p.n * p.act_bytes
             + split_bytes)
    if per_sm == 0 or not _feasible(s, p):
        inf = math.inf
        return Estimate(inf, inf, inf, inf, inf, inf, blocks, per_sm, 0, moved, regs, smem)
    concurrent = gpu.sms * per_sm
    waves = -(-blocks // concurrent)
    resident = min(per_sm, -(-blocks // gpu.sms))        # blocks an SM actually holds
    busy_sms = min(gpu.sms, blocks)

    # Little's law: bytes in flight across the busy SMs vs what HBM needs to stream.
    if v.weights_shared:
        depth = max(1, (v.stages or 1) - 1)
        tile_bytes = _weight_tile_bytes(v, p) + v.bm * v.bk * p.act_bytes
    else:
        depth = v.prefetch + v.l2_ahead
        tile_bytes = _weight_tile_bytes(v, p)
    k_steps = p.k // (v.bk * v.split)
    in_flight = busy_sms * resident * min(depth, k_steps) * tile_bytes
    needed = gpu.hbm_tbps * 1e12 * gpu.mem_latency_us * 1e-6
    bandwidth = gpu.hbm_tbps * 1e12 * min(1.0, in_flight / needed)
    memory = (moved - split_bytes) / bandwidth

    block_flops = 2 * v.bm * v.bn * (p.k // v.split)
    sm_rate = gpu.tensor_tflops * 1e12 / gpu.sms
    tensor = waves * resident * block_flops / sm_rate if waves else 0.0
    alu = (p.n * p.k * tiles_m * v.warps_m * _ALU_OPS_PER_WEIGHT) / (
        gpu.alu_tops * 1e12 * busy_sms / gpu.sms)

    # the pipeline fill: the first weights from HBM, overlapped with the first x copy
    # from the L2 (all of x for x_whole, of every resident block at once)
    first_x = v.rows * (v.x_whole or v.bk * v.steps_per_copy) * p.act_bytes * resident
    fill = max(gpu.mem_latency_us,
               gpu.l2_latency_us + first_x / (gpu.l2_tbps * 1e6 / gpu.sms))
    latency = waves * (k_steps * _step_us(v, gpu) + fill) * 1e-6

    # L2 -> shared/register traffic that HBM time does not show: x copied into shared
    # memory (all ``rows`` rows of each block, zeros included) and, in the register
    # body, the ``prefetch`` loads of each block clamped to its last step
    copied = blocks * v.rows * (p.k // v.split) * p.act_bytes
    reloads = 0.0 if v.weights_shared else blocks * min(depth, k_steps) * tile_bytes
    l2 = (copied + reloads) / (gpu.l2_tbps * 1e12 * busy_sms / gpu.sms)

    split = 0.0
    if v.split > 1:
        split = ((gpu.arrive_us if v.fused_split else gpu.launch_us) * 1e-6
                 + split_bytes / (gpu.hbm_tbps * 1e12))
    seconds = _overlap(memory, tensor, alu, latency, l2) + split
    return Estimate(seconds, memory, tensor, alu, latency, split, blocks, per_sm, waves,
                    moved, regs, smem, l2)


def _overlap(*parts: float) -> float:
    """The parts' imperfect overlap: a p-norm (p = 3), at least their max and above it
    when two are close, so a schedule that shortens a part that is not the largest still
    ranks ahead (memory-bound decode ties otherwise)."""
    return sum(t ** 3 for t in parts) ** (1 / 3)


def rank(space: Sequence[GemmSchedule], p: Problem, gpu: GpuSpec
         ) -> list[tuple[GemmSchedule, Estimate]]:
    """The schedules that fit ``p``, fastest predicted first (ties: the earlier in
    ``space``, so the library space's built-in choice wins a tie)."""
    scored = [(i, s, estimate(s, p, gpu)) for i, s in enumerate(space)]
    fitting = sorted((ise for ise in scored if ise[2].fits),
                     key=lambda ise: (ise[2].seconds, ise[0]))
    return [(s, e) for _, s, e in fitting]
