"""N ranks as N threads of one process: a communicator for tests of the data-parallel logic
without MPI (the interface of `glassllm.training.distributed`).

Sums are made in rank order (rank 0 + rank 1 + ...), as MPICH's two-rank Allreduce does, and
every rank gets the same result. `abort` records the message, breaks the barrier so the other
ranks stop waiting, and raises `Aborted` in the calling thread.
"""
from __future__ import annotations

import threading

import numpy as np


class Aborted(BaseException):
    """A rank called abort (or another rank did while this one waited)."""


class ThreadGroup:
    def __init__(self, size: int, timeout_s: float = 60.0):
        self.size = size
        self.timeout_s = timeout_s
        self.barrier = threading.Barrier(size)
        self.slots = [None] * size
        self.aborted: list[tuple[int, str, int]] = []  # (rank, message, code)
        self.collectives: list[list[str]] = [[] for _ in range(size)]  # what each rank did

    def comm(self, rank: int) -> "ThreadComm":
        return ThreadComm(self, rank)

    def run(self, fn):
        """fn(comm) on every rank, in threads; returns [result or exception] by rank."""
        results = [None] * self.size

        def body(rank):
            try:
                results[rank] = fn(self.comm(rank))
            except BaseException as e:  # noqa: BLE001 - the test inspects it
                results[rank] = e

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=self.timeout_s * 4)
        assert not any(t.is_alive() for t in threads), "a rank hangs"
        return results


class ThreadComm:
    allreduce_seconds = 0.0

    def __init__(self, group: ThreadGroup, rank: int):
        self.group, self.rank, self.size = group, rank, group.size

    def _exchange(self, value, what):
        g = self.group
        g.collectives[self.rank].append(what)
        try:
            g.slots[self.rank] = value
            g.barrier.wait(g.timeout_s)
            everyone = list(g.slots)
            g.barrier.wait(g.timeout_s)
        except threading.BrokenBarrierError:
            raise Aborted(f"rank {self.rank}: another rank aborted during {what}") from None
        return everyone

    def allreduce_sum(self, array: np.ndarray, what: str = "") -> None:
        everyone = self._exchange(array.copy(), what)
        total = everyone[0].copy()
        for other in everyone[1:]:
            total += other
        array[...] = total

    def allgather(self, obj, what: str = "") -> list:
        return self._exchange(obj, what)

    def abort(self, message: str, code: int = 1):
        if not self.group.barrier.broken:  # MPI_Abort ends the job: the first one counts
            self.group.aborted.append((self.rank, message, code))
            self.group.barrier.abort()
        raise Aborted(message)

    def close(self) -> None:
        pass
