"""Serving a quantized model: fused projections, decode attention on a VM program and
tensor-parallel shards."""
