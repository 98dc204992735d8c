"""The one printer of a training run: `glassllm train`'s lines for each event and for the end.

`TrainPrinter.show(event)` dispatches on the event's type (`functools.singledispatchmethod`),
one method per event (`glassllm.training.events`); `TrainPrinter.result(result)` prints how the
run ended (`glassllm.training.run.RunResult`) and returns the exit code. Progress goes to a tqdm
bar on stderr; the run's facts to stdout; notes, warnings and errors to stderr, one line each.
"""
from __future__ import annotations

import functools
import signal
import sys

from ..training import events as ev
from ..training.run import COMPLETE, INTERRUPTED, WRITE_ERROR
from .common import one_line


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class TrainPrinter:
    """Prints a run's events; `plan` is the run's `RunPlan` (bits per byte from its corpus,
    the resumed checkpoint for the closing lines)."""

    def __init__(self, plan):
        self.plan = plan
        self._bar = None

    @property
    def bar(self):
        """The progress bar (tqdm on stderr), started by `LoopBegins`."""
        return self._bar

    def close(self) -> None:
        """End the bar's line (idempotent): what comes next starts on a fresh one."""
        if self._bar is not None:
            self._bar.close()

    def bpb(self, nats: float) -> float:
        return self.plan.corpus.bits_per_byte(nats)

    @functools.singledispatchmethod
    def show(self, event) -> None:
        """An event of no line of its own (HealthChecked, Finished, Saved's siblings...)."""

    @show.register
    def _(self, e: ev.CorpusNote) -> None:
        _err(f"note: {e.name}: {e.note}")

    @show.register
    def _(self, e: ev.LockTakenOver) -> None:
        _err(f"note: took over a lock left by pid {e.holder.get('pid')} (no longer running)")

    @show.register
    def _(self, e: ev.TemporaryRemoved) -> None:
        _err(f"note: removed {e.path}, a temporary file left by that run")

    @show.register
    def _(self, e: ev.RunReplaced) -> None:
        _err(f"note: --overwrite: deleted the replaced run's files ({', '.join(e.paths)})")

    @show.register
    def _(self, e: ev.RunBegins) -> None:
        cfg, s = e.config, e.settings
        print(f"glassllm train: {cfg.family} model, d_model {cfg.d_model}, {cfg.n_layers} "
              f"layers, {cfg.n_heads} heads ({cfg.n_kv_heads} kv), {e.parameters:,} "
              f"parameters", flush=True)
        print(f"data: {e.corpus.name}: {e.corpus.train.token_count():,} training and "
              f"{e.corpus.val.token_count():,} validation tokens", flush=True)
        print(f"{s.steps} steps of {batch_words(e.ranks, s)} tokens, lr {s.lr:g}, warmup "
              f"{s.warmup}, {s.precision}; best model -> {e.model_path}", flush=True)
        print(f"threads: {e.threads} ({e.threads_why})", flush=True)
        print(e.blas, flush=True)  # which BLAS computes the matrix products

    @show.register
    def _(self, e: ev.WarmupOutlastsRun) -> None:
        _err(f"warning: --steps {e.steps} ends before the warmup does (--warmup {e.warmup}): "
             f"the learning rate climbs to {e.peak:.3g}, {e.steps / e.warmup:.0%} of --lr "
             f"{e.lr:g}, and never decays; give --warmup below --steps")

    @show.register
    def _(self, e: ev.Stepped) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{e.loss:.3f}", lr=f"{e.lr:.2e}",
                             tok_s=f"{e.tokens_per_s:,.0f}", refresh=False)

    @show.register
    def _(self, e: ev.Started) -> None:
        self.bar.write(f"initial val loss {e.val_loss:.4f} nats/token "
                       f"({self.bpb(e.val_loss):.3f} bits/byte)")

    @show.register
    def _(self, e: ev.Resumed) -> None:
        self.bar.update(e.step)
        self.bar.write(f"resumed after step {e.step} from {self.plan.resume_path}")

    @show.register
    def _(self, e: ev.Evaluated) -> None:
        self.bar.write(f"step {e.step:>6}: train {e.train_loss:.4f}, val {e.val_loss:.4f} "
                       f"nats/token ({self.bpb(e.val_loss):.3f} bits/byte), "
                       f"{e.tokens_per_s:,.0f} tokens/s")

    @show.register
    def _(self, e: ev.Saved) -> None:
        self.bar.write(f"{'':14}saved (best so far) -> {e.path}")

    @show.register
    def _(self, e: ev.Checkpointed) -> None:
        self.bar.write(f"{'':14}checkpoint after {e.step} steps -> {e.path}")

    @show.register
    def _(self, e: ev.HealthWarning) -> None:
        self.bar.write(f"warning: {e.message}")

    @show.register
    def _(self, e: ev.LoopBegins) -> None:
        from tqdm import tqdm
        self._bar = tqdm(total=e.steps, unit="step", dynamic_ncols=True, file=sys.stderr,
                         mininterval=0.5)

    @show.register
    def _(self, e: ev.LoopEnded) -> None:
        self.close()

    @show.register
    def _(self, e: ev.PlotFailed) -> None:
        _err(f"glassllm train: warning: {e.message}")

    def result(self, r) -> int:
        """Print how the run ended; its exit code."""
        if r.reason == COMPLETE:
            self._complete(r)
        elif r.reason == INTERRUPTED:
            self._interrupted(r)
        else:
            _err(f"glassllm train: error: {r.error}")
            if r.reason == WRITE_ERROR and r.history_error is not None:
                _err(f"glassllm train: {self.plan.paths['history_csv']} not written either: "
                     f"{one_line(r.history_error)}")
        return r.exit_code

    def _interrupted(self, r) -> None:
        from ..training import stopping
        from ..training.plan import train_command
        # A checkpoint resumes under its own number of ranks only: say the whole command.
        where = (f"checkpoint after {r.step} steps: {r.checkpoint}; continue with "
                 f"`{train_command(self.plan.comm.size)} --resume {r.checkpoint}`"
                 if r.checkpoint else "no checkpoint written")
        by = "" if r.signum == signal.SIGINT else f" by {stopping.signal_name(r.signum)}"
        _err(f"glassllm train: interrupted{by}; {where}")

    def _complete(self, r) -> None:
        from ..training import runfiles, stopping
        summary, resume = r.summary, self.plan.resume
        if summary.best_val_loss is not None:
            print(f"best val loss {summary.best_val_loss:.4f} nats/token = "
                  f"{self.bpb(summary.best_val_loss):.4f} bits/byte (step {summary.best_step}); "
                  f"final {summary.final_val_loss:.4f} nats/token")
            if summary.model_path is not None:
                print(f"model: {summary.model_path}")
            else:  # resumed with a new --out, and no evaluation since beat the checkpoint's
                before = runfiles.saved_path(resume.extra.get("out"), self.plan.resume_path) \
                    if resume is not None else None
                print(f"model: none written to {self.plan.paths['model']}: no evaluation after "
                      f"the resume improved on step {summary.best_step}'s"
                      + (f", whose model is in {before}" if before else ""))
        print(f"history: {r.history_csv}" + (f", plot: {r.plot}" if r.plot else ""))
        print(f"{summary.steps - (resume.step if resume else 0)} steps in {r.elapsed_s:.1f} s "
              f"({summary.tokens / max(r.elapsed_s, 1e-9):,.0f} tokens/s overall)"
              + (f", {summary.skipped_steps} skipped" if summary.skipped_steps else ""),
              flush=True)
        if r.late_signal:
            _err(f"glassllm train: {stopping.signal_name(r.late_signal)} arrived after the "
                 f"last step; the run is complete")


def batch_words(ranks: int, settings) -> str:
    """'16 x 64' or, with ranks and micro-batches, '2 ranks x 2 micro-batches x 8 x 64'."""
    parts = ([f"{ranks} ranks"] if ranks > 1 else []) + \
        ([f"{settings.grad_accum} micro-batches"] if settings.grad_accum > 1 else [])
    return " x ".join(parts + [str(settings.batch_size), str(settings.seq_len)])
