"""Differential fuzzing of lowvm's compiler: ``python -m lowvm.fuzz`` (docs/fuzzing.md).

Random valid VM programs (:mod:`lowvm.fuzz.generate`, described by
:class:`lowvm.fuzz.spec.Spec`) run in the interpreter against an independent numpy
reference (:mod:`lowvm.fuzz.reference`), through ptxas, and on the GPU against the
interpreter (:mod:`lowvm.fuzz.check`); failures shrink (:mod:`lowvm.fuzz.shrink`) to
regression cases. It sits above :mod:`lowvm.lang` and :mod:`lowvm.driver`; nothing in
lowvm imports it. A run: :func:`lowvm.fuzz.run.run` with a
:class:`lowvm.fuzz.run.FuzzConfig`.
"""

from lowvm.fuzz.generate import generate
from lowvm.fuzz.spec import Spec, spec_from_json, spec_to_json

__all__ = ["generate", "Spec", "spec_from_json", "spec_to_json"]
