"""A static performance model: predict a schedule's time without running it.

The model is a roofline with the effects that decide between tile shapes:

* **bytes**: every row of M tiles re-reads all weights and scales (``ceil(M/bm)``
  passes), plus the activations once, the output, and for split-K the fp32 partial
  sums written and read back; time = bytes / the bandwidth the block count can draw.
  That bandwidth follows Little's law: an SM keeps ``(stages - 1)`` tiles of loads in
  flight per resident block, and HBM needs ``bandwidth x latency`` bytes in flight
  to stream at full rate;
* **FLOPs**: MMAs on the padded tiles at the tensor-core rate of the SMs in use,
  wave by wave (``ceil(blocks / (132 x blocks per SM))`` waves), plus the ALU work of
  dequantising each weight once per M tile;
* **occupancy**: blocks per SM from threads, registers (accumulators and fragments)
  and shared memory (``stages`` buffers of x, W and scales); a schedule that does not
  fit is infinitely slow;
* **latency**: a block's K loop costs ``k_steps x k_step_us`` and a pipeline fill,
  per wave: long K loops with few blocks are what split-K fixes;
* **split-K reduction**: about one extra launch (a second kernel, or the last block's
  fence, ticket and pass over the tile) plus its bytes.

The prediction is the largest of the bytes, FLOPs and latency times plus the split-K
cost. Its job is ranking, so the tuner measures only the top candidates; the
``exhaustive`` mode of the tuner reports how good that ranking was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lowvm.tune.gpu import GpuSpec
from lowvm.tune.schedule import Problem, Schedule, feasible

__all__ = ["Estimate", "occupancy", "estimate", "rank"]

_ALU_OPS_PER_WEIGHT = 3.0   # unpack, convert, scale (amortised over vector instructions)
_REG_OVERHEAD = 40          # addresses, loop counters, pipeline indices
_MMA_K_FRAG = 16            # fragments are held for one MMA K step at a time


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

    @property
    def fits(self) -> bool:
        return math.isfinite(self.seconds)


def _smem_bytes(s: Schedule, p: Problem) -> int:
    per_stage = (s.bm * s.bk * p.act_bytes + s.bn * s.bk * p.bits // 8
                 + max(1, s.bk // p.group) * s.bn * p.scale_bytes)
    return s.stages * per_stage


def _regs_per_thread(s: Schedule) -> int:
    acc = s.bm * s.bn // s.threads                                # fp32 accumulators
    frag_a = (s.bm // s.warps_m) * _MMA_K_FRAG // 32 // 2            # fp16 pairs per lane
    frag_b = (s.bn // s.warps_n) * _MMA_K_FRAG // 32 // 2
    return acc + frag_a + frag_b + _REG_OVERHEAD


def occupancy(s: Schedule, p: Problem, gpu: GpuSpec) -> tuple[int, int, int]:
    """``(blocks per SM, registers per thread, shared bytes per block)``; 0 blocks when
    the block does not fit at all."""
    regs = _regs_per_thread(s)
    smem = _smem_bytes(s, p)
    if regs > gpu.max_regs_per_thread or smem > gpu.smem_per_block:
        return 0, regs, smem
    regs_alloc = -(-regs // 8) * 8 * s.threads   # registers are allocated per 8 per thread
    per_sm = min(gpu.max_threads_per_sm // s.threads, gpu.regs_per_sm // regs_alloc,
                 gpu.smem_per_sm // max(1, smem), gpu.max_blocks_per_sm)
    return per_sm, regs, smem


def estimate(s: Schedule, p: Problem, gpu: GpuSpec) -> Estimate:
    """Predicted time of ``s`` on ``p`` (``inf`` if it does not fit or tile ``p``)."""
    per_sm, regs, smem = occupancy(s, p, gpu)
    tiles_m, tiles_n = -(-p.m // s.bm), -(-p.n // s.bn)
    blocks = tiles_m * tiles_n * s.split_k
    split_bytes = 2 * s.split_k * p.m * p.n * 4 if s.split_k > 1 else 0
    moved = (p.weight_bytes * tiles_m + p.m * p.k * p.act_bytes + p.m * p.n * p.act_bytes
             + split_bytes)
    if per_sm == 0 or not feasible(s, p):
        inf = math.inf
        return Estimate(inf, inf, inf, inf, inf, inf, blocks, per_sm, 0, moved, regs, smem)
    concurrent = gpu.sms * per_sm
    waves = -(-blocks // concurrent)
    resident = min(per_sm, -(-blocks // gpu.sms))        # blocks an SM actually holds
    busy_sms = min(gpu.sms, blocks)

    # Little's law: bytes in flight across the busy SMs vs what HBM needs to stream.
    tile_bytes = s.bn * s.bk * p.bits / 8 + s.bm * s.bk * p.act_bytes
    in_flight = busy_sms * resident * max(1, s.stages - 1) * tile_bytes
    needed = gpu.hbm_tbps * 1e12 * gpu.mem_latency_us * 1e-6
    bandwidth = gpu.hbm_tbps * 1e12 * min(1.0, in_flight / needed)
    memory = (moved - split_bytes) / bandwidth

    block_flops = 2 * s.bm * s.bn * (p.k // s.split_k)
    sm_rate = gpu.tensor_tflops * 1e12 / gpu.sms
    tensor = waves * resident * block_flops / sm_rate if waves else 0.0
    alu = (p.n * p.k * tiles_m * _ALU_OPS_PER_WEIGHT) / (gpu.alu_tops * 1e12
                                                          * busy_sms / gpu.sms)

    k_steps = p.k // (s.bk * s.split_k)
    latency = waves * (k_steps * gpu.k_step_us + s.stages * gpu.mem_latency_us) * 1e-6

    split = 0.0
    if s.split_k > 1:
        split = gpu.launch_us * 1e-6 + split_bytes / (gpu.hbm_tbps * 1e12)
    seconds = max(memory, tensor, alu, latency) + split
    return Estimate(seconds, memory, tensor, alu, latency, split, blocks, per_sm, waves,
                    moved, regs, smem)


def rank(space: Sequence[Schedule], p: Problem, gpu: GpuSpec
         ) -> list[tuple[Schedule, Estimate]]:
    """The schedules that fit ``p``, fastest predicted first (ties: smaller schedule)."""
    scored = [(s, estimate(s, p, gpu)) for s in space]
    return sorted([se for se in scored if se[1].fits], key=lambda se: (se[1].seconds, se[0]))
