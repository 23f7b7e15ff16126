"""Run one test with torch.compile's CUDA-graph-tree allocation history on, so a "tensors in
the cudagraph pool not tracked" error names where each leaked tensor was allocated.

    python benchmarks/debug_cudagraph_pool.py [TEST_ID]
"""

from __future__ import annotations

import sys

import pytest
import torch

DEFAULT = ("tests/test_decode_attention.py::"
           "test_gpu_fused_int4_model_rope_steps_under_cuda_graphs")

if __name__ == "__main__":
    torch._inductor.config.triton.cudagraph_trees_history_recording = True
    test = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    sys.exit(pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--runxfail", test]))
