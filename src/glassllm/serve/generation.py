"""Generation one token at a time for the page's stream: exactly what `glassllm generate`
does (the same prompt ids, `Generator`, seeded `np.random.default_rng`, stop tokens and
`StreamDecoder`), so a seed gives the same text in the page as on the command line
(`tests/test_serve_browser.py` compares them), plus what the page shows of each step: the
top of the distribution the token was drawn from (`sampling_distribution`). `stream_tokens`
sends a generation's tokens down a stream (`glassllm.serve.app.generate`), one model turn
(`glassllm.serve.work.Lanes.model_work`) per token.
"""
from __future__ import annotations

import asyncio
import json
import sys
import traceback

import numpy as np

from ..tokenizers import StreamDecoder, start_id
from ..generate import Generator, Sampling, mask_padding, sampling_distribution
from ..lens.interpret import Cancelled
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


async def stream_tokens(lanes, loaded, gen: Generation, n: int, response,
                        write_seconds: float) -> dict:
    """Draw up to n tokens of `gen`, each in its own turn of `loaded` on `lanes`, and send each
    as a JSON line to `response` (`send_line`) before drawing the next. Returns the stream's
    last message: {"event": "end", "reason": "length" | "stop", "text"} or {"event": "error",
    "error"} (the server stopping, a model whose logits are NaN, a bug: said, not raised).

    Raises:
        ConnectionError, asyncio.TimeoutError: the reader went away, or took nothing for
            write_seconds. asyncio.CancelledError: the handler was cancelled.
    """
    end = dict(event="end", reason="length")
    try:
        for index in range(n):  # (model_work raises Cancelled once the server is stopping)
            token = await lanes.model_work(loaded, lambda should_stop: gen.step())
            await send_line(response, dict(event="token", index=index, **token), write_seconds)
            if token["stop"]:
                end["reason"] = "stop"
                break
        end["text"] = gen.flush()
    except Cancelled:
        return dict(event="error", error="the server is stopping")
    except ValueError as e:  # e.g. a model whose logits are NaN: said in the stream
        return dict(event="error", error=" ".join(str(e).split())[:500])
    except (ConnectionError, asyncio.TimeoutError, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 -- a bug: end the stream saying so, keep serving
        traceback.print_exc(file=sys.stderr)
        return dict(event="error", error=f"internal error: {type(e).__name__}: {e}"[:500])
    return end


async def send_line(response, message: dict, write_seconds: float) -> None:
    """One JSON line of a stream. Raises asyncio.TimeoutError when the reader takes none of it
    for `write_seconds` (a reader that stopped reading holds nothing past that)."""
    data = (json.dumps(message, allow_nan=False) + "\n").encode()
    await asyncio.wait_for(response.write(data), write_seconds)
