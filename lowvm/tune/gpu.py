"""The machine figures the static model needs, with the H100 we benchmark on.

Bandwidth and tensor-core rate are the ones measured on the benchmark H100 (3.04 TB/s
read; cuBLAS fp16 reached 760-798 TFLOP/s), not datasheet peaks, so the model predicts
achievable times. Resource limits are the sm_90 per-SM limits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from lowvm.tune.errors import TuneError

__all__ = ["GpuSpec", "H100_SXM", "current_gpu"]


@dataclass(frozen=True)
class GpuSpec:
    """Throughputs, latencies and per-SM resource limits of one GPU."""

    name: str
    sms: int = 132
    hbm_tbps: float = 3.04
    tensor_tflops: float = 790.0          # fp16/bf16 dense MMA with fp32 accumulation
    alu_tops: float = 33.5                # 32-bit ALU ops/s (132 SMs x 128 lanes x ~2 GHz)
    l2_bytes: int = 50 * 1024 * 1024
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 227 * 1024
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    mem_latency_us: float = 0.8           # one HBM round trip under load
    k_step_us: float = 0.06               # issue + barrier cost of one K step of a block
    launch_us: float = 2.5                # an unfused split-K reduction: a second kernel
    arrive_us: float = 1.0                # a fused one: the last block's fence, ticket
    #                                       and pass over its tile
    l2_latency_us: float = 0.35           # one L2 round trip (an x copy waited for)
    l2_tbps: float = 10.0                 # L2 -> SM bandwidth, all SMs together

    def __post_init__(self) -> None:
        for name in ("sms", "hbm_tbps", "tensor_tflops", "alu_tops", "regs_per_sm",
                     "smem_per_sm", "max_threads_per_sm", "max_blocks_per_sm", "l2_tbps"):
            if not getattr(self, name) > 0:
                raise TuneError(f"GpuSpec.{name}={getattr(self, name)!r}: must be positive")

    def with_(self, **changes: Any) -> GpuSpec:
        """A copy with some figures replaced (e.g. a measured bandwidth)."""
        return replace(self, **changes)


H100_SXM = GpuSpec("NVIDIA H100 80GB HBM3")


def current_gpu() -> GpuSpec:
    """The spec of torch's current CUDA device: its name and SM count on the H100 figures
    (the only machine measured so far)."""
    import torch

    if not torch.cuda.is_available():
        raise TuneError("current_gpu: no CUDA device")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return H100_SXM.with_(name=props.name, sms=props.multi_processor_count)
