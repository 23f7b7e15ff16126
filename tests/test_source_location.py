"""An error raised inside the kernel path names the user's line: the frames of torch (its
module call, custom ops), transformers and accelerate between that line and lowvm are
skipped, whether they are known by their module name or by their package folder.

Lines are found by a trailing ``# <- name`` mark.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

import lowvm
from lowvm import source_location
from lowvm.ir import ProgramError
from lowvm.kernels import dispatch
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.nn.layer import backend
from tests.helpers.marks import marked_line

HERE = os.path.basename(__file__)
LOWVM_DIR = os.path.dirname(os.path.abspath(lowvm.__file__))
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _line(mark: str) -> int:
    """The line of this file that ends with ``# <- mark``."""
    return marked_line(__file__, mark)


def _names_line(message: str, mark: str) -> bool:
    """Whether the message's first line is this file's line of ``mark``."""
    first = message.splitlines()[0]
    return re.match(rf"(.*[/\\])?{re.escape(HERE)}:{_line(mark)}: ", first) is not None


def _function_in(filename: str, module: str | None, source: str, name: str,
                 namespace: dict | None = None):
    """``name`` defined by ``source`` as if it were written in ``filename`` as module
    ``module`` (None: a namespace without ``__name__``, as ``exec`` gives)."""
    namespace = dict(namespace or {})
    if module is not None:
        namespace["__name__"] = module
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


_CALL = "def {name}(f, *args):\n    return f(*args)\n"


# ---------------------------------------------------------------------------------------
# the frame filter


def test_library_files_are_not_the_users():
    assert not source_location.is_user_file(os.path.join(TORCH_DIR, "_library",
                                                         "custom_ops.py"))
    assert not source_location.is_user_file(os.path.join(TORCH_DIR, "nn", "modules",
                                                         "module.py"))
    assert source_location.is_user_file(__file__)


def test_library_folder_reached_through_a_link_is_not_the_users(tmp_path):
    """A torch whose files are seen through a symbolic link (a linked environment):
    the resolved path is torch's."""
    link = tmp_path / "linked_torch"
    try:
        os.symlink(TORCH_DIR, link)
    except OSError:
        pytest.skip("symbolic links cannot be made here")
    assert not source_location.is_user_file(str(link / "_library" / "custom_ops.py"))


def test_library_frames_are_known_by_module_name(tmp_path):
    """torch, transformers and accelerate frames whose files lie outside any package
    folder this process imported (another copy, a relocated install) are still not the
    user's: their module names say whose they are."""
    lowvm_side = _function_in(os.path.join(LOWVM_DIR, "nn", "synthetic_layer.py"),
                              "lowvm.nn.synthetic_layer", _CALL.format(name="run"), "run")
    chain = [("torch._library.custom_ops", "torch/_library/custom_ops.py"),
             ("torch.nn.modules.module", "torch/nn/modules/module.py"),
             ("accelerate.hooks", "accelerate/hooks.py"),
             ("transformers.models.llama.modeling_llama",
              "transformers/models/llama/modeling_llama.py")]
    calls = [_function_in(str(tmp_path / "elsewhere" / relative), module,
                          _CALL.format(name="call"), "call") for module, relative in chain]
    # transformers calls accelerate calls torch's module call calls the custom op calls
    # lowvm, which asks where the user is
    outer, *inner = reversed(calls)
    loc = outer(*inner, lowvm_side, source_location.user_location)  # <- library chain
    assert loc.filename.endswith(HERE) and loc.lineno == _line("library chain"), loc


def test_user_modules_named_like_libraries_stay_the_users(tmp_path):
    """Only the libraries' own top-level packages are skipped, not names that merely
    start like them."""
    for module in ("torch_helpers", "my_transformers.model", "__main__"):
        call = _function_in(str(tmp_path / "app.py"), module, _CALL.format(name="call"),
                            "call")
        loc = call(source_location.user_location)
        assert loc.filename.endswith("app.py") and loc.lineno == 2, (module, loc)


# ---------------------------------------------------------------------------------------
# a QuantLinear call whose kernel path fails


def test_quant_linear_error_names_the_callers_line(monkeypatch):
    """The layer's forward (torch's module call, the ``torch.ops.lowvm.quant_linear``
    custom op, the backend, the dispatcher, the program build) fails to build a schedule
    the kernel refuses: the ProgramError names this file's line, not torch's."""
    layer = lowvm.QuantLinear(256, 128, dtype="int4", group_size=16)
    # the CPU call takes the kernel path of a GPU of sm_80, with x staged 4 deep in
    # copies of 16 K steps (256 KB of shared memory): quant_gemm's build refuses it
    monkeypatch.setattr(backend, "reference_quant_linear", backend.cuda_quant_linear)
    monkeypatch.setattr(dispatch, "_device_arch", lambda device: "sm_80")
    monkeypatch.setattr(dispatch, "_SM90", {})
    monkeypatch.setattr(dispatch, "_PLANS", {})
    monkeypatch.setattr(dispatch, "_tuned", lambda m, weight: None)
    bad = GemmSchedule(bm=128, bn=64, bk=16, warps_m=4, warps_n=4, split=1, stages=4,
                       prefetch=1, fused_split=False, x_steps=16)
    monkeypatch.setattr(dispatch, "choose_schedule", lambda *args, **kwargs: bad)
    x = torch.zeros(40, 256, dtype=torch.float16)
    with pytest.raises(ProgramError) as e:
        layer(x)  # <- quant linear
    message = str(e.value)
    assert _names_line(message, "quant linear"), message
    assert "over the limit" in message
    assert "custom_ops.py" not in message and "torch" not in message.splitlines()[0]
