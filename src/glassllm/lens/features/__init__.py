"""Features: sparse dictionaries of a model's named values, trained in the glass.

- `sae`: `SAE` (relu, topk, jumprelu) and `Transcoder`, forward and backward as the papers
  write them; `ops`: their activations, each a forward/backward pair;
- `train`: `train_dictionary`, streaming activations from a model over a corpus;
- `evaluate`: `evaluate_dictionary`, L0, FVU, dead/dense features, CE loss recovered;
- `saelens`: `save_saelens` / `load_saelens`, SAELens' on-disk format.
- `browse`: looking at features: top contexts, histograms, logit weights, a prompt's
  features, steering and ablation (`glassllm features show`, serve's Features view).

docs/features.md walks through them.
"""
from .sae import SAE, Transcoder

__all__ = ["SAE", "Transcoder", "train_dictionary", "evaluate_dictionary", "save_saelens",
           "load_saelens"]


def __getattr__(name):
    # The modules below land one by one; import lazily so `SAE` is usable from the start.
    if name == "train_dictionary":
        from .train import train_dictionary
        return train_dictionary
    if name == "evaluate_dictionary":
        from .evaluate import evaluate_dictionary
        return evaluate_dictionary
    if name in ("save_saelens", "load_saelens"):
        from . import saelens
        return getattr(saelens, name)
    raise AttributeError(f"module 'glassllm.lens.features' has no attribute {name!r}")
