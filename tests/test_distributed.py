"""Gradient accumulation and the data-parallel Trainer, with ranks as threads (no MPI needed).

tests/test_mpi.py runs the same logic under a real `mpiexec`; here every property is checked
fast and in one process with `thread_ranks.ThreadGroup`, whose sums are in rank order as
MPICH's two-rank Allreduce.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from glassllm import Config, GlassLM, Tensor
from glassllm.formats import checkpoint as ckpt_io
from glassllm.training import distributed, launch
from glassllm.training.data import ArrayBatches
from glassllm.training.distributed import GradientBuffer, RanksDisagree, RanksFailed
from glassllm.tensor import is_grad_enabled
from glassllm.training import Stepped, Trainer, TrainingInterrupted, TrainSettings
from thread_ranks import Aborted, ThreadGroup

CFG = Config(vocab_size=257, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, max_len=16)


def corpus():
    text = ("the cat sat on the mat; a dog ran in the fog. " * 30).encode()
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    return ArrayBatches(ids[:1200]), ArrayBatches(ids[1200:])


def settings(**kw):
    base = dict(steps=12, batch_size=8, seq_len=8, lr=1e-2, warmup=2, eval_every=4,
                eval_batches=2, seed=0)
    base.update(kw)
    return TrainSettings(**base)


def train_once(comm=None, model=None, resume=None, on_event=None, checkpoint_path=None,
               data=None, **kw):
    train, val = data or corpus()
    model = model or GlassLM(CFG, seed=0)
    trainer = Trainer(settings(**kw), train, val, checkpoint_path=checkpoint_path, comm=comm)
    return model, trainer.run(model, resume=resume, on_event=on_event)


def losses(summary):
    return np.array([h["loss"] for h in summary.history])


def max_weight_diff(a, b):
    return max(float(np.max(np.abs(p.data - q.data))) for p, q in
               zip(a.parameters(), b.parameters()))


def on_ranks(n, fn):
    results = ThreadGroup(n).run(fn)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


# --------------------------------------------------------------------------- equivalences
def test_grad_accum_equals_one_batch_of_k_times_the_windows():
    big, big_summary = train_once(batch_size=8)
    acc, acc_summary = train_once(batch_size=4, grad_accum=2)
    # the same windows, the mean gradient: equal up to float32 rounding of the two means
    np.testing.assert_allclose(losses(acc_summary), losses(big_summary), rtol=0, atol=2e-6)
    assert max_weight_diff(big, acc) < 2e-6
    assert [h.get("val_loss") for h in acc_summary.history] == pytest.approx(
        [h.get("val_loss") for h in big_summary.history], abs=2e-6)
    # and it is not the same run as one batch of 4 (the test can tell runs apart)
    small, _ = train_once(batch_size=4)
    assert max_weight_diff(big, small) > 1e-3


def test_two_ranks_equal_grad_accum_bit_for_bit_and_one_big_batch_within_rounding():
    acc, acc_summary = train_once(batch_size=4, grad_accum=2)
    big, big_summary = train_once(batch_size=8)
    results = on_ranks(2, lambda comm: train_once(comm=comm, batch_size=4))
    (m0, s0), (m1, s1) = results
    assert max_weight_diff(m0, m1) == 0.0  # the ranks hold one model
    # rank r's gradient is micro-batch r's: g0 + g1 then * 1/2 either way
    assert max_weight_diff(m0, acc) == 0.0
    assert list(losses(s0)) == list(losses(acc_summary))
    assert max_weight_diff(m0, big) < 2e-6
    np.testing.assert_allclose(losses(s0), losses(big_summary), rtol=0, atol=2e-6)
    # throughput and token counts are of both ranks
    assert s0.tokens == 12 * 2 * 4 * 8 == big_summary.tokens


def test_four_ranks_with_accumulation_equal_one_batch_of_sixteen_windows():
    big, big_summary = train_once(batch_size=16)
    (m0, s0), *_ = on_ranks(4, lambda comm: train_once(comm=comm, batch_size=2,
                                                          grad_accum=2))
    # float32 rounding only: the gradient sums are split 4 x 2 x 2 instead of 16 at once, and
    # Adam's normalisation carries the difference into the weights (measured max: 3.4e-6
    # with the compiled kernels, whose rows round differently from NumPy's; 5.9e-7 with
    # NumPy's forms)
    assert max_weight_diff(m0, big) < 5e-6
    np.testing.assert_allclose(losses(s0), losses(big_summary), rtol=0, atol=3e-6)


def test_gradient_buffer_sums_counts_and_leaves_absent_gradients_none():
    a = Tensor(np.zeros((2, 3), np.float32), requires_grad=True)
    b = Tensor(np.zeros(4, np.float32), requires_grad=True)
    buf = GradientBuffer([a, b])
    a.grad = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf.add([a, b])  # b has no gradient in this micro-batch
    a.grad = np.ones((2, 3), np.float32)
    buf.add([a, b])
    total = buf.reduce(distributed.SerialCommunicator(), 3.0, "test")
    assert total == 3.0
    buf.to_params([a, b], 0.5)
    np.testing.assert_array_equal(a.grad, (np.arange(6).reshape(2, 3) + 1) * 0.5)
    assert b.grad is None
    assert np.shares_memory(a.grad, buf.flat)  # a view of the one buffer, not a copy


# --------------------------------------------------------------------------- agreement
def test_different_settings_on_one_rank_stop_every_rank_at_the_start():
    results = ThreadGroup(2).run(
        lambda comm: train_once(comm=comm, batch_size=4, lr=1e-2 if comm.rank == 0 else 2e-2))
    for r in results:
        assert isinstance(r, RanksDisagree), r
        assert "rank 1 settings.lr 0.02 vs rank 0 0.01" in str(r), r


def test_diverging_weights_are_found_at_the_next_evaluation_on_every_rank():
    def run(comm):
        model = GlassLM(CFG, seed=0)

        def on_event(event):  # events come on rank 0 only: its weights drift away
            if isinstance(event, Stepped) and event.step == 1:
                model.parameters()[0].data[0, 0] += np.float32(1e-3)
        return train_once(comm=comm, model=model, batch_size=4, on_event=on_event)

    results = ThreadGroup(2).run(run)
    for r in results:
        assert isinstance(r, RanksDisagree), r
        assert "weights after step 4" in str(r) and "rank 1 weights sha256" in str(r)


def test_one_rank_failing_at_start_up_fails_every_rank_with_its_message():
    def block(comm):
        with distributed.agreement(comm):
            if comm.rank == 1:
                raise FileNotFoundError(2, "No such file or directory", "/node2/data.txt")
        return "ok"
    results = ThreadGroup(2).run(block)
    for r in results:
        assert isinstance(r, RanksFailed)
        assert str(r) == "rank 1 of 2: /node2/data.txt: No such file or directory"

    def same(comm):
        with distributed.agreement(comm):
            raise ValueError("--steps must be >= 0")
    for r in ThreadGroup(2).run(same):
        assert type(r) is ValueError and distributed.raised_on_every_rank(r)


def test_an_error_on_one_rank_ends_the_job_naming_it():
    class Failing(ArrayBatches):
        calls = 0

        def batch(self, rng, b, t):
            self.calls += 1
            if self.calls == 4:
                raise RuntimeError("disk read error")
            return super().batch(rng, b, t)

    group = ThreadGroup(2, timeout_s=20)

    def run(comm):
        train, val = corpus()
        if comm.rank == 1:
            train = Failing(train.ids)
        return train_once(comm=comm, data=(train, val), batch_size=4)

    results = group.run(run)
    assert all(isinstance(r, Aborted) for r in results), results
    assert group.aborted == [(1, "glassllm: rank 1 of 2: RuntimeError: disk read error; ending "
                                 "the job", 1)]


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank():
    def run(comm):
        model = GlassLM(CFG, seed=0)
        loss = model.loss
        calls = []

        def loss_with_overflow(x, y):
            out = loss(x, y)
            if is_grad_enabled():  # training, not evaluation
                calls.append(1)
            if comm.rank == 1 and len(calls) == 3:  # rank 1's third micro-batch overflows
                return out * Tensor(np.float32(np.inf))
            return out
        model.loss = loss_with_overflow
        return train_once(comm=comm, model=model, batch_size=4, precision="fp16",
                          eval_every=100)

    (m0, s0), (m1, s1) = on_ranks(2, run)
    assert [h.get("skipped") for h in s0.history] == \
        [None, None, "nonfinite_loss"] + [None] * 9
    assert s0.history == s1.history and max_weight_diff(m0, m1) == 0.0


# --------------------------------------------------------------------------- interrupt, resume
def test_an_interrupt_on_one_rank_stops_every_rank_after_the_same_update(tmp_path):
    ckpt = tmp_path / "ckpt.safetensors"

    def interrupted(comm):
        def on_event(event):  # rank 0 only: like Ctrl-C arriving on one rank
            if isinstance(event, Stepped) and event.step == 5:
                raise KeyboardInterrupt
        return train_once(comm=comm, batch_size=4, on_event=on_event, checkpoint_path=ckpt)

    results = ThreadGroup(2).run(interrupted)
    assert all(isinstance(r, TrainingInterrupted) and r.step == 6 for r in results), results
    assert results[0].checkpoint_path == str(ckpt) and results[1].checkpoint_path is None
    saved = ckpt_io.load_checkpoint(ckpt)
    assert saved.step == 6 and saved.world_size == 2

    resumed = on_ranks(2, lambda comm: train_once(comm=comm, batch_size=4, resume=str(ckpt),
                                                  checkpoint_path=ckpt))
    straight = on_ranks(2, lambda comm: train_once(comm=comm, batch_size=4))
    assert max_weight_diff(resumed[0][0], straight[0][0]) == 0.0
    assert resumed[0][1].history == straight[0][1].history

    with pytest.raises(ValueError, match=r"written by a run of 2 rank\(s\) and this run has "
                                         r"1; resume it with the same number of ranks"):
        train_once(batch_size=4, resume=str(ckpt))


def test_checkpoints_hold_the_world_size_and_refuse_a_bad_one(tmp_path):
    model, _ = train_once(batch_size=4, steps=2, checkpoint_path=tmp_path / "c.safetensors",
                          checkpoint_every=2)
    saved = ckpt_io.load_checkpoint(tmp_path / "c.safetensors")
    assert saved.world_size == 1
    assert TrainSettings.from_dict(saved.settings).grad_accum == 1
    for bad in (0, 1.5, "2"):
        with pytest.raises(ValueError, match="state.world_size must be an integer >= 1"):
            ckpt_io.check_checkpoint(dataclasses.replace(saved, world_size=bad))
    with pytest.raises(ValueError, match="state.settings.grad_accum must be an integer >= 1"):
        ckpt_io.check_checkpoint(dataclasses.replace(
            saved, settings={**saved.settings, "grad_accum": 0}))


@pytest.mark.parametrize("value", [0, -1, 1.0, True])
def test_grad_accum_is_a_positive_integer(value):
    with pytest.raises(ValueError, match="grad_accum"):
        TrainSettings(grad_accum=value)


def test_the_launcher_size_and_rank_come_from_the_environment():
    assert launch.launcher_size({}) == 1 and launch.launcher_rank({}) is None
    assert launch.launcher_size({"PMI_SIZE": "1"}) == 1
    assert launch.launcher_size({"PMI_SIZE": "4", "PMI_RANK": "0"}) == 4
    assert launch.launcher_rank({"PMI_SIZE": "4", "PMI_RANK": "0"}) == 0
    assert launch.launcher_size({"OMPI_COMM_WORLD_SIZE": "3"}) == 3
    assert launch.needs_supervisor({"PMI_SIZE": "2"})
    assert not launch.needs_supervisor({"PMI_SIZE": "2", launch.SUPERVISED: "1"})
    assert not launch.needs_supervisor({"PMI_SIZE": "1"})
    assert isinstance(distributed.from_environment(), distributed.SerialCommunicator)


@pytest.mark.parametrize("signum, cause", [
    ("SIGKILL", "`kill -9`, the out-of-memory killer or a crash"),
    ("SIGINT", "Ctrl-C (SIGINT) outside the training loop (while starting or ending)"),
    ("SIGTERM", "SIGTERM outside the training loop (while starting or ending)")])
def test_the_supervisor_names_the_rank_and_dies_of_its_childs_signal(signum, cause):
    """The supervisor says which rank died and why (a Ctrl-C while a rank starts or ends is
    no crash), then dies of the same signal: an exit code before MPI_Init would leave the
    other ranks waiting forever under hydra (seen: Ctrl-C during start-up hung the job)."""
    import os
    import signal
    import subprocess
    import sys
    number = int(getattr(signal, signum))
    die = (f"import os, signal; signal.signal(signal.SIGINT, signal.SIG_DFL); "
           f"os.kill(os.getpid(), {number})")
    supervisor = f"import sys; from glassllm.training import launch; " \
                 f"sys.exit(launch.supervise([sys.executable, '-c', {die!r}]))"
    done = subprocess.run([sys.executable, "-c", supervisor], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PMI_SIZE": "2", "PMI_RANK": "1"})
    assert done.returncode == -number, done.stderr
    assert done.stderr.startswith("glassllm: rank 1 of 2 (pid "), done.stderr
    assert done.stderr.endswith(f"was killed by {signum} (signal {number}): {cause}; the "
                                f"launcher ends the other ranks\n"), done.stderr
    assert done.stderr.count("\n") == 1


def test_a_checkpoint_from_before_grad_accum_and_world_size_resumes(tmp_path):
    path = tmp_path / "c.safetensors"

    def stop(event):
        if isinstance(event, Stepped) and event.step == 2:
            raise KeyboardInterrupt
    with pytest.raises(TrainingInterrupted):
        train_once(batch_size=4, on_event=stop, checkpoint_path=path)
    saved = ckpt_io.load_checkpoint(path)
    old = dataclasses.replace(saved, settings={k: v for k, v in saved.settings.items()
                                               if k != "grad_accum"})
    resumed, summary = train_once(batch_size=4, resume=old)
    straight, expected = train_once(batch_size=4)
    assert max_weight_diff(resumed, straight) == 0.0 and summary.history == expected.history
    with pytest.raises(ValueError, match=r"grad_accum: checkpoint 1 vs 2"):
        train_once(batch_size=2, grad_accum=2, resume=old)


def test_the_supervisor_passes_sigterm_and_sighup_on_to_its_child():
    """`kill -TERM <supervisor>` (or a closed terminal's SIGHUP) reaches the rank's real work,
    which stops as for Ctrl-C; the supervisor returns the child's exit code."""
    import os
    import signal
    import subprocess
    import sys
    import time
    child = ("import signal, sys, time; "
             "signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n)); "
             "signal.signal(signal.SIGHUP, lambda n, f: sys.exit(128 + n)); "
             "print('ready', flush=True); time.sleep(60)")
    supervisor = f"import sys; from glassllm.training import launch; " \
                 f"sys.exit(launch.supervise([sys.executable, '-c', {child!r}]))"
    for number in (signal.SIGTERM, signal.SIGHUP):
        proc = subprocess.Popen([sys.executable, "-c", supervisor], stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PMI_SIZE": "2",
                                                "PMI_RANK": "0"})
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(number)  # to the supervisor alone
        assert proc.wait(timeout=30) == 128 + number


def test_the_supervisor_passes_on_a_signal_the_kernel_gave_another_thread():
    """A process-directed SIGTERM may be handed to any thread (NumPy's BLAS threads among
    them); its Python handler runs only when the main thread runs Python code, so a supervisor
    blocked in one waitpid never passed it on (the child slept its 60 s: seen once under CI
    load). Here a thread of the supervisor receives it, by pthread_kill."""
    import os
    import signal
    import subprocess
    import sys
    import time
    child = ("import signal, sys, time; "
             "signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n)); "
             "print('ready', flush=True); time.sleep(60)")
    supervisor = ("import signal, sys, threading, time; from glassllm.training import launch; "
                  "threading.Thread(target=lambda: (sys.stdin.readline(), signal.pthread_kill("
                  "threading.get_ident(), signal.SIGTERM)), daemon=True).start(); "
                  f"sys.exit(launch.supervise([sys.executable, '-c', {child!r}]))")
    proc = subprocess.Popen([sys.executable, "-c", supervisor], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PMI_SIZE": "2", "PMI_RANK": "0"})
    assert proc.stdout.readline() == "ready\n"
    started = time.monotonic()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    try:
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert time.monotonic() - started < 5
