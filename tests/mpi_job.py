"""A training job for tests/test_mpi.py, run as `mpiexec -n N python tests/mpi_job.py MODE OUT`.

Modes (each on the Python API, `Trainer(..., comm=MPICommunicator())`):
    raise      rank 1's data raises RuntimeError at its 5th batch
    hang       rank 1 stops itself (SIGSTOP) at its 5th batch; the others must time out
    diverge    rank 0's weights are nudged after step 1 (the checksum must catch it)
Each rank writes OUT.<rank>.json with what it saw when it ends on its own.
"""
from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

from glassllm import Config, GlassLM
from glassllm.training.data import ArrayBatches
from glassllm.training.distributed import MPICommunicator
from glassllm.training import Stepped, Trainer, TrainSettings


class FaultyBatches(ArrayBatches):
    def __init__(self, ids, fault):
        super().__init__(ids)
        self.fault, self.calls = fault, 0

    def batch(self, rng, batch_size, seq_len):
        self.calls += 1
        if self.calls == 5:
            if self.fault == "raise":
                raise RuntimeError("rank 1 cannot read its batch")
            if self.fault == "hang":
                os.kill(os.getpid(), signal.SIGSTOP)
        return super().batch(rng, batch_size, seq_len)


def main(mode: str, out: str) -> int:
    comm = MPICommunicator(timeout_s=float(os.environ.get("GLASSLLM_TEST_TIMEOUT", "60")))
    text = ("the cat sat on the mat; a dog ran in the fog. " * 200).encode()
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    train, val = ArrayBatches(ids[:8000]), ArrayBatches(ids[8000:])
    if comm.rank == 1 and mode in ("raise", "hang"):
        train = FaultyBatches(train.ids, mode)
    cfg = Config(vocab_size=257, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, max_len=16)
    model = GlassLM(cfg, seed=0)
    settings = TrainSettings(steps=int(os.environ.get("GLASSLLM_TEST_STEPS", "12")),
                             batch_size=4, seq_len=8, lr=1e-2, warmup=2, eval_every=4,
                             eval_batches=2)

    def on_event(event):
        if mode == "diverge" and isinstance(event, Stepped) and event.step == 1:
            model.parameters()[0].data[0, 0] += np.float32(1e-3)

    try:
        summary = Trainer(settings, train, val, comm=comm).run(model, on_event=on_event)
        outcome = {"steps": summary.steps}
    except Exception as e:  # an error every rank raised alike
        outcome = {"error": type(e).__name__, "message": str(e)}
    comm.close()
    with open(f"{out}.{comm.rank}.json", "w") as f:
        json.dump(outcome, f)
    return 3 if "error" in outcome else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
