"""Helpers of the serve tests: a `glassllm.serve` server in a thread of the test process, on
127.0.0.1 and a free port, and a small HTTP client (urllib) for it."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

from glassllm.model import Config, GlassLM
from glassllm.serve.app import Server, run
from glassllm.serve.limits import Limits
from glassllm.serve.models import Loaded, ModelStore


PROMPT = "Once upon a time there was a cat. Once upon a time"
CORRUPTED = "Once upon a time there was a dog. Once upon a time"  # one token differs


def tiny_model(seed: int = 0) -> GlassLM:
    """The serve tests' model: 2 layers of 32, grouped-query attention, max_len 64."""
    return GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=64), seed=seed)


class Running:
    """A started server: `base` (http://127.0.0.1:PORT), `token`, `call(...)`, `stop()`."""

    def __init__(self, loaded: Loaded | None, run_dir=None, limits: Limits = Limits(),
                 features=None):
        self.server = Server(ModelStore(loaded, None if run_dir is None else str(run_dir)),
                             run_dir=None if run_dir is None else str(run_dir), limits=limits,
                             features=features)
        ready = threading.Event()
        self.thread = threading.Thread(target=run, args=(self.server,), daemon=True,
                                       kwargs=dict(announce=lambda url: ready.set(), threads=1))
        self.thread.start()
        assert ready.wait(30), "the server did not start"
        self.url = self.server.url
        self.base, self.token = self.url.split("/?")[0], self.server.gate.token
        self.port = self.server.gate.port

    def call(self, path: str, body=None, token: str | None = "", method: str | None = None,
             headers: dict | None = None, raw: bytes | None = None, timeout: float = 60):
        """(status, parsed JSON or text) of one request; token "" means the right one, None
        none at all."""
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = "Bearer " + (token or self.token)
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, text = response.status, response.read().decode("utf-8")
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode("utf-8")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def stream(self, body: dict) -> list[dict]:
        request = urllib.request.Request(self.base + "/api/generate",
                                         data=json.dumps(body).encode(),
                                         headers={"Authorization": "Bearer " + self.token})
        with urllib.request.urlopen(request, timeout=120) as response:
            return [json.loads(line) for line in response]

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(15)
        assert not self.thread.is_alive(), "the server did not stop"
