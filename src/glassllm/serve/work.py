"""Where the server's work runs, so that no client can take the page hostage.

Two lanes of worker threads:

- the quick lane (`Lanes.quick`): the page, /api/info and the training page's poll -- work of
  milliseconds that reads files, never a model. It never waits behind an analysis;
- the model lane (`Lanes.model_work`): every piece of work on a model (an analysis, a sweep,
  one token of a generation). It first waits for the model's turn (`Loaded.turn`: a fair
  first-come first-served queue on the event loop, holding no thread while it waits), then
  runs in a worker thread under the model's lock. A generation takes one turn per token, so
  a stream holds no thread between its tokens and an analysis waits for one token at most.

Cancellation: the work gets a `should_stop()` that turns True when its request's handler is
cancelled (aiohttp cancels it when the client goes away: `handler_cancellation`) or the
server is stopping (Ctrl-C). Long work asks it between its steps -- a patching sweep between
cells (`glassllm.lens.interpret.patching_sweep`), a sample between tokens -- and ends with
`Cancelled`; the model's turn passes on only when the thread has stopped.

Per-client bound (`Lanes.client`): a client address has at most `Limits.client_requests`
model requests in flight; one more is refused at once (429), so a script cannot queue
thousands of sweeps in front of everyone else.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import threading

from ..lens.interpret import Cancelled
from .fields import RequestError

QUICK_WORKERS = 4


class Lanes:
    """The worker threads of one server, its per-client counts and its stopping flag.

    Args:
        workers: threads of the model lane (models at work at once; one each).
        client_requests: model requests one client address may have in flight.
    """

    def __init__(self, workers: int = 8, client_requests: int = 16):
        self.models = concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="glassllm-serve")
        self.quick_pool = concurrent.futures.ThreadPoolExecutor(
            QUICK_WORKERS, thread_name_prefix="glassllm-serve-quick")
        self.stopping = threading.Event()
        self.client_requests = client_requests
        self._in_flight: collections.Counter = collections.Counter()

    async def quick(self, fn, *args):
        """fn(*args) on the quick lane (file reads of milliseconds; never a model)."""
        return await _in(self.quick_pool, fn, *args)

    async def load(self, fn, *args):
        """fn(*args) on the model lane, outside any model's turn (loading a model file)."""
        return await _in(self.models, fn, *args)

    async def model_work(self, loaded, fn):
        """fn(should_stop) in a worker thread, in `loaded`'s turn and under its lock.

        Raises:
            Cancelled: the server is stopping (before the work starts, or from the work).
            asyncio.CancelledError: this handler was cancelled (its client went away); the
                work was asked to stop and has stopped before this is raised.
        """
        if self.stopping.is_set():
            raise Cancelled("the server is stopping")
        cancel = threading.Event()

        def should_stop() -> bool:
            return cancel.is_set() or self.stopping.is_set()

        def locked():
            if should_stop():
                raise Cancelled("stopped before it started")
            # the turn alone would do, but a handler cancelled twice leaves it before its
            # thread has stopped: the lock still keeps two threads off one model
            with loaded.lock:
                return fn(should_stop)
        async with loaded.turn:
            future = asyncio.get_running_loop().run_in_executor(self.models, locked)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                cancel.set()
                # the model's turn passes on once the thread has reached its next checkpoint
                await asyncio.wait([future])
                raise

    @contextlib.contextmanager
    def client(self, address: str | None):
        """Counts one model request of `address` while it lasts.

        Raises:
            RequestError: (429) the client already has `client_requests` in flight."""
        key = address or "?"
        if self._in_flight[key] >= self.client_requests:
            raise RequestError(f"this client already has {self._in_flight[key]} requests in "
                               f"flight, the server's limit; wait for one to end", status=429)
        self._in_flight[key] += 1
        try:
            yield
        finally:
            self._in_flight[key] -= 1
            if self._in_flight[key] <= 0:
                del self._in_flight[key]

    def shutdown(self) -> None:
        """Ask all work to stop and let the threads go (they end at their next checkpoint)."""
        self.stopping.set()
        for pool in (self.models, self.quick_pool):
            pool.shutdown(wait=False, cancel_futures=True)


async def _in(pool, fn, *args):
    """fn(*args) in a thread of `pool`, awaited."""
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args))
