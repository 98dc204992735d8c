"""The server of `glassllm serve`, on aiohttp (HTTP parsing, routing, streaming; nothing of
HTTP is parsed here): one page, and the JSON API that the page uses and a script can use too
(docs/serve.md lists every call).

Every request passes `guard` first: the Host, Origin and session-token checks
(`glassllm.serve.security`, 403), then its handler, whose refusals and errors all become a
4xx/5xx with `{"error": "one line"}` -- never a traceback page, never a dead server. Inputs are
checked, and the cost of the work against `Limits`, before any work starts. The work itself
(the library's analyses) runs in worker threads (`glassllm.serve.work`): the page, /api/info
and the training poll on a quick lane of their own, each model's work in its turn and under
its lock, cancelled when its client goes away -- so the server keeps answering while an
analysis runs, and no client can hold it.

Every model answer echoes what it answers: `model` (the name it resolved to), `prompt`, and the
client's own `request` id when one was sent, so a page can draw only the answer to its latest
request. Connections: one idle (nothing sent, or only part of its headers) is closed after
`Limits.idle_seconds`; a body must arrive within `Limits.body_seconds`; a refused request
(403) closes its connection.
"""
from __future__ import annotations

import asyncio
import errno
import functools
import json
import logging
import math
import secrets
import signal
import sys
import threading
import traceback

import numpy as np
from aiohttp import web

from ..checks import check_int
from ..generate import Sampling
from ..lens.interpret import AttributionError, Cancelled
from ..lens.trace import TraceTooLarge
from . import analyses
from . import features as feature_answers
from .fields import (RequestError, get_choice, get_int, get_list, get_real, get_str,
                     json_body)
from .generation import Generation, send_line, stream_tokens
from .limits import Limits
from .models import ModelStore, fit_prompt
from .page import CSP, render
from .run import RunWatcher
from .security import Gate, MalformedRequests, new_token
from .work import Lanes

SERVER = web.AppKey("server", object)
SAMPLE_TOKENS = 200  # most tokens of a training page sample
SHUTDOWN_SECONDS = 2.0  # what requests still running get on Ctrl-C


