"""`glassllm serve` stays responsive, without a browser: the quick lane and the model lane
(eight open streams leave /api/info and an analysis free), the per-client bound, cancellation
(a sweep whose client went away frees its model; Ctrl-C with a sweep running), answers that
say what they answer, connection timeouts on raw sockets, and the training poll: a malformed
health row skipped and said, incremental answers, size caps.

Every request goes to 127.0.0.1 only (a server this test starts, on a free port).
"""
from __future__ import annotations

import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from glassllm.formats import files  # noqa: E402
from glassllm.lens import interpret  # noqa: E402
from glassllm.model import Config, GlassLM  # noqa: E402
from glassllm.serve import run as runfiles  # noqa: E402
from glassllm.serve.limits import Limits  # noqa: E402
from glassllm.serve.models import Loaded, encode_prompt  # noqa: E402
from glassllm.serve.run import RowLog, RunWatcher  # noqa: E402
from glassllm.tokenizers import ByteTokenizer  # noqa: E402

from serve_client import CORRUPTED, PROMPT, Running, tiny_model  # noqa: E402

def sweep_model() -> GlassLM:
    """A model whose patching sweep of a long prompt is thousands of forwards (tens of
    seconds here), each of milliseconds."""
    return GlassLM(Config(d_model=64, n_layers=8, n_heads=4, n_kv_heads=4, max_len=256), seed=0)


LONG_CLEAN = ("The quick brown fox jumps over the lazy dog and runs away. " * 5)[:240]
LONG_CORRUPTED = LONG_CLEAN.replace("fox", "cat")
# greedy: the tiny model never draws its end token from "Once", so this streams 1024 tokens
# (seconds: past its max_len of 64 every token is a forward of 64 tokens)
LONG_STREAM = {"prompt": "Once", "max_new_tokens": 1024, "temperature": 0}


@pytest.fixture(scope="module")
def served():
    running = Running(Loaded("", "tiny", tiny_model(), ByteTokenizer()))
    yield running
    running.stop()


def open_stream(running: Running, body: dict):
    """A generation stream being read line by line in a thread: (response, lines, thread)."""
    request = urllib.request.Request(running.base + "/api/generate",
                                     data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + running.token})
    response = urllib.request.urlopen(request, timeout=120)
    lines = []

    def read():
        try:
            for line in response:
                lines.append(json.loads(line))
        except (OSError, ValueError, AttributeError):  # closed by the test (fp gone)
            pass
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return response, lines, thread


# --------------------------------------------------------------------------- lanes
def test_eight_streams_leave_info_and_analyses_free(served):
    """Eight open streams (the model lane's size) hold no worker: /api/info and an analysis of
    the same model answer at once, and the streams go on."""
    streams = [open_stream(served, LONG_STREAM)
               for i in range(8)]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(len(s[1]) > 2 for s in streams):
            time.sleep(0.05)
        assert all(len(s[1]) > 2 for s in streams), [len(s[1]) for s in streams]
        started = time.monotonic()
        assert served.call("/api/info", timeout=10)[0] == 200
        status, a = served.call("/api/analyze", {"prompt": PROMPT}, timeout=10)
        took = time.monotonic() - started
        assert status == 200 and a["tokens"]["ids"] == encode_prompt(ByteTokenizer(), PROMPT)
        print(f"measured: {took:.2f} s")
        assert took < 2, took
        before = [len(s[1]) for s in streams]
        time.sleep(0.3)
        assert any(len(s[1]) > n for s, n in zip(streams, before))  # still streaming
    finally:
        for response, _, _ in streams:
            response.close()


