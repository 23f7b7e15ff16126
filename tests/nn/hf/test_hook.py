"""``import lowvm`` registers lowvm with transformers whichever module is imported first,
without a false "could not register" warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

ORDERS = [
    "import lowvm; from transformers import AutoModelForCausalLM; import lowvm.nn.hf.quantizer",
    "import lowvm.nn.hf.quantizer",
    "import lowvm; import transformers.quantizers.auto",
    "import transformers.quantizers.auto; import lowvm",
]


@pytest.mark.slow
@pytest.mark.parametrize("imports", ORDERS)
def test_registered_without_warnings_in_any_import_order(imports):
    check = ("; from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING as M"
             "; print(M['lowvm'].__name__)")
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", imports + check],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "LowvmHfQuantizer"
