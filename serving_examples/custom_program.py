"""Author a small VM program and plug it into a quantized model.

The program is the SwiGLU activation of a Llama MLP, fused: ``h = silu(gate) * up`` in one
pass over float16 tiles (math in float32), where eager PyTorch makes three. The example

1. writes it with ``lowvm.lang``,
2. checks it against PyTorch on the CPU with ``lowvm.interpret`` (exact semantics),
3. swaps it into every MLP of a tiny random Llama whose linear layers are quantized to
   int4, and compares the model's logits with the unmodified quantized model,
4. on a CUDA machine runs the same program through ``lowvm.compile`` instead.

Run: ``python serving_examples/custom_program.py`` (seconds on a CPU).
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import lowvm
import lowvm.lang as vm

BLOCK = 512  # elements per thread block: 128 threads x 4


@vm.program(warps=4)
def silu_mul(n: vm.int32, gate: vm.ptr[vm.float16], up: vm.ptr[vm.float16],
             out: vm.ptr[vm.float16], block: int = BLOCK):
    """``out = gate * sigmoid(gate) * up`` elementwise over ``n`` values."""
    vm.set_grid(vm.cdiv(n, block))
    gg, gu, go = (vm.global_view(p, [n]) for p in (gate, up, out))
    start = [vm.block_index() * block]
    layout = vm.spatial(128).local(block // 128)
    g = vm.cast(vm.load_global(gg, start, [block], layout), vm.float32)
    u = vm.cast(vm.load_global(gu, start, [block], layout), vm.float32)
    h = g / (vm.exp(vm.neg(g)) + 1.0) * u
    vm.store_global(go, vm.cast(h, vm.float16), start)


class VmSiluMul:
    """Runs ``silu_mul`` on torch tensors: compiled on CUDA, interpreted on the CPU."""

    def __init__(self) -> None:
        self._compiled = None

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        shape, dtype = gate.shape, gate.dtype
        g = gate.to(torch.float16).contiguous().reshape(-1)
        u = up.to(torch.float16).contiguous().reshape(-1)
        n = g.numel()
        if g.is_cuda:
            if self._compiled is None:
                self._compiled = lowvm.compile(silu_mul, block=BLOCK)
            out = torch.empty_like(g)
            self._compiled(n, g, u, out)
        else:
            host = np.zeros(n, np.float16)
            lowvm.interpret(silu_mul, n, g.numpy(), u.numpy(), host, block=BLOCK)
            out = torch.from_numpy(host)
        return out.reshape(shape).to(dtype)


class FusedMLP(nn.Module):
    """A Llama MLP whose activation is the VM program (the projections are unchanged)."""

    def __init__(self, mlp: nn.Module, act: VmSiluMul) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="int4", help="weight type of the linear layers")
    parser.add_argument("--seq", type=int, default=12, help="prompt length")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=lowvm.nn.LowvmFallbackWarning)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)

    act = VmSiluMul()
    g, u = (torch.randn(1000, dtype=torch.float16, device=device) for _ in range(2))
    ref = (torch.nn.functional.silu(g.float()) * u.float()).half()
    err = (act(g, u).float() - ref.float()).abs().max().item()
    print(f"silu_mul on {device} ({'compiled' if device == 'cuda' else 'interpreted'}): "
          f"max |error| vs torch = {err:.2e}")

    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).to(device, torch.float16).eval()
    lowvm.quantize_model(model, dtype=args.dtype, group_size=64, progress=False)
    ids = torch.randint(0, config.vocab_size, (1, args.seq), device=device)
    with torch.no_grad():
        before = model(ids).logits.float()
        for layer in model.model.layers:
            layer.mlp = FusedMLP(layer.mlp, act)
        after = model(ids).logits.float()
    rel = ((after - before).norm() / before.norm()).item()
    same = (after.argmax(-1) == before.argmax(-1)).float().mean().item()
    print(f"quantized ({args.dtype}) Llama with the VM activation: logits rel. diff {rel:.2e}, "
          f"top-1 agreement {same:.0%}")


if __name__ == "__main__":
    main()
