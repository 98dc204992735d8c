"""What one request may ask of the server, checked before any work starts.

A request over a limit is refused with a one-line 4xx naming the limit (413 for sizes); the
defaults let every analysis of a model the size of GPT-2 small run on a prompt of a few
hundred tokens, and keep the slowest request (a patching sweep) to seconds on two cores.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Limits:
    """body_bytes: a request body (JSON). prompt_bytes: one prompt (UTF-8 bytes); its tokens
    must also fit the model's max_len. memory_bytes: the arrays one analysis would hold (its
    trace, `glassllm.lens.trace.estimate_bytes`, plus the logit lens' (L+1, T, V) float64
    arrays). attention_values: attention weights in one answer. patch_forwards: cells of one
    patching sweep times their tokens (each cell is one forward). max_new_tokens: one
    generation. top_k: alternatives listed per position or step.

    What one client may hold (`glassllm.serve.work`): client_requests: model requests (analyses,
    sweeps, generation streams) of one client address in flight at once (429 past it).
    idle_seconds: a connection with no request in progress -- one that has sent nothing, or
    only part of its headers -- is closed after this long. body_seconds: the whole request
    body must arrive within this (408). write_seconds: a stream whose reader takes none of it
    for this long is ended."""
    body_bytes: int = 1 << 20
    prompt_bytes: int = 16 << 10
    memory_bytes: int = 512 << 20
    attention_values: int = 2_000_000
    patch_forwards: int = 1 << 18
    max_new_tokens: int = 1024
    top_k: int = 20
    client_requests: int = 16
    idle_seconds: float = 5.0
    body_seconds: float = 10.0
    write_seconds: float = 30.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