def test_one_client_is_bounded():
    running = Running(Loaded("", "tiny", tiny_model(), ByteTokenizer()),
                      limits=Limits(client_requests=2))
    streams = []
    try:
        streams = [open_stream(running, LONG_STREAM)
                   for _ in range(2)]
        status, r = running.call("/api/analyze", {"prompt": PROMPT})
        assert status == 429 and "in flight" in r["error"]
        assert running.call("/api/info")[0] == 200  # the quick lane is not counted
        for response, _, thread in streams:
            response.close()
            thread.join(10)
        deadline = time.monotonic() + 10  # the closed streams end at their next token
        while running.call("/api/analyze", {"prompt": PROMPT})[0] != 200:
            assert time.monotonic() < deadline, "the bound was not released"
            time.sleep(0.1)
    finally:
        for response, _, _ in streams:
            response.close()
        running.stop()


# --------------------------------------------------------------------------- cancellation
def test_a_sweep_whose_client_left_frees_its_model():
    model = sweep_model()
    running = Running(Loaded("", "sweep", model, ByteTokenizer()),
                      limits=Limits(patch_forwards=1 << 22))
    try:
        body = {"clean": LONG_CLEAN, "corrupted": LONG_CORRUPTED}
        with pytest.raises(OSError):  # the client gives up after 1.5 s and goes away
            running.call("/api/patch", body, timeout=1.5)
        left = time.monotonic()
        status, a = running.call("/api/analyze", {"prompt": PROMPT}, timeout=30)
        assert status == 200
        print(f"measured: {time.monotonic() - left:.2f} s")
        assert time.monotonic() - left < 2, time.monotonic() - left
        s = interpret.token_surprise(model, np.asarray(encode_prompt(ByteTokenizer(), PROMPT)))
        assert math.isclose(a["surprise"]["mean_nats"], s.mean_nats, abs_tol=1e-6)
    finally:
        running.stop()


def test_patching_sweep_asks_should_stop_between_cells():
    model = tiny_model()
    ids = np.asarray(encode_prompt(ByteTokenizer(), PROMPT))[None]
    other = np.asarray(encode_prompt(ByteTokenizer(), CORRUPTED))[None]
    asked = []

    def should_stop():
        asked.append(1)
        return len(asked) > 5
    with pytest.raises(interpret.Cancelled, match="after 5 of"):
        interpret.patching_sweep(model, ids, other, interpret.logit_difference(1, 2),
                                 should_stop=should_stop)
    full = interpret.patching_sweep(model, ids, other, interpret.logit_difference(1, 2),
                                    should_stop=lambda: False)
    assert np.array_equal(full.values, interpret.patching_sweep(
        model, ids, other, interpret.logit_difference(1, 2)).values)


def test_ctrl_c_with_a_sweep_running_exits_within_5_s(tmp_path):
    proc, base, token = _serve_child(tmp_path, GlassLM(Config(
        d_model=128, n_layers=8, n_heads=4, n_kv_heads=4, max_len=256), seed=0))
    try:
        clean = LONG_CLEAN[:180]  # 8 layers x 180 positions x 180 tokens: within the limits
        body = json.dumps({"clean": clean, "corrupted": clean.replace("fox", "cat")}).encode()
        answer = {}

        def sweep():
            request = urllib.request.Request(base + "/api/patch", data=body,
                                             headers={"Authorization": "Bearer " + token})
            try:
                with urllib.request.urlopen(request, timeout=120) as r:
                    answer["status"] = r.status
            except urllib.error.HTTPError as e:
                answer["status"] = e.code
            except OSError as e:
                answer["error"] = e
        thread = threading.Thread(target=sweep, daemon=True)
        thread.start()
        time.sleep(2)  # the sweep is running (it takes far longer than this)
        assert thread.is_alive() and not answer, answer
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        assert proc.wait(20) == 0, (tmp_path / "stderr.txt").read_text()
        print(f"measured: {time.monotonic() - started:.2f} s")
        assert time.monotonic() - started < 5, time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- answers
