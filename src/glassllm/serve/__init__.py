"""`glassllm serve`: look inside a live model, and a running training, in the browser.

    glassllm serve --model runs/model.safetensors [--run runs] [--port 0] [--open]

A local web app (aiohttp): one page (`page/`, served by the package itself, loading nothing
from anywhere) and one JSON API that the page uses and a script can use too (docs/serve.md).
Its answers are the library's own analyses (`glassllm.lens.interpret`, `glassllm.lens.trace`,
`glassllm.generate`, `glassllm.lens.health`): the server adds no arithmetic of its own.

- `app`: the server (routes, the guard, streaming, start and stop); needs aiohttp, the extra
  `glassllm[serve]`.
- `security`: the session token, Host and Origin checks. `fields`: request bodies, checked.
  `limits`: what one request may cost.
- `models`: the models (the --model one, the run's files), their locks. `analyses`: the
  answers. `generation`: generation one token at a time, as `glassllm generate`.
- `work`: where the work runs: a quick lane for the page, /api/info and the training poll;
  each model's work in its fair turn, cancellable; the per-client bound.
- `run`: a training run read from its files while it runs (incrementally, with size caps).
  `page`: the page's HTML.

Nothing here is imported by `import glassllm`; importing this package does not need aiohttp
(only `glassllm.serve.app` does).
"""