class Server:
    """What the handlers share: the models, the run, the limits, the gate, the lanes.

    Args:
        store: the models (`ModelStore`). run_dir: the training run to watch (None: none).
        limits: `Limits`. token: the session token (default: a fresh one).
        bind: the address the server binds (for the Host check). workers: threads of the model
            lane (`Lanes`). features: the Features view's dictionaries
            (`glassllm.serve.features.FeatureStore`), or None (no such view).
    """

    def __init__(self, store: ModelStore, run_dir: str | None = None,
                 limits: Limits = Limits(), token: str | None = None, bind: str = "127.0.0.1",
                 workers: int = 8, features=None):
        self.store, self.limits, self.features = store, limits, features
        self.watcher = RunWatcher(run_dir) if run_dir is not None else None
        self.gate = Gate(token or new_token(), port=0, bind=bind)
        self.lanes = Lanes(workers, limits.client_requests)
        self.url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def stop(self) -> None:
        """Stop the server (from any thread)."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def info(self) -> dict:
        """What the page starts from (GET /api/info): the model, the run, the limits;
        `default_model`, what a request with no model name answers about (None: the --model
        one, else the run's newest model file)."""
        main = self.store.main
        return dict(model=None if main is None else main.describe(),
                    default_model=None if main is not None else self.store.newest_model(),
                    run=None if self.watcher is None else self.watcher.run_dir,
                    run_models=self.store.run_models(), limits=self.limits.to_dict(),
                    targets=list(analyses.PATCH_TARGETS),
                    features=None if self.features is None else self.features.describe())


# --------------------------------------------------------------------------- the guard
def error(status: int, message: str, headers=None) -> web.Response:
    """The one form of every refusal and error: {"error": one line}."""
    return web.json_response({"error": " ".join(str(message).split())[:500]}, status=status,
                             headers=headers)


@web.middleware
async def guard(request: web.Request, handler):
    server = request.app[SERVER]
    reason = server.gate.refusal(request.headers, request.query.get("token"))
    if reason is not None:
        refused = error(403, reason)
        refused.force_close()  # no connection is held without the token
        return refused
    try:
        return await handler(request)
    except RequestError as e:
        if e.status == 408:  # a body too slow: answered, then the connection closed
            return await _closing(request, error(e.status, str(e)))
        return error(e.status, str(e))
    except web.HTTPException as e:  # aiohttp's own: 404, 405, 413 (body too large)
        if e.status < 400:
            raise
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        return error(e.status, f"{e.reason}: {request.method} {request.path[:100]}"
                     if e.status in (404, 405) else e.text or e.reason, allow)
    except AttributionError as e:  # not the request: the numbers disagree (shown as such)
        return error(422, f"self-check failed: {e}")
    except TraceTooLarge as e:
        return error(413, str(e))
    except Cancelled:  # the client is gone (nobody reads this), or the server is stopping
        return error(503, "stopped: the server is stopping, or the request was cancelled")
    except ValueError as e:  # the library refusing an input the checks let through
        return error(400, str(e))
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 -- a bug: say it in one line, log it, keep serving
        traceback.print_exc(file=sys.stderr)
        return error(500, f"internal error: {type(e).__name__}: {e}")


async def _closing(request: web.Request, response: web.Response) -> web.Response:
    """Send `response`, then close the connection at once (not waiting for the rest of a
    body that is not coming)."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    if request.protocol is not None:
        request.protocol.force_close()
    return response


async def _security_headers(request, response) -> None:
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Cache-Control", "no-store")


def _json(data) -> web.Response:
    return web.json_response(data, dumps=functools.partial(json.dumps, allow_nan=False,
                                                           separators=(",", ":")))


async def _body(request: web.Request, allowed: tuple[str, ...]) -> dict:
    limit = request.app[SERVER].limits.body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise RequestError(f"the body is {request.content_length:,} bytes, over the server's "
                           f"limit of {limit:,}", status=413)
    seconds = request.app[SERVER].limits.body_seconds
    try:
        raw = await asyncio.wait_for(request.read(), seconds)
    except asyncio.TimeoutError:
        raise RequestError(f"the body did not arrive within {seconds:g} s", status=408) \
            from None
    return json_body(raw, allowed)


def _request_id(body: dict):
    """The client's own id of this request (echoed as `request`), or None."""
    value = body.get("request")
    if value is None or isinstance(value, int) and not isinstance(value, bool) and \
            abs(value) < 2 ** 53:
        return value
    return get_str(body, "request", 100)


# --------------------------------------------------------------------------- request pieces
def _prompt_ids(server: Server, loaded, prompt: str, least: int = 2, what: str = "prompt"):
    """The prompt's ids (T,), T >= least; past max_len its first max_len (`fit_prompt`:
    every call cuts it alike, and analyze and tokenize say so in `cut`)."""
    ids, _ = fit_prompt(loaded, prompt)
    if len(ids) < least:
        raise RequestError(f"{what} is {len(ids)} token(s); this call needs at least {least} "
                           f"(one to predict from)")
    return np.asarray(ids, dtype=np.int64)


def _token(loaded, value, name: str):
    """A token given as its id (int) or its text (one token): the id; None stays None."""
    if value is None:
        return None
    vocab = loaded.model.cfg.vocab_size
    if isinstance(value, str):
        if len(value.encode("utf-8", "replace")) > 256:
            raise RequestError(f"{name} is longer than one token can be")
        ids = [int(i) for i in loaded.tokenizer.encode(value)]
        if len(ids) != 1:
            raise RequestError(f"{name} {value[:40]!r} is {len(ids)} tokens; give one token's "
                               f"text or its id")
        return ids[0]
    try:
        return check_int(value, name + " (a token id)", 0, vocab - 1)
    except ValueError as e:
        raise RequestError(str(e)) from None


def _position(body: dict, T: int) -> int:
    return get_int(body, "position", 0, T - 1, default=T - 1)


def _pairs(body: dict, cfg) -> list[tuple[int, int]]:
    heads = []
    for item in get_list(body, "heads", cfg.n_layers * cfg.n_heads, default=[]):
        if not (isinstance(item, list) and len(item) == 2):
            raise RequestError(f"heads must be [layer, head] pairs, got {json.dumps(item)[:40]}")
        heads.append((get_int({"layer": item[0]}, "layer", 0, cfg.n_layers - 1),
                      get_int({"head": item[1]}, "head", 0, cfg.n_heads - 1)))
    return heads


def _mlps(body: dict, cfg) -> list[int]:
    return [get_int({"mlp": m}, "mlp", 0, cfg.n_layers - 1)
            for m in get_list(body, "mlps", cfg.n_layers, default=[])]


def _k(server: Server, body: dict, default: int = 5) -> int:
    return get_int(body, "k", 1, server.limits.top_k, default=default)


# --------------------------------------------------------------------------- handlers
async def page(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    nonce = secrets.token_urlsafe(16)
    html = render(await server.lanes.quick(server.info), nonce)
    return web.Response(text=html, content_type="text/html",
                        headers={"Content-Security-Policy": CSP.format(nonce=nonce)})


async def info(request: web.Request) -> web.Response:
    server = request.app[SERVER]
    return _json(await server.lanes.quick(server.info))


def _model_call(fields: tuple[str, ...], run_default: bool = False):
    """Decorator: a model handler `job(server, loaded, body, should_stop)` run on the model
    lane (`Lanes.model_work`: in the model's turn, under its lock, cancellable), the body read
    and checked for `fields` (+ "model", "request") first. The answer echoes `model` (the name
    it resolved to), `prompt` (when the call takes one) and `request`. run_default: "model"
    absent means the run's newest model file rather than the --model one."""
    def wrap(job):
        async def handler(request: web.Request) -> web.Response:
            server = request.app[SERVER]
            body = await _body(request, ("model", "request") + fields)
            name = get_str(body, "model", 1024, default="")
            asked = _request_id(body)
            with server.lanes.client(request.remote):
                loaded = await server.lanes.load(
                    server.store.get, _model_name(server, name, run_default))
                answer = await server.lanes.model_work(
                    loaded, lambda should_stop: job(server, loaded, body, should_stop))
            answer.update(model=loaded.name, request=asked)
            if "prompt" in fields:
                answer["prompt"] = body.get("prompt") or ""
            return _json(answer)
        handler.__doc__ = job.__doc__
        return handler
    return wrap


def _model_name(server, name: str, run_default: bool) -> str:
    """The model a request names, or with `run_default` and no name the run's newest model
    file. Raises RequestError (404) when the run has none yet."""
    if not run_default or name:
        return name
    newest = server.store.newest_model()
    if newest is None:
        raise RequestError("the run has no model file yet (one is written at the first "
                           "evaluation)", status=404)
    return newest


@_model_call(("prompt",))
def tokenize(server, loaded, body, should_stop):
    """POST /api/tokenize: the prompt's tokens as the model cuts them."""
    prompt = get_str(body, "prompt", server.limits.prompt_bytes)
    ids = _prompt_ids(server, loaded, prompt, 0)
    return dict(model=loaded.name, ids=ids.tolist(), texts=[loaded.texts(i) for i in ids],
                cut=fit_prompt(loaded, prompt)[1])


@_model_call(("prompt", "k"))
def analyze(server, loaded, body, should_stop):
    """POST /api/analyze: tokens, surprise, logit lens, head types, attention; and
    `model_info`, the model's description (as /api/info's `model`)."""
    k = _k(server, body)
    prompt = get_str(body, "prompt", server.limits.prompt_bytes)
    ids = _prompt_ids(server, loaded, prompt)
    analyses.check_analysis(loaded, len(ids), server.limits)
    return dict(analyses.analyze(loaded, ids, k, server.limits), model_info=loaded.describe(),
                cut=fit_prompt(loaded, prompt)[1])


@_model_call(("prompt", "layer"))
def attention(server, loaded, body, should_stop):
    """POST /api/attention: the attention patterns of one layer (or all)."""
    layer = get_int(body, "layer", 0, loaded.model.cfg.n_layers - 1, default=None)
    ids = _prompt_ids(server, loaded, get_str(body, "prompt", server.limits.prompt_bytes), 1)
    return analyses.attention(loaded, ids, layer, server.limits)


@_model_call(("prompt", "position", "token", "against"))
def attribution(server, loaded, body, should_stop):
    """POST /api/attribution: direct logit attribution at a position, self-checked."""
    ids = _prompt_ids(server, loaded, get_str(body, "prompt", server.limits.prompt_bytes), 1)
    position = _position(body, len(ids))
    token, against = (_token(loaded, body.get(n), n) for n in ("token", "against"))
    return analyses.attribution(loaded, ids, position, token, against, server.limits)


@_model_call(("prompt", "heads", "mlps", "how", "position", "k"))
def ablate(server, loaded, body, should_stop):
    """POST /api/ablate: heads and MLPs zero- or mean-ablated: loss and next-token change."""
    cfg = loaded.model.cfg
    heads, mlps = _pairs(body, cfg), _mlps(body, cfg)
    how = get_choice(body, "how", ("zero", "mean"), default="zero")
    k = _k(server, body)
    ids = _prompt_ids(server, loaded, get_str(body, "prompt", server.limits.prompt_bytes))
    position = _position(body, len(ids))
    analyses.check_ablation(loaded, len(ids), server.limits)
    return analyses.ablation(loaded, ids, heads, mlps, how, position, k)


@_model_call(("clean", "corrupted", "target", "correct", "wrong", "position"))
def patch(server, loaded, body, should_stop):
    """POST /api/patch: activation patching, clean into corrupted, one cell at a time (asking
    `should_stop` between cells: a client that goes away stops it)."""
    target = get_choice(body, "target", analyses.PATCH_TARGETS, default="residual_in")
    limit = server.limits.prompt_bytes
    clean = _prompt_ids(server, loaded, get_str(body, "clean", limit), 1, "clean")
    corrupted = _prompt_ids(server, loaded, get_str(body, "corrupted", limit), 1, "corrupted")
    if len(clean) != len(corrupted):
        raise RequestError(f"clean is {len(clean)} tokens and corrupted {len(corrupted)}: "
                           f"patching needs prompts of the same length in tokens")
    position = _position(body, len(clean))
    correct, wrong = (_token(loaded, body.get(n), n) for n in ("correct", "wrong"))
    analyses.check_patching(loaded, len(clean), target, server.limits)
    return analyses.patching(loaded, clean, corrupted, target, correct, wrong, position,
                             should_stop=should_stop)


# --------------------------------------------------------------------------- features
@_model_call(("dictionary",))
def features_open(server, loaded, body, should_stop):
    """POST /api/features/open: a dictionary's facts, evaluation and most frequent features."""
    name, held = feature_answers.held(server.features, body, loaded, should_stop)
    return feature_answers.opened(held, loaded, name)


@_model_call(("dictionary", "feature", "k"))
def features_feature(server, loaded, body, should_stop):
    """POST /api/features/feature: one feature's contexts, histogram and logit weights."""
    _, held = feature_answers.held(server.features, body, loaded, should_stop)
    return feature_answers.feature(held, loaded, feature_answers.index(body, held),
                                   _k(server, body, 10))


@_model_call(("dictionary", "token", "k"))
def features_search(server, loaded, body, should_stop):
    """POST /api/features/search: features that fire on, or promote, one token."""
    _, held = feature_answers.held(server.features, body, loaded, should_stop)
    token = _token(loaded, body.get("token"), "token")
    if token is None:
        raise RequestError("token is required: one token's text, or its id")
    return feature_answers.search(held, loaded, token, _k(server, body, 10))


@_model_call(("dictionary", "prompt", "k"))
def features_prompt(server, loaded, body, should_stop):
    """POST /api/features/prompt: the active features at each token of the prompt."""
    _, held = feature_answers.held(server.features, body, loaded, should_stop)
    ids = _prompt_ids(server, loaded, get_str(body, "prompt", server.limits.prompt_bytes), 1)
    return feature_answers.prompt(held, loaded, ids, _k(server, body))


@_model_call(("dictionary", "feature", "prompt", "how", "alpha", "max_new_tokens"))
def features_steer(server, loaded, body, should_stop):
    """POST /api/features/steer: greedy continuations, clean and with the feature steered or
    ablated."""
    _, held = feature_answers.held(server.features, body, loaded, should_stop)
    ids = _prompt_ids(server, loaded, get_str(body, "prompt", server.limits.prompt_bytes), 1)
    return feature_answers.steer(held, loaded, ids, body)


def _sampling(body: dict, vocab: int) -> tuple[Sampling, int | None]:
    temperature = get_real(body, "temperature", 0.0, 1e4, default=0.8)
    top_k = get_int(body, "top_k", 1, vocab, default=None)
    top_p = get_real(body, "top_p", 0.0, 1.0, positive=True, default=None)
    seed = get_int(body, "seed", 0, 2 ** 63 - 1, default=None)
    return Sampling(temperature, top_k, top_p), seed


GENERATE_FIELDS = ("model", "prompt", "max_new_tokens", "temperature", "top_k", "top_p",
                   "seed", "k", "request")


async def generate(request: web.Request) -> web.StreamResponse:
    """POST /api/generate: tokens streamed as they are sampled, one JSON object per line.

    Each token is one piece of model work (`Lanes.model_work`: the model's turn, its lock, a
    worker thread for the time of one step), written before the next is drawn: a stream holds
    no thread between its tokens, and a reader that takes nothing stops the drawing (ended
    after `Limits.write_seconds`). A reader that goes away (the page's stop button) stops it
    at the next token, and so does the server stopping."""
    server = request.app[SERVER]
    body = await _body(request, GENERATE_FIELDS)
    name = get_str(body, "model", 1024, default="")
    prompt = get_str(body, "prompt", server.limits.prompt_bytes, default="")
    n = get_int(body, "max_new_tokens", 0, server.limits.max_new_tokens, default=50)
    k = _k(server, body)
    asked = _request_id(body)
    with server.lanes.client(request.remote):
        loaded = await server.lanes.load(server.store.get, name)

        def start(should_stop):
            sampling, seed = _sampling(body, loaded.model.cfg.vocab_size)
            return Generation(loaded, prompt, sampling, seed, k)
        gen = await server.lanes.model_work(loaded, start)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        first = dict(event="start", prompt_ids=gen.prompt_ids, model=loaded.name, request=asked,
                     prompt=prompt, prompt_texts=[loaded.texts(i) for i in gen.prompt_ids])
        try:
            await send_line(response, first, server.limits.write_seconds)
            last = await stream_tokens(server.lanes, loaded, gen, n, response,
                                       server.limits.write_seconds)
            await send_line(response, last, server.limits.write_seconds)
        except (ConnectionError, asyncio.TimeoutError):  # the reader went away, or stalled
            if request.transport is not None:
                request.transport.close()
            return response
    await response.write_eof()
    return response


async def run_state(request: web.Request) -> web.Response:
    """GET /api/run: the training run's curves, health rows, warnings and models, on the
    quick lane. ?after=CURSOR (the page's poll): only what came after the `cursor` of an
    earlier answer (`RunWatcher.poll`; "" or a stale cursor: from the start), at most
    `glassllm.serve.run.ANSWER_ROWS` rows of each file per answer (`more` says there is more).
    ?version=V: {"unchanged": true} when its files have not changed since version V."""
    server = request.app[SERVER]
    if server.watcher is None:
        raise RequestError("this server watches no training run (start it with --run DIR)",
                           status=404)
    given, after = request.query.get("version"), request.query.get("after")
    if after is not None and len(after) > 200:
        raise RequestError("after must be the cursor of an earlier answer")

    def work():
        if given is not None and given == server.watcher.version():
            return dict(unchanged=True, version=given)
        snap = server.watcher.snapshot() if after is None else server.watcher.poll(after)
        snap["models"] = server.store.run_models()
        snap["newest_model"] = server.store.newest_model()
        return snap
    return _json(await server.lanes.quick(work))


@_model_call(("prompt", "max_new_tokens", "temperature", "seed"), run_default=True)
def run_sample(server, loaded, body, should_stop):
    """POST /api/run/sample: a short sample from a model of the run (default: its newest
    model file, the best so far); `should_stop` asked between tokens."""
    prompt = get_str(body, "prompt", server.limits.prompt_bytes, default="")
    n = get_int(body, "max_new_tokens", 0, SAMPLE_TOKENS, default=100)
    sampling, seed = _sampling({k: body.get(k) for k in ("temperature", "seed")},
                               loaded.model.cfg.vocab_size)
    gen = Generation(loaded, prompt, sampling, 0 if seed is None else seed, 1)
    pieces = []
    for _ in range(n):
        if should_stop():
            raise Cancelled("the sample was stopped")
        token = gen.step()
        if token["stop"]:
            break
        pieces.append(token["text"])
    pieces.append(gen.flush())
    return dict(text="".join(pieces))


def make_app(server: Server) -> web.Application:
    """The aiohttp application of `server`: the page at /, the API under /api/."""
    app = web.Application(middlewares=[guard], client_max_size=server.limits.body_bytes)
    app[SERVER] = server
    app.on_response_prepare.append(_security_headers)
    app.router.add_get("/", page)
    app.router.add_get("/api/info", info)
    app.router.add_get("/api/run", run_state)
    for path, handler in (("tokenize", tokenize), ("analyze", analyze),
                          ("attention", attention), ("attribution", attribution),
                          ("ablate", ablate), ("patch", patch), ("generate", generate),
                          ("run/sample", run_sample), ("features/open", features_open),
                          ("features/feature", features_feature),
                          ("features/search", features_search),
                          ("features/prompt", features_prompt),
                          ("features/steer", features_steer)):
        app.router.add_post("/api/" + path, handler)
    return app


# --------------------------------------------------------------------------- running
def url_of(host: str, port: int, token: str) -> str:
    """The URL to print: a wildcard bind is reached at 127.0.0.1; IPv6 in brackets."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/?token={token}"


_SAID = {"descriptors": -math.inf}


def _loop_errors(loop, context) -> None:
    """Out of file descriptors, asyncio stops accepting for a second and logs a traceback each
    time: one line instead, at most every 10 s (idle connections are closed within
    `Limits.idle_seconds`, which frees them)."""
    e = context.get("exception")
    if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
        if loop.time() - _SAID["descriptors"] >= 10:
            _SAID["descriptors"] = loop.time()
            print(f"glassllm serve: out of file descriptors ({e.strerror}): new connections "
                  f"wait until idle ones are closed", file=sys.stderr, flush=True)
        return
    loop.default_exception_handler(context)


async def _serve(server: Server, host: str, port: int, announce) -> None:
    app = make_app(server)
    # handler_cancellation: a client that goes away cancels its handler, which stops its work
    # (`glassllm.serve.work`); keepalive_timeout: aiohttp closes a connection with no request
    # in progress after this long -- from its start too, so it also bounds the wait for headers
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           shutdown_timeout=SHUTDOWN_SECONDS,
                           handler_cancellation=True,
                           keepalive_timeout=server.limits.idle_seconds)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None
    server.gate.port = runner.addresses[0][1]
    server.url = url_of(host, server.gate.port, server.gate.token)
    server._loop, server._stop = asyncio.get_running_loop(), asyncio.Event()
    server._loop.set_exception_handler(_loop_errors)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            server._loop.add_signal_handler(sig, server._stop.set)
    announce(server.url)
    logging.getLogger("aiohttp.server").addFilter(quiet := MalformedRequests())  # one line
    try:
        await server._stop.wait()
    finally:
        logging.getLogger("aiohttp.server").removeFilter(quiet)
        # requests still running get 2 s, then their work is told to stop (a sweep ends at
        # its next cell, a stream at its next token) -- rather than waiting out aiohttp's
        # second grace period of shutdown_timeout before it cancels the handlers
        told = server._loop.call_later(SHUTDOWN_SECONDS, server.lanes.stopping.set)
        await runner.cleanup()
        told.cancel()
        server.lanes.shutdown()


def run(server: Server, host: str = "127.0.0.1", port: int = 0, announce=print,
        threads: int | None = None) -> str:
    """Serve until Ctrl-C (SIGINT), SIGTERM or `server.stop()`: bind host:port (0: a free
    port), call announce(url) once listening, answer requests; on stop, finish within
    seconds (requests still running get 2 s).

    threads: what the analyses compute on (`glassllm.engine.cpu.use_threads`); None chooses
    as `glassllm train` does (`cpu.choose_threads`: one per core on an idle machine, the
    cores other processes leave free on a busy one -- where more threads than free cores
    make every forward many times slower). Returns the choice's reason, in words.

    Raises:
        OSError: the address cannot be bound (in use, not this machine's).
    """
    from ..engine import cpu
    n, why = cpu.choose_threads(threads)
    with cpu.use_threads(n):
        asyncio.run(_serve(server, host, port, announce))
    return f"{n} ({why})"