def test_answers_say_what_they_answer(served):
    for path, body in (("/api/analyze", {"prompt": PROMPT}),
                       ("/api/attention", {"prompt": PROMPT, "layer": 0}),
                       ("/api/attribution", {"prompt": PROMPT}),
                       ("/api/ablate", {"prompt": PROMPT, "heads": [[0, 1]]}),
                       ("/api/tokenize", {"prompt": PROMPT})):
        status, r = served.call(path, {**body, "request": "analyze-17"})
        assert status == 200, (path, r)
        assert (r["model"], r["prompt"], r["request"]) == ("", PROMPT, "analyze-17"), path
    status, r = served.call("/api/patch", {"clean": PROMPT, "corrupted": CORRUPTED,
                                           "request": 42})
    assert status == 200 and (r["model"], r["request"]) == ("", 42)
    assert r["clean_tokens"]["ids"] == encode_prompt(ByteTokenizer(), PROMPT)
    status, r = served.call("/api/analyze", {"prompt": PROMPT})
    assert r["request"] is None and r["model_info"]["label"] == "tiny"
    lines = served.stream({"prompt": "Once", "max_new_tokens": 2, "request": "g-1"})
    assert lines[0]["request"] == "g-1" and lines[0]["model"] == ""
    assert lines[0]["prompt"] == "Once"  # as every call that takes a prompt (docs/serve.md)
    for bad in (True, [1], {"a": 1}, "x" * 101):
        status, r = served.call("/api/analyze", {"prompt": PROMPT, "request": bad})
        assert status in (400, 413) and "request" in r["error"], bad


# --------------------------------------------------------------------------- connections
def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closes `sock` (reading and dropping what it sends)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        raise AssertionError(f"the connection was still open after {seconds} s") from None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_idle_and_slow_connections_are_closed():
    running = Running(Loaded("", "tiny", tiny_model(), ByteTokenizer()),
                      limits=Limits(idle_seconds=1.0, body_seconds=1.0))
    address = ("127.0.0.1", running.port)
    try:
        with socket.create_connection(address) as s:  # connects, sends nothing
            assert _closed_within(s, 4) < 3
        with socket.create_connection(address) as s:  # half its headers, then nothing
            s.sendall(f"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{running.port}\r\n".encode())
            assert _closed_within(s, 4) < 3
        with socket.create_connection(address) as s:  # the headers, a tenth of the body
            s.sendall(f"POST /api/analyze HTTP/1.1\r\nHost: 127.0.0.1:{running.port}\r\n"
                      f"Authorization: Bearer {running.token}\r\nContent-Length: 100\r\n\r\n"
                      f'{{"prompt"'.encode())
            s.settimeout(4)
            reply = s.recv(4096)
            assert reply.startswith(b"HTTP/1.1 408"), reply
            assert _closed_within(s, 4) < 3
        with socket.create_connection(address) as s:  # no token: 403, and closed
            s.sendall(f"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{running.port}\r\n\r\n"
                      .encode())
            s.settimeout(4)
            assert s.recv(4096).startswith(b"HTTP/1.1 403")
            assert _closed_within(s, 1) < 1
        with socket.create_connection(address) as s:  # with the token: kept alive, idle
            s.sendall(f"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:{running.port}\r\n"
                      f"Authorization: Bearer {running.token}\r\n\r\n".encode())
            s.settimeout(4)
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            assert _closed_within(s, 4) < 3
        assert running.call("/api/info")[0] == 200
    finally:
        running.stop()


