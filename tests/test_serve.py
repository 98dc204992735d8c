"""`glassllm serve` without a browser: its answers equal the library's analyses, its guard
(token, Host, Origin, fetch metadata), its checks and limits, 1,000 malformed requests, a
training run read while it is written, Ctrl-C, `--port 0`, `train --serve`.

Every request goes to 127.0.0.1 only (a server this test starts, on a free port).
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from glassllm import cli  # noqa: E402
from glassllm.formats import files  # noqa: E402
from glassllm.tokenizers import ByteTokenizer  # noqa: E402
from glassllm.lens import interpret  # noqa: E402
from glassllm.serve.limits import Limits  # noqa: E402
from glassllm.serve.models import Loaded, encode_prompt  # noqa: E402
from glassllm.formats.inline_json import inline_json  # noqa: E402
from glassllm.serve.run import RunWatcher  # noqa: E402
from glassllm.serve.security import Gate, split_host  # noqa: E402

from serve_client import CORRUPTED, PROMPT, Running, tiny_model  # noqa: E402

@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def served(model):
    running = Running(Loaded("", "tiny", model, ByteTokenizer()))
    yield running
    running.stop()


def ids_of(text: str) -> np.ndarray:
    return np.asarray(encode_prompt(ByteTokenizer(), text), dtype=np.int64)


# --------------------------------------------------------------------------- answers
def test_analyze_equals_the_library(served, model):
    status, a = served.call("/api/analyze", {"prompt": PROMPT, "k": 3})
    assert status == 200, a
    ids = ids_of(PROMPT)
    s = interpret.token_surprise(model, ids, k=3)
    assert a["tokens"]["ids"] == ids.tolist()
    assert np.allclose(a["surprise"]["nats"], s.nats, atol=1e-5)
    assert a["surprise"]["rank"] == s.rank.tolist()
    assert math.isclose(a["surprise"]["mean_nats"], s.mean_nats, abs_tol=1e-6)
    lens = interpret.logit_lens(model, ids, k=3)
    assert np.allclose(a["lens"]["target_prob"], lens.target_prob, atol=1e-5)
    scores = interpret.detect_heads(model, ids, "induction")
    assert np.allclose(a["heads"]["induction"]["scores"], scores, atol=1e-3)
    assert a["heads"]["induction"]["measurable"] is True  # the prompt repeats itself
    assert len(a["attention"]) == 2 and len(a["attention"][0]) == 4
    row = a["attention"][1][2][10]  # layer 1, head 2, query 10: weights on keys 0..10
    assert len(row) == 11 and math.isclose(sum(row), 1.0, abs_tol=1e-3)


def test_ablation_equals_interpret_ablate(served, model):
    status, r = served.call("/api/ablate", {"prompt": PROMPT, "heads": [[1, 2]], "mlps": [0]})
    assert status == 200, r
    ids = ids_of(PROMPT)
    _, clean = interpret.ablate(model, ids[None, :-1], ids[None, 1:])
    _, ablated = interpret.ablate(model, ids[None, :-1], ids[None, 1:], heads=[(1, 2)], mlps=[0])
    assert ablated != clean
    assert math.isclose(r["clean_loss"], clean, abs_tol=1e-6)
    assert math.isclose(r["ablated_loss"], ablated, abs_tol=1e-6)
    assert math.isclose(r["loss_change"], ablated - clean, abs_tol=2e-6)
    # mean ablation: the means over the whole prompt (its last token included)
    status, mean = served.call("/api/ablate", {"prompt": PROMPT, "mlps": [0, 1], "how": "mean"})
    _, expected = interpret.ablate(model, ids[None, :-1], ids[None, 1:], mlps=[0, 1],
                                   how="mean", reference=ids[None, :])
    assert status == 200 and math.isclose(mean["ablated_loss"], expected, abs_tol=1e-6)


def test_patching_cells_equal_patching_sweep(served, model):
    status, r = served.call("/api/patch", {"clean": PROMPT, "corrupted": CORRUPTED,
                                           "correct": "t", "wrong": 100})
    assert status == 200, r
    clean, corrupted = ids_of(PROMPT), ids_of(CORRUPTED)
    sweep = interpret.patching_sweep(model, clean[None], corrupted[None],
                                     interpret.logit_difference(ord("t"), 100))
    assert np.asarray(r["values"]).shape == (2, len(clean))
    assert np.allclose(r["values"], sweep.values, atol=1e-5)
    assert np.allclose(r["normalised"], sweep.normalised(), atol=1e-4)
    status, heads = served.call("/api/patch", {"clean": PROMPT, "corrupted": CORRUPTED,
                                               "target": "attention.head_output"})
    assert status == 200 and np.asarray(heads["values"]).shape == (2, 4)
    assert heads["axes"] == ["layer", "head"] and heads["correct"] != heads["wrong"]


def test_attribution_and_its_self_check(served, model):
    status, r = served.call("/api/attribution", {"prompt": PROMPT, "position": 5, "token": "x",
                                                 "against": 101})
    assert status == 200, r
    a = interpret.logit_attribution(model, ids_of(PROMPT), position=5, token=ord("x"),
                                    against=101)
    assert r["labels"] == a.labels and np.allclose(r["values"], a.values, atol=1e-5)
    assert math.isclose(r["total"], a.total, abs_tol=1e-6) and r["self_check"].startswith("passed")
    status, r = served.call("/api/attribution", {"prompt": PROMPT, "token": "ab"})
    assert status == 400 and "2 tokens" in r["error"]


def test_generation_stream_equals_the_cli(served, model, tmp_path, capsys):
    path = tmp_path / "tiny.safetensors"
    files.save(model, path, ByteTokenizer())
    lines = served.stream({"prompt": "Once", "max_new_tokens": 20, "seed": 7})
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "end"
    tokens = [m for m in lines if m["event"] == "token"]
    assert len(tokens) == 20 and all(len(m["top"]) == 5 for m in tokens)
    text = "Once" + "".join(m["text"] for m in tokens) + lines[-1]["text"]
    assert cli.main(["generate", "--model", str(path), "--prompt", "Once",
                     "--max-new-tokens", "20", "--seed", "7"]) == 0
    assert capsys.readouterr().out == text + "\n"


def test_two_tabs_and_a_script_at_once(served):
    bodies = [("/api/analyze", {"prompt": PROMPT}), ("/api/ablate", {"prompt": PROMPT,
                                                                     "heads": [[0, 0]]}),
              ("/api/patch", {"clean": PROMPT, "corrupted": CORRUPTED})]
    alone = [served.call(path, body)[1] for path, body in bodies]
    together = [None] * 9

    def ask(i):
        together[i] = served.call(*bodies[i % 3])[1]
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == alone * 3


# --------------------------------------------------------------------------- the guard
def test_gate_pure_checks():
    gate = Gate("secret", 8765)
    ok = {"Host": "127.0.0.1:8765", "Authorization": "Bearer secret"}
    assert gate.refusal(ok, None) is None
    assert gate.refusal({"Host": "localhost:8765"}, "secret") is None
    assert gate.refusal({"Host": "[::1]:8765"}, "secret") is None
    assert "token" in gate.refusal({"Host": "127.0.0.1:8765"}, None)
    assert "token" in gate.refusal({"Host": "127.0.0.1:8765"}, "secreT")
    for host in ("evil.example:8765", "127.0.0.1:9999", "127.0.0.1", "", "127.0.0.1:x",
                 "127.0.0.1.evil.example:8765", "[::1"):
        assert "Host" in gate.refusal({**ok, "Host": host}, None), host
    for origin in ("http://evil.example:8765", "null", "https://127.0.0.1:8765",
                   "http://127.0.0.1:1"):
        assert "Origin" in gate.refusal({**ok, "Origin": origin}, None), origin
    assert gate.refusal({**ok, "Origin": "http://localhost:8765"}, None) is None
    assert "Sec-Fetch-Site" in gate.refusal({**ok, "Sec-Fetch-Site": "cross-site"}, None)
    wide = Gate("secret", 80, bind="0.0.0.0")
    assert wide.refusal({"Host": "192.0.2.7", "Authorization": "Bearer secret"}, None) is None
    assert wide.refusal({"Host": "rebound.example", "Authorization": "Bearer secret"}, None)
    assert split_host("[::1]:80") == ("::1", 80) and split_host("a:99999") is None


def test_token_host_origin_refused_with_403(served):
    for token in (None, "wrong"):
        status, r = served.call("/api/info", token=token)
        assert status == 403 and "token" in r["error"]
    assert served.call("/?token=" + served.token, token=None)[0] == 200  # the printed URL
    status, r = served.call("/api/info", headers={"Host": f"evil.example:{served.port}"})
    assert status == 403 and "Host" in r["error"]
    status, r = served.call("/api/analyze", {"prompt": PROMPT},
                            headers={"Origin": "http://evil.example"})
    assert status == 403 and "Origin" in r["error"]
    status, r = served.call("/api/info", headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 403


def test_page_headers_and_escaped_data(served):
    import urllib.request
    request = urllib.request.Request(served.url)
    with urllib.request.urlopen(request) as response:
        csp = response.headers["Content-Security-Policy"]
        html = response.read().decode()
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    nonce = csp.split("'nonce-")[1].split("'")[0]
    assert f'<script nonce="{nonce}">' in html and "http://" not in html.replace(
        "http://www.w3.org/2000/svg", "")
    hostile = {"s": "</script><!--<script>\u2028\u2029&>"}
    text = inline_json(hostile)
    assert not any(c in text for c in "<>&\u2028\u2029") and json.loads(text) == hostile
    # one escaping function for both pages (the report's escaped "<" only)
    from glassllm.lens import report
    from glassllm.serve import page
    assert report.inline_json is inline_json and page.inline_json is inline_json


def test_methods_paths_and_bodies(served):
    status, r = served.call("/api/analyze", method="GET")
    assert status == 405 and "Method Not Allowed" in r["error"]
    assert served.call("/api/info", {"x": 1}, method="POST")[0] == 405
    assert served.call("/api/nothing", {})[0] == 404
    status, r = served.call("/api/analyze", raw=b"x" * (10 << 20))  # a 10 MB body
    assert status == 413 and "limit" in r["error"]
    for raw, word in ((b"{", "JSON"), (b'{"prompt": NaN}', "JSON"), (b"[1]", "object"),
                      (b'{"prompt": "a", "extra": 1}', "unknown field"), (b"\xff", "UTF-8"),
                      (b"[" * 100000, "JSON")):
        status, r = served.call("/api/analyze", raw=raw)
        assert status == 400 and word in r["error"], (raw[:10], r)


def test_inputs_and_limits_refused_before_work(served):
    long_prompt = "x" * 70  # over max_len 64: cut to its first 64 tokens and said, not refused
    status, r = served.call("/api/analyze", {"prompt": long_prompt})
    assert status == 200 and len(r["tokens"]["ids"]) == 64 and "max_len 64" in r["cut"]
    cases = [("/api/analyze", {"prompt": "y" * (17 << 10)}, 413, "bytes"),
             ("/api/analyze", {"prompt": PROMPT, "k": 0}, 400, "k must be"),
             ("/api/attention", {"prompt": PROMPT, "layer": 2}, 400, "layer must be"),
             ("/api/attention", {"prompt": PROMPT, "layer": -1}, 400, "layer must be"),
             ("/api/attribution", {"prompt": PROMPT, "position": 10 ** 30}, 400, "position"),
             ("/api/attribution", {"prompt": PROMPT, "token": 257}, 400, "token"),
             ("/api/ablate", {"prompt": PROMPT, "heads": [[0, 4]]}, 400, "head must be"),
             ("/api/ablate", {"prompt": PROMPT, "heads": [[0, True]]}, 400, "head must be"),
             ("/api/ablate", {"prompt": PROMPT, "mlps": [1.5]}, 400, "mlp must be"),
             ("/api/ablate", {"prompt": PROMPT, "how": "half"}, 400, "how must be"),
             ("/api/patch", {"clean": PROMPT, "corrupted": "short"}, 400, "same length"),
             ("/api/generate", {"prompt": "a", "max_new_tokens": 10 ** 9}, 400,
              "max_new_tokens"),
             ("/api/generate", {"prompt": "a", "temperature": -1}, 400, "temperature"),
             ("/api/generate", {"prompt": "a", "top_p": 0}, 400, "top_p"),
             ("/api/generate", {"prompt": "a", "seed": -3}, 400, "seed"),
             ("/api/analyze", {"prompt": PROMPT, "model": "../etc/passwd.safetensors"}, 404,
              "run directory")]
    for path, body, code, word in cases:
        status, r = served.call(path, body)
        assert status == code and word in r["error"], (body, status, r)
        assert "\n" not in r["error"]


def test_work_over_the_limits_is_refused(model):
    running = Running(Loaded("", "tiny", model, ByteTokenizer()),
                      limits=Limits(patch_forwards=100, memory_bytes=1 << 16,
                                    attention_values=50))
    try:
        status, r = running.call("/api/patch", {"clean": PROMPT, "corrupted": CORRUPTED})
        assert status == 413 and "token-forwards" in r["error"]
        status, r = running.call("/api/analyze", {"prompt": PROMPT})
        assert status == 413 and "MiB" in r["error"]
        status, r = running.call("/api/attention", {"prompt": "abcdef", "layer": 0})
        assert status == 413 and "attention weights" in r["error"]
    finally:
        running.stop()


def _malformed(rng: random.Random):
    """One request that is wrong by construction: (path, raw body bytes)."""
    # "x" * 17 KiB: over the prompt byte limit (a prompt over max_len alone is cut, not wrong)
    bad_values = [None, True, -1, -(2 ** 70), 2 ** 70, 1e308, -1e-300, 3.5, "", "x" * (17 << 10),
                  [], {}, [[[]]], [1, 2, 3], {"a": 1}, "NaN", "\u0000", "\ud800", 10 ** 30]
    path, fields = rng.choice([
        ("/api/analyze", ["prompt", "k", "model"]), ("/api/attention", ["prompt", "layer"]),
        ("/api/attribution", ["prompt", "position", "token", "against"]),
        ("/api/ablate", ["prompt", "heads", "mlps", "how", "position", "k"]),
        ("/api/patch", ["clean", "corrupted", "target", "correct", "wrong", "position"]),
        ("/api/generate", ["prompt", "max_new_tokens", "temperature", "top_k", "top_p",
                           "seed", "k"]),
        ("/api/tokenize", ["prompt"]), ("/api/run/sample", ["prompt"])])
    kind = rng.randrange(6)
    if kind == 0:  # not JSON at all
        return path, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if kind == 1:  # NaN / Infinity literals, huge numbers
        literal = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000])
        return path, f'{{"{rng.choice(fields)}": {literal}}}'.encode()
    if kind == 2:  # an unknown field
        return path, json.dumps({"prompt": "ab", "no_such_field": 1}).encode()
    if kind == 3:  # not an object
        return path, json.dumps(rng.choice([[1], "text", 3, None, True])).encode()
    body = {"prompt": "hello there", "clean": "ab", "corrupted": "cd"}
    body = {k: v for k, v in body.items() if k in fields}
    # kind 4/5: every listed field, one or more of them of a wrong type or out of range
    wrong = rng.sample(fields, rng.randrange(1, len(fields) + 1))
    for name in wrong:
        value = rng.choice(bad_values)
        if name in ("prompt", "clean", "corrupted") and isinstance(value, str) and \
                value not in ("\ud800",) and len(value) < 300:
            value = 12345  # a string prompt would be fine: give a wrong type
        if name in ("model",) and value in (None, ""):
            value = "../../x.safetensors"
        if value is None and name not in ("prompt", "clean", "corrupted"):
            value = -1
        body[name] = value
    if path == "/api/generate" and "max_new_tokens" not in wrong:
        body["max_new_tokens"] = 10 ** 6
    try:
        return path, json.dumps(body).encode("utf-8", "surrogatepass")
    except ValueError:
        return path, b"{"


def test_a_thousand_malformed_requests(served, model):
    rng = random.Random(0)
    statuses = {}
    started = time.monotonic()
    for i in range(1000):  # bounded: 1,000 requests to 127.0.0.1 only
        path, raw = _malformed(rng)
        if i % 250 == 0:
            raw = b'{"prompt": "' + b"a" * (10 << 20) + b'"}'  # 10 MB
        status, r = served.call(path, raw=raw, timeout=30)
        assert 400 <= status < 500, (path, raw[:80], status, r)
        assert isinstance(r, dict) and isinstance(r.get("error"), str) and \
            "\n" not in r["error"] and "Traceback" not in r["error"], (path, raw[:80], r)
        statuses[status] = statuses.get(status, 0) + 1
    assert time.monotonic() - started < 300
    assert set(statuses) <= {400, 403, 404, 413}, statuses
    # and the server still answers correctly
    status, a = served.call("/api/analyze", {"prompt": PROMPT})
    s = interpret.token_surprise(model, ids_of(PROMPT))
    assert status == 200 and math.isclose(a["surprise"]["mean_nats"], s.mean_nats,
                                          abs_tol=1e-6)


def test_garbage_on_the_socket_does_not_kill_the_server(served):
    for junk in (b"\x00\xff garbage\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                 b"POST /api/analyze HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                 b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
            s.sendall(junk)
            reply = s.recv(200)
            assert reply[:8] in (b"HTTP/1.0", b"HTTP/1.1") and reply[9:10] == b"4", reply
    assert served.call("/api/info")[0] == 200


def test_a_malformed_request_is_one_line_on_the_terminal_not_a_traceback(served, capfd,
                                                                          caplog):
    # aiohttp logged each one as "Error handling request from 127.0.0.1" + a traceback (on
    # `glassllm serve`'s terminal through logging's last-resort handler; here, caplog's)
    import logging
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    for junk in (b"POST /api/analyze HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
                 b"GET / HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
            s.sendall(junk)
            assert s.recv(200)[9:12] == b"400"
    assert served.call("/api/info")[0] == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error handling request" not in err
    assert not [r for r in caplog.records if r.exc_info], caplog.text[:300]
    assert all(line.startswith("glassllm serve: refused a malformed HTTP request (400: ")
               for line in err.splitlines())


# --------------------------------------------------------------------------- the run
def test_run_watcher_survives_a_live_run(tmp_path):
    run = tmp_path / "run"
    watcher = RunWatcher(str(run))
    snap = watcher.snapshot()
    assert snap["exists"] is False and snap["steps"] is None and snap["health"] == []
    run.mkdir()
    log = run / "steps.csv"
    log.write_text("step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,skip_reason\n"
                   "0,0.001,1,1,5.0,0,\n1,0.002,1,1,4.5,1,nonfinite_loss\n2,0.003,1,1,4.")
    (run / "health.jsonl").write_text('{"step": 0, "loss": 5.0, "warnings": ["w1"]}\n{"step"')
    snap = watcher.snapshot()
    assert snap["steps"]["step"] == [0, 1] and snap["steps"]["loss"] == [5.0, 4.5]  # torn row
    assert [r["step"] for r in snap["health"]] == [0] and snap["problems"] == []
    assert {w["message"] for w in snap["warnings"]} == {"w1", "step 1 skipped: nonfinite_loss"}
    version = watcher.version()
    assert watcher.version() == version
    with open(log, "a") as f:  # the row completed, a resume writes step 2 again
        f.write("0\n2,0.003,1,1,3.9,0,\n3,0.004,1,1,3.5,0,\n")
    snap = watcher.snapshot()
    assert snap["version"] != version
    assert snap["steps"]["step"] == [0, 1, 2, 3] and snap["steps"]["loss"][2] == 3.9
    log.write_text("step,lr,loss\n0,0.1,9.0\n")  # the run restarted: the file replaced
    assert watcher.snapshot()["steps"]["loss"] == [9.0]
    (run / "health.jsonl").write_text("not json\n{}\n")
    assert "health.jsonl" in watcher.snapshot()["problems"][0]  # said, not raised


def test_run_models_confined_to_the_run_directory(tmp_path, model):
    run = tmp_path / "run"
    run.mkdir()
    files.save(model, run / "model.safetensors", ByteTokenizer())
    outside = tmp_path / "outside.safetensors"
    files.save(model, outside, ByteTokenizer())
    os.symlink(outside, run / "link.safetensors")
    (run / "notes.txt").write_text("x")
    running = Running(None, run_dir=run)
    try:
        status, r = running.call("/api/analyze", {"prompt": PROMPT})  # the run's newest model
        assert status == 200 and r["model"] == "model.safetensors"
        for name, code in (("../outside.safetensors", 403), (str(outside), 403),
                           ("link.safetensors", 403), ("notes.txt", 400),
                           ("sub/../../outside.safetensors", 403), ("a\x00.safetensors", 400),
                           ("missing.safetensors", 404), ("..\\outside.safetensors", 403)):
            status, r = running.call("/api/tokenize", {"prompt": "a", "model": name})
            assert status == code, (name, status, r)
        status, r = running.call("/api/run")
        assert status == 200 and [m["name"] for m in r["models"]] == ["model.safetensors"]
        assert running.call("/api/run?version=" + r["version"])[1] == {
            "unchanged": True, "version": r["version"]}
        status, r = running.call("/api/run/sample", {"max_new_tokens": 5})
        assert status == 200 and r["model"] == "model.safetensors"
    finally:
        running.stop()


# --------------------------------------------------------------------------- the command
def _start(args, env=None):
    proc = subprocess.Popen([sys.executable, "-m", "glassllm.cli", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    line = proc.stdout.readline()
    return proc, line


def test_serve_command_port_0_and_ctrl_c(tmp_path, model):
    path = tmp_path / "m.safetensors"
    files.save(model, path, ByteTokenizer())
    proc, line = _start(["serve", "--model", str(path), "--port", "0"])
    try:
        assert line.startswith("glassllm serve: http://127.0.0.1:"), line + proc.stderr.read()
        url = line.split(": ", 1)[1].strip()
        port = int(url.split(":")[2].split("/")[0])
        assert port > 0
        import urllib.request
        with urllib.request.urlopen(url.replace("/?", "/api/info?"), timeout=30) as r:
            assert json.loads(r.read())["model"]["label"] == "m.safetensors"
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        assert proc.wait(10) == 0
        assert time.monotonic() - started < 5
    finally:
        proc.kill()
        proc.wait()


def test_serve_command_errors(tmp_path, capsys, monkeypatch):
    assert cli.main(["serve"]) == 2
    assert "--model PATH, --run DIR" in capsys.readouterr().err
    assert cli.main(["serve", "--model", str(tmp_path / "none.safetensors")]) == 2
    assert "none.safetensors" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # as if glassllm[serve] were missing
    monkeypatch.delitem(sys.modules, "glassllm.serve.app", raising=False)
    assert cli.main(["serve", "--run", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "glassllm serve: error: glassllm serve needs aiohttp: pip install " \
                  "'glassllm[serve]'"


def test_train_serve_shows_the_run_while_it_runs(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 400)
    out = tmp_path / "run" / "model.safetensors"
    proc = subprocess.Popen(
        [sys.executable, "-m", "glassllm.cli", "train", "--data", str(data), "--out", str(out),
         "--steps", "4000", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
         "--seq-len", "16", "--batch-size", "2", "--eval-every", "2000", "--threads", "1",
         "--serve"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stdout:
            if line.startswith("serve: "):
                url = line.split(": ", 1)[1].strip()
                break
        assert url is not None, proc.stderr.read()
        import urllib.request
        seen = []
        deadline = time.monotonic() + 120
        # 4000 steps of ~2 ms: many polls of 0.3 s; a run that ends between the check and
        # the request (a fast machine) ends the polling, the assertion below says how far
        while time.monotonic() < deadline and proc.poll() is None and len(set(seen)) < 3:
            try:
                with urllib.request.urlopen(url.replace("/?", "/api/run?"), timeout=30) as r:
                    run = json.loads(r.read())
            except OSError:
                if proc.poll() is not None:
                    break
                raise
            if run["steps"]:
                seen.append(len(run["steps"]["step"]))
            time.sleep(0.3)
        assert len(set(seen)) >= 3 and seen == sorted(seen), seen  # points arriving
        assert proc.wait(300) == 0
        with pytest.raises(OSError):  # the server stopped with the training
            urllib.request.urlopen(url.replace("/?", "/api/info?"), timeout=10)
        assert (tmp_path / "run" / "steps.csv").exists()
    finally:
        proc.kill()
        proc.wait()


def test_serve_reads_a_llama2c_checkpoint_with_its_tokenizer():
    import argparse

    from conftest import shared_data_path
    folder = shared_data_path("llama2c")
    args = argparse.Namespace(model=str(folder / "stories260K.bin"),
                              tokenizer=str(folder / "tok512.bin"))
    model, tokenizer = cli._serve_model(args)
    assert model.cfg.n_layers == 5 and tokenizer.vocab_size == 512
    args.tokenizer = None
    with pytest.raises(cli.UsageError, match="no tokenizer"):
        cli._serve_model(args)
