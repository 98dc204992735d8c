"""The lens: looking inside a model and a training run.

- `trace`: named values of a forward (and their gradients), edits; the frozen names table;
- `interpret`: logit lens, direct logit attribution, ablation, patching, head detector;
- `graph`: the autograd graph as DOT/SVG;
- `health`: a training run's health rows and warnings;
- `report`: the page of `glassllm inspect`; `plots`: loss and health plots.
"""
