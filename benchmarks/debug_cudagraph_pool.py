import torch, sys
torch._inductor.config.triton.cudagraph_trees_history_recording = True
sys.argv=["x"]
import pytest
sys.exit(pytest.main(["-q","-x","-p","no:cacheprovider","tests/test_decode_attention.py::test_gpu_fused_int4_model_rope_steps_under_cuda_graphs"]))
