"""`glassllm serve` speed: one analysis of a 64-token prompt through the HTTP API, and
generation streamed by the server against the CLI's own loop.

    python bench/serve_speed.py                 # the default model of `glassllm train`, stories260K
    python bench/serve_speed.py --repeats 5 --new-tokens 200

Models: the default model of `glassllm train` (llama, d_model 128, 4 layers, 4 heads, 2 KV
heads, byte vocabulary, max_len 64; untrained weights: speed does not depend on them) and
llama2.c's stories260K (../shared/data/llama2c, when present). The server runs in this process
on 127.0.0.1 (port 0) and is called with urllib like any script, so each figure includes HTTP,
JSON and the token check. Per call: the median of --repeats, after one warm-up call.

- analyze: POST /api/analyze (surprise, logit lens, head types, every head's attention);
  attribution, ablate (one head), attention (one layer), patch (residual_in sweep, layer x
  position: L x 64 forwards) likewise.
- generation: POST /api/generate streaming --new-tokens tokens (temperature 0.8, seed 0),
  tokens/s from the request to the last line; against the CLI's loop (`Generator.next_token`
  + `StreamDecoder`, what `glassllm generate` runs) on the same prompt and seed, in process.
  Both must give the same tokens (else the bench exits non-zero), on the same threads.

Threads: as the server chooses them (`cpu.choose_threads`: the cores other processes leave
free), or --threads.

The load of other processes over each model's runs is printed with it: this machine is shared.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import json
import os
import threading
import time
import urllib.request

import numpy as np

from glassllm.engine import cpu
from glassllm.tokenizers import ByteTokenizer, StreamDecoder
from glassllm.generate import Generator, Sampling
from glassllm.model import Config, GlassLM
from glassllm.serve.app import Server, run
from glassllm.serve.models import Loaded, ModelStore, encode_prompt

PROMPT_64_BYTES = "Once upon a time there was a little cat who liked the sun. One day"[:64]
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
         "the park with her friends. One day, she saw a big red ball under a tree and she ran "
         "to get it. Her mom said to be careful, and Lily smiled.")


def default_model():
    cfg = Config(vocab_size=257, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, max_len=64)
    return GlassLM(cfg, seed=0), ByteTokenizer(), PROMPT_64_BYTES


def stories260k():
    from glassllm.formats import llama2c
    folder = os.path.join(common.REPO, "..", "shared", "data", "llama2c")
    if not os.path.exists(os.path.join(folder, "stories260K.bin")):
        return None
    model = llama2c.from_llama2c(os.path.join(folder, "stories260K.bin"))
    tokenizer = llama2c.tokenizer_from_llama2c(os.path.join(folder, "tok512.bin"))
    ids = encode_prompt(tokenizer, STORY)
    text = STORY
    while len(encode_prompt(tokenizer, text)) > 64:  # a prompt of 64 tokens (BOS included)
        text = text[:-1]
    return model, tokenizer, text


class Client:
    def __init__(self, server: Server):
        self.base, self.token = server.url.split("/?")[0], server.gate.token

    def post(self, path: str, body: dict):
        request = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                         headers={"Authorization": "Bearer " + self.token})
        with urllib.request.urlopen(request) as response:
            return [json.loads(line) for line in response] if path.endswith("generate") \
                else json.loads(response.read())


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def cli_loop(model, tokenizer, prompt: str, n: int, seed: int) -> tuple[list[int], float]:
    """What `glassllm generate` runs per token (minus printing), timed."""
    start = time.perf_counter()
    ids = encode_prompt(tokenizer, prompt)
    generator = Generator(model, ids, vocab_limit=tokenizer.vocab_size)
    rng, decoder = np.random.default_rng(seed), StreamDecoder(tokenizer, prev_id=ids[-1])
    stops = set(getattr(tokenizer, "stop_ids", (tokenizer.eot_id,)))
    out = []
    for _ in range(n):
        token = generator.next_token(Sampling(0.8), rng)
        if token in stops:
            break
        decoder.push(token)
        out.append(token)
    return out, time.perf_counter() - start


def bench_model(name: str, model, tokenizer, prompt: str, repeats: int, n_new: int,
                threads: int) -> None:
    server = Server(ModelStore(Loaded("", name, model, tokenizer)))
    ready = threading.Event()
    thread = threading.Thread(target=run, args=(server,), daemon=True,
                              kwargs=dict(announce=lambda u: ready.set(), threads=threads))
    thread.start()
    ready.wait(30)
    client = Client(server)
    T = len(encode_prompt(tokenizer, prompt))
    meter = cpu.LoadMeter()
    rows = {}
    for call, body in (("analyze", dict(prompt=prompt)),
                       ("attention", dict(prompt=prompt, layer=0)),
                       ("attribution", dict(prompt=prompt)),
                       ("ablate", dict(prompt=prompt, heads=[[0, 1]])),
                       ("patch", dict(clean=prompt, corrupted=prompt[::-1]))):
        if call == "patch" and len(encode_prompt(tokenizer, prompt[::-1])) != T:
            continue
        rows[call] = timed(lambda: client.post("/api/" + call, body), repeats)
    stream = []

    def generate():
        stream[:] = client.post("/api/generate", dict(prompt=prompt[:20], max_new_tokens=n_new,
                                                       temperature=0.8, seed=0))
    served = timed(generate, repeats)
    tokens = [m["id"] for m in stream if m["event"] == "token" and not m["stop"]]
    cli_times = []
    with cpu.use_threads(threads):  # as the server computes
        for _ in range(repeats + 1):
            expected, seconds = cli_loop(model, tokenizer, prompt[:20], n_new, 0)
            cli_times.append(seconds)
    if expected != tokens:
        raise SystemExit(f"{name}: the server's tokens differ from the CLI loop's")
    load = meter.read()
    server.stop()
    thread.join(10)
    cli = float(np.median(cli_times[1:]))
    print(f"\n{name}: {T}-token prompt, {threads} thread(s); other processes kept "
          f"{load.other_cores:.2f} of {load.cpus} cores busy during these runs")
    for call, seconds in rows.items():
        print(f"  POST /api/{call:<12} {seconds * 1000:8.1f} ms")
    print(f"  generation, {len(tokens)} tokens: served {len(tokens) / served:8.1f} tokens/s, "
          f"CLI loop {len(tokens) / cli:8.1f} tokens/s (ratio {cli / served:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads (default: as the server chooses, cpu.choose_threads)")
    args = parser.parse_args()
    threads = cpu.choose_threads(args.threads)[0]
    print(common.blas_report())
    models = [("default model of glassllm train", *default_model())]
    stories = stories260k()
    if stories is not None:
        models.append(("stories260K", *stories))
    for name, model, tokenizer, prompt in models:
        n_new = min(args.new_tokens, model.cfg.max_len - 24)
        bench_model(name, model, tokenizer, prompt, args.repeats, n_new, threads)


if __name__ == "__main__":
    main()
