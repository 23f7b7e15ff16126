"""A model card beside every saved lowvm checkpoint: without ``import lowvm`` transformers
does not know the ``"lowvm"`` quantization method, skips it with a warning and builds
plain, randomly initialised ``nn.Linear`` layers. transformers offers a quantizer no way to
refuse that load, so the card (and the README) say it first, where a person looks.

:func:`attach_model_card` wraps one model's ``save_pretrained`` (the instance, not the
class) so that every save also writes ``README.md``, unless the directory already has one.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["attach_model_card", "model_card", "CARD_NAME"]

CARD_NAME = "README.md"


def model_card(model: nn.Module) -> str:
    """The card's text: what the checkpoint is and the two lines that load it."""
    config = getattr(model, "config", None)
    qconfig = getattr(config, "quantization_config", None)
    modules = getattr(qconfig, "modules", {}) or {}
    kinds = sorted({f"{e.get('dtype')} (group {e.get('group_size')})" for e in modules.values()})
    arch = ", ".join(getattr(config, "architectures", None) or [type(model).__name__])
    return f"""---
library_name: transformers
tags:
- lowvm
- quantized
---

# {arch}, quantized with lowvm

**Load this checkpoint only after `import lowvm`.** Its linear layers are stored in
lowvm's packed format (quantization method `"lowvm"`). Without `import lowvm`, transformers
does not know that method: it warns "Unknown quantization type", skips it and builds plain
layers with *random* weights, and the model still runs, producing garbage.

```python
import lowvm                                   # registers the "lowvm" method
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("<this directory or repo id>")
```

- quantized layers: {len(modules)} ({", ".join(kinds) or "none recorded"})
- every layer's format is in `config.json` under `quantization_config.modules`
- lowvm: `pip install lowvm`
"""


def _save_with_card(save: Any, model: nn.Module, save_directory: Any, *args: Any,
                    **kwargs: Any) -> Any:
    out = save(save_directory, *args, **kwargs)
    card = Path(save_directory) / CARD_NAME
    if kwargs.get("is_main_process", True) and not card.exists():
        card.write_text(model_card(model))
    return out


def attach_model_card(model: nn.Module) -> None:
    """Make ``model.save_pretrained`` also write the card (idempotent)."""
    save = getattr(model, "save_pretrained", None)
    if save is None or getattr(save, "_lowvm_card", False):
        return
    wrapped = functools.partial(_save_with_card, save, model)
    wrapped._lowvm_card = True  # type: ignore[attr-defined]
    object.__setattr__(model, "save_pretrained", wrapped)
