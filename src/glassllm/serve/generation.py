"""Generation one token at a time for the page's stream: exactly what `glassllm generate`
does (the same prompt ids, `Generator`, seeded `np.random.default_rng`, stop tokens and
`StreamDecoder`), so a seed gives the same text in the page as on the command line
(`tests/test_serve_browser.py` compares them), plus what the page shows of each step: the
top of the distribution the token was drawn from (`sampling_distribution`).
"""
from __future__ import annotations

import numpy as np

from ..tokenizers import StreamDecoder, start_id
from ..generate import Generator, Sampling, mask_padding, sampling_distribution
from .analyses import one
from .models import encode_prompt


class Generation:
    """One generation: `step()` draws a token and returns what the page shows of it.

    Args:
        loaded: the model (`glassllm.serve.models.Loaded`).
        prompt: text ("" samples unconditionally from the tokenizer's start id).
        sampling: temperature, top-k, top-p. seed: None for a fresh, unseeded rng.
        k: alternatives shown per step.
    """

    def __init__(self, loaded, prompt: str, sampling: Sampling, seed: int | None, k: int):
        tokenizer = loaded.tokenizer
        self.loaded, self.sampling, self.k = loaded, sampling, k
        ids = encode_prompt(tokenizer, prompt)
        if not ids:
            ids = [start_id(tokenizer)]
        self.prompt_ids = ids
        self.stop_ids = set(getattr(tokenizer, "stop_ids", (tokenizer.eot_id,)))
        # as `glassllm generate`: draw only ids the tokenizer can decode
        self.generator = Generator(loaded.model, ids, vocab_limit=tokenizer.vocab_size)
        self.rng = np.random.default_rng(seed)
        self.decoder = StreamDecoder(tokenizer, prev_id=ids[-1])

    def step(self) -> dict:
        """Draw the next token: {"id", "text" (the decoded text it completes, maybe ""),
        "piece" (the token alone), "prob", "top": [[piece, p, id], ...], "stop": bool}."""
        # the ids past the tokenizer's masked, as Generator.next_token draws
        logits = mask_padding(self.generator.next_logits(), self.generator.vocab_limit)
        probs = sampling_distribution(logits, self.sampling)
        token = self.generator.next_token(self.sampling, self.rng)
        top = np.argsort(-probs, kind="stable")[:self.k]
        stop = token in self.stop_ids
        return dict(id=int(token), piece=self.loaded.texts(token), prob=one(probs[token], 6),
                    text="" if stop else self.decoder.push(token), stop=stop,
                    top=[[self.loaded.texts(i), one(probs[i], 6), int(i)] for i in top
                         if probs[i] > 0])

    def flush(self) -> str:
        """The text held back for an unfinished UTF-8 character (as the CLI's last print)."""
        return self.decoder.flush()
