"""The lens: looking inside a model and a training run.

- `trace`: named values of a forward (and their gradients), edits, hooks (`run_with_hooks`),
  `to_str_tokens`; the frozen names table;
- `transformer_lens_names`: glassllm's names and TransformerLens' hook names, both ways;
- `interpret`: logit lens, direct logit attribution, ablation, patching, head detector;
- `graph`: the autograd graph as DOT/SVG;
- `health`: a training run's health rows and warnings;
- `report`: the page of `glassllm inspect`; `plots`: loss and health plots.
"""
