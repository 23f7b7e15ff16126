"""One small quantized matmul launch, for compute-sanitizer memcheck/racecheck runs."""

from __future__ import annotations

import numpy as np
import torch

import lowvm
from lowvm.kernels.quant_matmul import quant_matmul, quantize_weights

m, n, k, group = 17, 128, 256, 64
rng = np.random.default_rng(0)
packed, scales = quantize_weights(rng.standard_normal((n, k)), "int4", group)
x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float16)).cuda()
y = torch.zeros((m, n), dtype=torch.float16, device="cuda")
kernel = lowvm.compile(quant_matmul, wtype=lowvm.int4, group=group)
kernel(m, n, k, x, torch.from_numpy(packed).cuda(), torch.from_numpy(scales).cuda(), y)
torch.cuda.synchronize()
print("sanitize target ran; y[0, :4] =", y[0, :4].tolist())