def test_a_tokenless_connection_is_closed_within_seconds_by_default(served):
    assert Limits().idle_seconds <= 5
    with socket.create_connection(("127.0.0.1", served.port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        assert _closed_within(s, 10) < Limits().idle_seconds + 2


def _serve_child(tmp_path, model: GlassLM, *extra, preexec_fn=None):
    """`glassllm serve --model` as a child process: (process, base URL, token)."""
    path = tmp_path / "m.safetensors"
    files.save(model, path, ByteTokenizer())
    # stderr to a file: a pipe nobody reads while the test runs would fill and block it
    err = open(tmp_path / "stderr.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "glassllm.cli", "serve", "--model",
                             str(path), "--port", "0", "--threads", "1", *extra], text=True,
                            stdout=subprocess.PIPE, stderr=err, preexec_fn=preexec_fn)
    err.close()
    line = proc.stdout.readline()
    assert line.startswith("glassllm serve: http://"), line + \
        (tmp_path / "stderr.txt").read_text()
    base, token = line.split(": ", 1)[1].strip().split("/?token=")
    return proc, base, token


def test_half_open_connections_do_not_stall_the_server(tmp_path):
    """300 connections that send half their headers, to a server allowed 256 open files: it
    answers again within seconds (they are closed after `idle_seconds`), saying so in one
    line, not a traceback per refused accept."""
    proc, base, token = _serve_child(tmp_path, tiny_model(), preexec_fn=lambda: (
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))))
    held = []
    try:
        port = int(base.rsplit(":", 1)[1])
        for _ in range(300):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=0.5)
                s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                held.append(s)
            except OSError:  # past the listen backlog: the kernel drops the connection
                pass
        assert len(held) > 256
        started = time.monotonic()
        request = urllib.request.Request(base + "/api/info",
                                         headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(request, timeout=60) as r:
            assert r.status == 200
        took = time.monotonic() - started
        print(f"measured: {took:.2f} s")
        assert took < Limits().idle_seconds + 5, took
    finally:
        for s in held:
            s.close()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        finally:
            proc.kill()
    err = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in err and err.count("out of file descriptors") <= 3, err[-2000:]


# --------------------------------------------------------------------------- the run
HEALTH_ROW = {"step": 0, "loss": 5.0, "lr": 0.001, "warnings": ["w0"],
              "params": {"wte": {"grad_norm": 1.0}}}


def _health(rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def test_a_malformed_health_row_is_skipped_and_said(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "health.jsonl").write_text(_health([
        HEALTH_ROW, {**HEALTH_ROW, "step": 10, "warnings": 5},
        {**HEALTH_ROW, "step": 20, "warnings": "abc"}, "not json", {"step": "x"},
        {**HEALTH_ROW, "step": 30, "params": [1]}, {**HEALTH_ROW, "step": 40, "loss": "low"},
        {**HEALTH_ROW, "step": 50, "warnings": ["w50"]}]))
    running = Running(None, run_dir=run)
    try:
        for query in ("", "?after=", "?version=0"):
            status, r = running.call("/api/run" + query)
            assert status == 200, (query, r)
            assert [row["step"] for row in r["health"]] == [0, 50]
            assert [w["message"] for w in r["warnings"]] == ["w0", "w50"]
            problems = " | ".join(r["problems"])
            for said in ("line 2: warnings must be a list of strings, got 5",
                         'line 3: warnings must be a list of strings, got "abc"',
                         "line 4 is not a JSON line", "line 5: no finite numeric step",
                         "line 6: params must be an object of objects",
                         'line 7: loss must be a number, got "low"'):
                assert "health.jsonl: " + said in problems, (said, problems)
    finally:
        running.stop()


def test_a_health_number_past_float_range_reads_as_missing(tmp_path):
    """1e999 is valid JSON that Python reads as inf, which no JSON answer holds: before, every
    poll of the run answered 400 ("Out of range float values") for as long as the row was
    there. Now it reads as null, as NaN does; a step of 1e999 is no finite step (skipped)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "health.jsonl").write_text(_health([
        '{"step": 0, "loss": 1e999, "lr": 0.001}',
        '{"step": 1, "params": {"wte": {"grad_norm": -1e999, "ratio": 0.5}}}',
        '{"step": 1e999, "loss": 1.0}', {**HEALTH_ROW, "step": 2}]))
    running = Running(None, run_dir=run)
    try:
        for query in ("", "?after="):
            status, r = running.call("/api/run" + query)
            assert status == 200, (query, r)
            assert [row["step"] for row in r["health"]] == [0, 1, 2]
            assert r["health"][0]["loss"] is None and r["health"][0]["lr"] == 0.001
            assert r["health"][1]["params"] == {"wte": {"grad_norm": None, "ratio": 0.5}}
            assert r["problems"] == ["health.jsonl: line 3: no finite numeric step; skipped"]
    finally:
        running.stop()


def test_a_cursor_of_other_digits_starts_afresh(tmp_path):
    """str.isdigit() holds for "²" (which int() refuses: the poll answered 400 "invalid
    literal for int()") and for "٣" (which int() reads as 3): a cursor of anything but ASCII
    digits is no cursor, and the answer starts from the beginning, as for "junk"."""
    run = tmp_path / "run"
    run.mkdir()
    _steps_csv(run / "steps.csv", range(5))
    running = Running(None, run_dir=run)
    try:
        cursor = running.call("/api/run?after=")[1]["cursor"]
        arabic = cursor.translate({ord(d): chr(0x660 + int(d)) for d in "0123456789"})
        for given in ("\u00b2-1-1-1-1-1", arabic):
            status, r = running.call("/api/run?after=" + urllib.parse.quote(given))
            assert status == 200, (given, r)
            assert r["incremental"] is False and r["steps"]["step"] == [0, 1, 2, 3, 4], given
        assert running.call("/api/run?after=" + cursor)[1]["incremental"] is True
    finally:
        running.stop()


def test_run_files_that_are_no_regular_files_are_said_not_read(tmp_path):
    """A link loop in the run folder made every poll a 500 (OSError from DirEntry.is_file);
    a FIFO named health.jsonl or history.csv held a quick-lane thread for good at its first
    poll (open() waits for a writer), so four polls took the page and /api/info down."""
    run = tmp_path / "run"
    run.mkdir()
    _steps_csv(run / "steps.csv", range(3))
    os.symlink("loop.csv", run / "loop.csv")
    os.symlink("x.safetensors", run / "x.safetensors")
    os.mkfifo(run / "health.jsonl")
    os.mkfifo(run / "history.csv")
    running = Running(None, run_dir=run)
    try:
        for query in ("", "?after=", "?after=", "?version=0", "?after=", "?after="):
            status, r = running.call("/api/run" + query, timeout=10)
            assert status == 200, (query, r)
            assert r["steps"]["step"] == [0, 1, 2] and r["health"] == []
            assert r["problems"] == ["health.jsonl: not a regular file: not read",
                                     "history.csv: not a regular file: not read"], r["problems"]
        assert running.call("/api/info", timeout=10)[0] == 200
    finally:
        running.stop()


def _steps_csv(path, steps, loss=lambda s: 5.0 - s / 1000, mode="w"):
    with open(path, mode) as f:
        if mode == "w":
            f.write("step,lr,loss,skipped,skip_reason\n")
        for s in steps:
            f.write(f"{s},0.001,{loss(s)},{int(s == 3)},{'nonfinite_loss' if s == 3 else ''}\n")


def test_the_poll_is_incremental(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _steps_csv(run / "steps.csv", range(100))
    (run / "health.jsonl").write_text(_health([{**HEALTH_ROW, "step": s}
                                               for s in range(0, 100, 10)]))
    running = Running(None, run_dir=run)
    try:
        first = running.call("/api/run?after=")[1]
        assert first["incremental"] is False and first["steps"]["step"] == list(range(100))
        assert len(first["health"]) == 10 and first["history"] is None
        assert first["steps"]["skips"] == [{"step": 3, "reason": "nonfinite_loss"}]
        again = running.call("/api/run?after=" + first["cursor"])[1]
        assert again["incremental"] is True and again["steps"]["step"] == []
        assert again["health"] == [] and "history" not in again and again["warnings"] == []
        assert len(json.dumps(again)) < 2000  # nothing moved: a few hundred bytes
        _steps_csv(run / "steps.csv", range(100, 105), mode="a")
        with open(run / "health.jsonl", "a") as f:
            f.write(json.dumps({**HEALTH_ROW, "step": 100, "warnings": ["new"]}) + "\n")
        more = running.call("/api/run?after=" + again["cursor"])[1]
        assert more["incremental"] is True and more["steps"]["step"] == list(range(100, 105))
        assert [r["step"] for r in more["health"]] == [100]
        assert more["warnings"] == [{"step": 100, "message": "new"}]
        # a resumed run writes steps 102.. again: the page starts afresh
        _steps_csv(run / "steps.csv", range(102, 104), loss=lambda s: 1.0, mode="a")
        resumed = running.call("/api/run?after=" + more["cursor"])[1]
        assert resumed["incremental"] is False
        assert resumed["steps"]["step"] == list(range(104)) and resumed["steps"]["loss"][-1] == 1
        # history.csv (written at the end) arrives once, then not again
        (run / "history.csv").write_text("step,train_loss,val_loss,lr\n0,5.0,5.1,0.001\n")
        ended = running.call("/api/run?after=" + resumed["cursor"])[1]
        assert ended["history"]["val_loss"] == [5.1]
        assert "history" not in running.call("/api/run?after=" + ended["cursor"])[1]
        # a cursor that is not one, of another server, or of a later state: from the start
        for cursor in ("junk", "1-2-3-4-5-6", ended["cursor"].replace("-", "-9", 1)):
            r = running.call("/api/run?after=" + cursor)[1]
            assert r["incremental"] is False and len(r["steps"]["step"]) == 104, cursor
        assert running.call("/api/run?after=" + "1" * 300)[0] == 400
    finally:
        running.stop()


def test_answers_are_cut_and_the_rest_follows(tmp_path, monkeypatch):
    monkeypatch.setitem(runfiles.ANSWER_ROWS, "steps", 40)
    run = tmp_path / "run"
    run.mkdir()
    _steps_csv(run / "steps.csv", range(100))
    watcher = RunWatcher(str(run))
    cursor, seen, answers = "", [], 0
    while True:
        r = watcher.poll(cursor)
        seen += r["steps"]["step"]
        cursor, answers = r["cursor"], answers + 1
        if not r["more"]:
            break
    assert seen == list(range(100)) and answers == 3


def test_files_are_read_with_a_size_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(runfiles, "CHUNK_BYTES", 400)
    monkeypatch.setattr(runfiles, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "health.jsonl"
    row = json.dumps({"step": 0, "loss": 1.0})  # 28 bytes and a newline
    path.write_text("".join(row.replace("0,", f"{s},", 1) + "\n" for s in range(100)))
    epochs = iter(range(1, 100))
    log = RowLog(str(path), "jsonl", lambda: next(epochs))
    log.refresh()
    first = len(log.rows)
    assert 0 < first and first * len(row) <= 400  # one chunk per refresh
    for _ in range(5):
        log.refresh()
    assert len(log.rows) * (len(row) + 1) <= 1000 < 100 * (len(row) + 1)  # capped
    assert any("over" in p and "not read" in p for p in log.problems)
    # history.csv over the cap: said, not read
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.csv").write_text("step,loss\n" + "1,2.0\n" * 300)
    snap = RunWatcher(str(run)).snapshot()
    assert snap["history"] is None and "history.csv" in snap["problems"][0]


def test_info_names_the_run_model_answering_without_a_model(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    files.save(tiny_model(), run / "model.safetensors", ByteTokenizer())
    running = Running(None, run_dir=run)
    try:
        info = running.call("/api/info")[1]
        assert info["model"] is None and info["default_model"] == "model.safetensors"
        status, a = running.call("/api/analyze", {"prompt": PROMPT})
        assert status == 200 and a["model"] == "model.safetensors"
        assert a["model_info"]["config"]["n_layers"] == 2
    finally:
        running.stop()
