"""prepare_weight says a CUDA device is needed (and what to use instead) before any work,
rather than letting torch fail with a bare AssertionError deep inside ``.to("cuda")``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lowvm.kernels.weights as weights
from lowvm.errors import LowvmError
from lowvm.kernels.weights import prepare_weight

N, K, GROUP = 64, 256, 128


def _inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (N, K)).astype(np.uint8)
    scales = rng.uniform(0.5, 1.5, (K // GROUP, N)).astype(np.float16)
    return codes, scales


@pytest.fixture
def no_cuda(monkeypatch):
    """A machine without CUDA (also on a GPU machine), where repacking would be a failure:
    the device check must come before it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def no_work(*args, **kwargs):
        raise AssertionError("prepare_weight repacked before checking the device")

    monkeypatch.setattr(weights, "weight_format", no_work)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_cuda_without_a_cuda_device_is_a_clear_error_before_any_work(no_cuda, device):
    codes, scales = _inputs()
    with pytest.raises(LowvmError) as e:
        prepare_weight(codes, scales, "int4", GROUP, device=device)
    message = str(e.value)
    assert f"device={device!r} needs a CUDA device" in message
    assert "torch.cuda.is_available() is False" in message
    assert "lowvm.QuantLinear" in message and "device='cpu'" in message


def test_the_default_device_is_cuda_and_is_checked(no_cuda):
    codes, scales = _inputs()
    with pytest.raises(LowvmError, match="device='cuda' needs a CUDA device"):
        prepare_weight(codes, scales, "int4", GROUP)


@pytest.mark.parametrize("device", ["gpu0", 3.5, "cuda:x"])
def test_a_device_that_is_not_one_is_named(device):
    codes, scales = _inputs()
    with pytest.raises(LowvmError, match=r"device must be a torch device or its name.*got "
                                         + repr(device).replace(".", r"\.")):
        prepare_weight(codes, scales, "int4", GROUP, device=device)


def test_a_cuda_index_beyond_the_machine_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    codes, scales = _inputs()
    with pytest.raises(LowvmError, match=r"device='cuda:5' does not exist; this machine has 2 "
                                         r"CUDA device\(s\): cuda:0\.\.cuda:1"):
        prepare_weight(codes, scales, "int4", GROUP, device="cuda:5")


def test_cpu_still_holds_the_repacked_weight(no_cuda, monkeypatch):
    monkeypatch.undo()  # the real weight_format and is_available
    codes, scales = _inputs()
    weight = prepare_weight(codes, scales, "int4", GROUP, device="cpu")
    assert weight.packed.device.type == "cpu" and weight.scales.device.type == "cpu"
    assert (weight.n, weight.k, weight.group) == (N, K, GROUP)
    np.testing.assert_array_equal(weight.scales.numpy(), scales)
