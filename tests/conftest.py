"""Test set-up: ``gpu`` tests are skipped, with a reason, where no CUDA device exists."""

from __future__ import annotations

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run `pytest -m gpu` on the device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
