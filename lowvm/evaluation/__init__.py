"""Quantization quality on a trained model: lowvm's quality benchmark.

A small Llama is trained from scratch on the Python standard library's sources (byte
tokens, so every machine has the data and no tokenizer is needed), then quantized copies
are scored by held-out perplexity per byte. Random-weight models say nothing about this:
their outputs carry no information a rounding error could destroy. This package sits
above :mod:`lowvm.serving` (it reuses its per-layer error helpers); nothing in lowvm
imports it: ``python -m lowvm.bench quality`` runs it as a command.
"""

from lowvm.evaluation.configs import RECIPES, ModelRecipe, llama_config, recipe
from lowvm.evaluation.corpus import Corpus, is_heldout, load_corpus, sequences, source_files
from lowvm.evaluation.errors import EvaluationError
from lowvm.evaluation.perplexity import Score, perplexity
from lowvm.evaluation.train import Trained, train
from lowvm.evaluation.variants import DEFAULT_VARIANTS, Variant, parse_variant, parse_variants

__all__ = ["RECIPES", "ModelRecipe", "llama_config", "recipe", "Corpus", "is_heldout",
           "load_corpus", "sequences", "source_files", "EvaluationError", "Score",
           "perplexity", "Trained", "train", "DEFAULT_VARIANTS", "Variant", "parse_variant",
           "parse_variants"]
