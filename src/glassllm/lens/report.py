"""The inspection report: what a model computes on one prompt, as terminal text and as one
self-contained HTML page (`glassllm inspect`).

    ins = inspect_model(model, ids, tokenizer, run_dir="runs")
    print(summary(ins, color=True))
    write_html(ins, "report.html")

The page has no network access of any kind: its CSS, JavaScript and data are inline, it draws
with the DOM, <canvas> and inline SVG, and opens from disk (`tests/test_report_browser.py`
opens it in headless Chromium and checks there are no console errors). Views: attention per
layer and head (hover a token: where it attends), the logit lens grid, token surprise,
direct logit attribution bars, head types, and, given a run directory, the training curves
(history.csv) and health panels (health.jsonl) -- after CircuitsVis' attention and logit views
and bertviz's head_view, without their CDN.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import unicodedata

import numpy as np

from . import interpret
from ..formats.atomic import atomic_write
from ..model import GlassLM
from .trace import run_with_cache


@dataclasses.dataclass
class Inspection:
    """Everything the report shows, as arrays (see `inspect_model`)."""
    cfg: dict
    ids: np.ndarray
    text: TokenTexts  # token id -> display text
    surprise: interpret.Surprise
    lens: interpret.LogitLens
    attributions: list[interpret.Attribution]
    patterns: np.ndarray  # (L, H, T, T)
    head_kinds: dict[str, np.ndarray]  # kind -> (L, H)
    history: dict | None = None
    health: list[dict] | None = None
    title: str = "glassllm inspect"


def token_text(tokenizer, token_id: int) -> str:
    """A token as display text: its bytes decoded as UTF-8 with undecodable bytes as \\xNN;
    "<id>" without a tokenizer."""
    token_id = int(token_id)
    if tokenizer is None:
        return f"<{token_id}>"
    if token_id == getattr(tokenizer, "bos_id", None):
        return "<s>"
    if token_id == getattr(tokenizer, "eot_id", None):
        return "<|eot|>"
    if hasattr(tokenizer, "piece_bytes"):  # SentencePiece: the piece, its leading space kept
        raw = tokenizer.piece_bytes(token_id, prev_id=-1)
    else:
        raw = tokenizer.decode_bytes([token_id])
    return raw.decode("utf-8", errors="backslashreplace")


def inspect_model(model: GlassLM, ids, tokenizer=None, run_dir=None, k: int = 5,
                  title: str = "glassllm inspect") -> Inspection:
    """Run every analysis of the report on one prompt (ids (T,), T >= 2).

    Attribution at position t is for the token that actually comes next (t < T-1), and for
    the model's top guess at the last position. run_dir: a training run directory; its
    history.csv / health.jsonl, when present, are included.

    Raises ValueError for a prompt of fewer than 2 tokens (nothing to predict) and the
    errors of `glassllm.lens.interpret`'s functions.
    """
    ids = model.check_ids(ids)
    if ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"inspect needs one prompt of at least 2 tokens, got shape {ids.shape}")
    T = ids.shape[1]
    surprise = interpret.token_surprise(model, ids, k=k)
    lens = interpret.logit_lens(model, ids, k=k)
    L = model.cfg.n_layers
    names = ["token_embedding", "blocks.*.attention.pattern", "blocks.*.attention.head_output",
             "blocks.*.mlp.output", f"blocks.{L - 1}.residual_out", "logits"]
    if model.cfg.family == "gpt2":
        names.append("position_embedding")
    _, cache = run_with_cache(model, ids, names=names)  # what attribution and the views need
    attributions = []
    for t in range(T):
        token = int(ids[0, t + 1]) if t + 1 < T else None
        attributions.append(interpret.logit_attribution(model, ids, position=t, token=token,
                                                        cache=cache))
    patterns = cache.stack("blocks.{layer}.attention.pattern")[:, 0]
    head_kinds = {}
    for kind in interpret.HEAD_KINDS:
        detection = interpret.detection_pattern(ids[0], kind)
        head_kinds[kind] = interpret.head_scores(patterns, detection)
    history = health = None
    if run_dir is not None:
        history, health = read_run(run_dir)
    return Inspection(model.cfg.to_dict(), ids[0], TokenTexts(tokenizer), surprise, lens,
                      attributions, patterns, head_kinds, history, health, title)


class TokenTexts:
    """Token id -> display text (`token_text`), remembered per id."""

    def __init__(self, tokenizer):
        self.tokenizer, self.known = tokenizer, {}

    def __call__(self, token_id) -> str:
        token_id = int(token_id)
        if token_id not in self.known:
            self.known[token_id] = token_text(self.tokenizer, token_id)
        return self.known[token_id]


def read_run(run_dir) -> tuple[dict | None, list[dict] | None]:
    """(history, health rows) of a run directory: history via `plots.read_history` (None if
    absent), health.jsonl rows via `health.read_health` (None if absent; a torn last line,
    from a run killed mid-write, is skipped).

    Raises FileNotFoundError if run_dir is not a directory; ValueError for a corrupt history
    or health.jsonl (naming the file and line).
    """
    from .plots import find_history, read_history
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"run directory not found: {run_dir}")
    try:
        history = read_history(find_history(run_dir))
    except FileNotFoundError:
        history = None
    from .health import read_health
    path = os.path.join(run_dir, "health.jsonl")
    health = read_health(path) if os.path.isfile(path) else None
    return history, health


# --------------------------------------------------------------------------- terminal
def _ansi_bg(level: float) -> str:
    """24-bit background from green (0) through yellow to red (1)."""
    level = min(max(level, 0.0), 1.0)
    r = int(255 * min(1.0, 2 * level))
    g = int(255 * min(1.0, 2 * (1 - level)))
    return f"\x1b[48;2;{r};{g};60m\x1b[38;2;0;0;0m"


def _visible(text: str) -> str:
    """Text safe to print on a terminal: newline and tab as arrows, every other control
    character (ESC, CR, DEL, C1; Unicode category Cc) as \\xNN, so a token cannot move the
    cursor, recolour or clear the screen."""
    text = text.replace("\n", "\u21b5").replace("\t", "\u21e5")
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" else c for c in text)


def summary(ins: Inspection, color: bool = False, top: int = 5) -> str:
    """The terminal summary: the prompt coloured by surprise (bits; a legend says the
    scale), the logit lens' top guesses per layer at the last position, the parts with the
    largest attribution there, and the strongest head of each type."""
    cfg, s = ins.cfg, ins.surprise
    T = len(ins.ids)
    lines = [f"{ins.title}: {cfg['family']} model, d_model {cfg['d_model']}, "
             f"{cfg['n_layers']} layers, {cfg['n_heads']} heads; {T} tokens",
             f"mean surprise {s.mean_nats:.3f} nats = {s.mean_nats / math.log(2):.3f} bits "
             f"per token (predicting tokens 2..{T})"]
    cap = max(8.0, float(np.max(s.bits)))
    parts = [_visible(ins.text(ins.ids[0]))]
    for t in range(1, T):
        text = _visible(ins.text(ins.ids[t]))
        bits = float(s.bits[t - 1])
        parts.append(f"{_ansi_bg(bits / cap)}{text}\x1b[0m" if color else f"{text}[{bits:.1f}]")
    lines.append("tokens coloured by surprise" +
                 (f" (green 0 bits -> red {cap:.0f} bits):" if color else " [bits]:"))
    lines.append("".join(parts))
    lines.append(f"logit lens at the last position (after '{_visible(ins.text(ins.ids[-1]))}'):")
    for row, label in enumerate(ins.lens.layers):
        guesses = ", ".join(f"'{_visible(ins.text(i))}' {p:.2f}"
                            for i, p in zip(ins.lens.top_ids[row, -1][:top],
                                            ins.lens.top_probs[row, -1][:top]))
        lines.append(f"  {label:>10}: {guesses}")
    attr = ins.attributions[-1]
    lines.append(f"largest direct attributions to the top guess "
                 f"'{_visible(ins.text(attr.token))}' (logit {attr.total:.3f}):")
    for label, value in attr.top(top):
        lines.append(f"  {label:>18} {value:+.3f}")
    heads = attr.heads()
    order = np.argsort(-np.abs(heads), axis=None, kind="stable")[:top]
    lines.append("  heads: " + ", ".join(
        f"L{layer}H{head} {heads[layer, head]:+.3f}"
        for layer, head in (np.unravel_index(i, heads.shape) for i in order)))
    for kind, scores in ins.head_kinds.items():
        layer, head = np.unravel_index(int(np.argmax(scores)), scores.shape)
        name = kind.replace("_", "-")
        if interpret.detection_pattern(ins.ids, kind).sum() == 0:
            lines.append(f"{name} heads: not measurable on this prompt (no repeated token)")
        else:
            lines.append(f"strongest {name} head: L{layer}H{head} "
                         f"score {scores[layer, head]:.2f}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- HTML
def _r(a, digits=4):
    """Rounded nested lists for JSON (NaN/inf -> None)."""
    a = np.asarray(a, dtype=np.float64)
    out = np.round(a, digits).tolist()
    if not np.all(np.isfinite(a)):
        def clean(x):
            return [clean(v) for v in x] if isinstance(x, list) else \
                (x if math.isfinite(x) else None)
        out = clean(out)
    return out


def _f(x, digits=4):
    """One rounded float for JSON (NaN/inf -> None: a model whose float32 forward overflows
    still gets its page)."""
    x = float(x)
    return round(x, digits) if math.isfinite(x) else None


def page_data(ins: Inspection) -> dict:
    """The JSON the page draws from."""
    text = ins.text
    T = len(ins.ids)
    s, lens = ins.surprise, ins.lens
    attention = [[[_r(ins.patterns[layer, h, i, :i + 1]) for i in range(T)]
                  for h in range(ins.patterns.shape[1])] for layer in range(ins.patterns.shape[0])]
    attributions = []
    for a in ins.attributions:
        order = np.argsort(-np.abs(a.values), kind="stable")[:16]
        attributions.append(dict(position=a.position, token=text(a.token),
                                 total=_f(a.total),
                                 labels=[a.labels[i] for i in order],
                                 values=_r(a.values[order]), heads=_r(a.heads())))
    data = dict(
        title=ins.title, model=ins.cfg, tokens=[text(i) for i in ins.ids],
        ids=[int(i) for i in ins.ids],
        surprise=dict(nats=_r(s.nats), bits=_r(s.bits), rank=s.rank.tolist(),
                      top=[[[text(i), _f(p)] for i, p in zip(ti, tp)]
                           for ti, tp in zip(s.top_ids, s.top_probs)], mean_nats=_f(s.mean_nats, 6)),
        lens=dict(layers=lens.layers,
                  top=[[[[text(i), _f(p)] for i, p in zip(ti, tp)]
                        for ti, tp in zip(row_ids, row_p)]
                       for row_ids, row_p in zip(lens.top_ids, lens.top_probs)],
                  target_prob=_r(lens.target_prob), target_rank=lens.target_rank.tolist()),
        attention=attention, attributions=attributions,
        heads={kind: _r(v, 3) for kind, v in ins.head_kinds.items()},
        run=None)
    if ins.history is not None or ins.health:
        from .health import BANDS
        data["run"] = dict(history={k: _r(v, 5) for k, v in (ins.history or {}).items()},
                           health=ins.health or [], bands=BANDS)
    return data


def render_html(ins: Inspection) -> str:
    """The report as one HTML document (str): no external resource of any kind."""
    payload = json.dumps(page_data(ins), ensure_ascii=False, allow_nan=False)
    payload = payload.replace("</", "<\\/")  # never close the <script> from inside the data
    title = ins.title.replace("&", "&amp;").replace("<", "&lt;")
    return _PAGE.replace("__TITLE__", title).replace("__DATA__", payload)


def check_report_path(path, label: str = "--out") -> None:
    """Refuse, before any analysis runs, a report path that cannot be written: empty, a
    directory, in a directory that does not exist, or without write permission there
    (`runfiles.check_output_paths`). Raises ValueError, one line naming `label` and path."""
    from ..training.runfiles import check_output_paths
    check_output_paths({label: path})
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(directory):
        raise ValueError(f"{label} {os.fspath(path)}: directory {directory} does not exist")


def write_html(ins: Inspection, path) -> str:
    """Write `render_html(ins)` to path atomically; returns path."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(render_html(ins))
    return os.fspath(path)


_PAGE = r"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>__TITLE__</title>
<link rel="icon" href="data:,">
<style>
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1d2b3a;color:#fff;padding:10px 18px}
header h1{font-size:18px;margin:0 0 4px 0}
header .meta{font-size:12px;opacity:.8}
nav{display:flex;gap:4px;padding:8px 18px;background:#e9edf1;flex-wrap:wrap}
nav button{border:1px solid #b8c2cc;background:#fff;padding:5px 12px;border-radius:4px;cursor:pointer;font-size:13px}
nav button.active{background:#1d6fb8;color:#fff;border-color:#1d6fb8}
section.view{display:none;padding:14px 18px}
section.view.active{display:block}
.tokens{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:15px;line-height:2.1;max-width:1100px}
.tok{padding:2px 1px;margin:0 1px;border-radius:3px;white-space:pre;cursor:default;border:1px solid transparent}
.tok.query{border-color:#111}
.controls{margin:6px 0 10px 0;font-size:13px}
.controls select{margin-right:14px}
.note{font-size:12px;color:#555;max-width:900px}
table.grid{border-collapse:collapse;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
table.grid td,table.grid th{border:1px solid #ddd;padding:2px 4px;text-align:center;white-space:pre}
table.grid th{background:#eef1f4;font-weight:600}
.bars{font-size:12px;font-family:ui-monospace,Menlo,Consolas,monospace}
.bar-row{display:flex;align-items:center;height:20px}
.bar-label{width:150px;text-align:right;padding-right:8px}
.bar-track{position:relative;width:520px;height:14px;background:#f0f0f0}
.bar{position:absolute;top:0;height:14px}
.bar-value{width:80px;padding-left:8px}
#tooltip{position:fixed;pointer-events:none;background:#222;color:#fff;font-size:12px;padding:4px 7px;border-radius:3px;display:none;white-space:pre;z-index:10}
.charts{display:flex;flex-wrap:wrap;gap:14px}
.chart{background:#fff;border:1px solid #ddd;padding:6px;max-width:440px}
.chart h3{font-size:13px;margin:2px 0 4px 4px}
.legend{font-size:11px}
</style></head>
<body>
<header><h1 id="title"></h1><div class="meta" id="meta"></div></header>
<nav id="nav"></nav>
<section class="view" id="view-attention" data-title="Attention">
  <div class="controls">layer <select id="att-layer"></select> head <select id="att-head"></select>
  <span class="note">Hover a token: the others light up by how much it attends to them. Hover the map for numbers.</span></div>
  <div class="tokens" id="att-tokens"></div>
  <canvas id="att-canvas"></canvas>
</section>
<section class="view" id="view-lens" data-title="Logit lens">
  <p class="note">Each layer's residual stream through the final norm and the unembedding: the top guess for the next token and its probability (colour). Hover a cell for the top 5 and the probability and rank of the token that actually comes next.</p>
  <div id="lens-grid"></div>
</section>
<section class="view" id="view-surprise" data-title="Surprise">
  <p class="note" id="surprise-note"></p>
  <div class="tokens" id="surprise-tokens"></div>
</section>
<section class="view" id="view-attribution" data-title="Attribution">
  <div class="controls">position <select id="attr-pos"></select> <span class="note" id="attr-note"></span></div>
  <div class="bars" id="attr-bars"></div>
  <h3 style="font-size:13px">per head (layer &times; head)</h3>
  <div id="attr-heads"></div>
</section>
<section class="view" id="view-heads" data-title="Head types">
  <p class="note">Share of each head's attention on the positions an ideal head of the kind would attend to, on this prompt (TransformerLens' head_detector, "mul"). Induction needs a repeated stretch in the prompt.</p>
  <div id="heads-tables" class="charts"></div>
</section>
<section class="view" id="view-training" data-title="Training">
  <div id="train-charts" class="charts"></div>
  <h3 style="font-size:14px">Health</h3>
  <div id="health-charts" class="charts"></div>
</section>
<div id="tooltip"></div>
<script>
"use strict";
const DATA = __DATA__;
const $ = (id) => document.getElementById(id);
const tip = $("tooltip");
function showTip(ev, text) { tip.textContent = text; tip.style.display = "block";
  tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 10) + "px"; }
function hideTip() { tip.style.display = "none"; }
function vis(t) { return t.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205"; }
function el(tag, attrs, text) { const e = document.createElement(tag);
  for (const k in (attrs || {})) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text; return e; }
function fmt(x, d) { return (x === null || x === undefined) ? "-" : Number(x).toFixed(d === undefined ? 3 : d); }
function blue(a) { return "rgba(29,111,184," + Math.max(0, Math.min(1, a)).toFixed(3) + ")"; }
function heat(v) { const x = Math.max(0, Math.min(1, v)); // white -> orange -> red
  return "rgb(255," + Math.round(255 - 180 * x) + "," + Math.round(255 - 235 * x) + ")"; }
function diverging(v, scale) { const x = Math.max(-1, Math.min(1, v / (scale || 1)));
  return x >= 0 ? "rgba(29,111,184," + x.toFixed(3) + ")" : "rgba(200,40,40," + (-x).toFixed(3) + ")"; }

// ------------------------------------------------------------------ navigation
function show(name) {
  for (const s of document.querySelectorAll("section.view")) s.classList.toggle("active", s.id === "view-" + name);
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.view === name);
}
function buildNav() {
  for (const s of document.querySelectorAll("section.view")) {
    const name = s.id.slice(5);
    if (name === "training" && !DATA.run) { s.remove(); continue; }
    const b = el("button", {"data-view": name, "id": "nav-" + name}, s.dataset.title);
    b.addEventListener("click", () => show(name));
    $("nav").appendChild(b);
  }
  show("attention");
}

// ------------------------------------------------------------------ attention
function buildAttention() {
  const L = DATA.attention.length, H = DATA.attention[0].length, T = DATA.tokens.length;
  for (let l = 0; l < L; l++) $("att-layer").appendChild(el("option", {value: l}, String(l)));
  for (let h = 0; h < H; h++) $("att-head").appendChild(el("option", {value: h}, String(h)));
  const spans = DATA.tokens.map((t, i) => { const s = el("span", {"class": "tok", "data-i": i}, vis(t));
    $("att-tokens").appendChild(s); return s; });
  const cell = Math.max(6, Math.min(22, Math.floor(560 / T)));
  const canvas = $("att-canvas"); canvas.width = cell * T; canvas.height = cell * T;
  const ctx = canvas.getContext("2d");
  const rows = () => DATA.attention[+$("att-layer").value][+$("att-head").value];
  function draw() {
    const r = rows(); ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < T; i++) for (let j = 0; j <= i; j++) {
      ctx.fillStyle = blue(r[i][j]); ctx.fillRect(j * cell, i * cell, cell, cell); }
    ctx.strokeStyle = "#999"; ctx.strokeRect(0, 0, canvas.width, canvas.height);
  }
  function light(i) { const r = rows();
    spans.forEach((s, j) => { s.style.background = j <= i ? blue(r[i][j]) : "transparent";
      s.classList.toggle("query", j === i); }); }
  function clear() { spans.forEach((s) => { s.style.background = "transparent"; s.classList.remove("query"); }); }
  spans.forEach((s, i) => { s.addEventListener("mouseenter", () => light(i)); s.addEventListener("mouseleave", clear); });
  canvas.addEventListener("mousemove", (ev) => { const b = canvas.getBoundingClientRect();
    const j = Math.floor((ev.clientX - b.left) / cell), i = Math.floor((ev.clientY - b.top) / cell);
    if (i < 0 || i >= T || j < 0 || j > i) { hideTip(); return; }
    showTip(ev, "query " + i + " " + JSON.stringify(DATA.tokens[i]) + " \u2192 key " + j + " " +
      JSON.stringify(DATA.tokens[j]) + ": " + fmt(rows()[i][j], 4)); });
  canvas.addEventListener("mouseleave", hideTip);
  $("att-layer").addEventListener("change", draw); $("att-head").addEventListener("change", draw);
  draw();
}

// ------------------------------------------------------------------ logit lens
function buildLens() {
  const lens = DATA.lens, T = DATA.tokens.length, table = el("table", {"class": "grid", "id": "lens-table"});
  const head = el("tr"); head.appendChild(el("th", {}, "layer \\ after"));
  DATA.tokens.forEach((t) => head.appendChild(el("th", {}, vis(t)))); table.appendChild(head);
  lens.layers.forEach((name, l) => { const tr = el("tr"); tr.appendChild(el("th", {}, name));
    for (let t = 0; t < T; t++) { const [tok, p] = lens.top[l][t][0];
      const td = el("td", {}, vis(tok).replace(/ /g, "\u2423")); td.style.background = heat(p);
      let text = name + ", after position " + t + ":\n" + lens.top[l][t].map(([x, q]) => JSON.stringify(x) + " " + fmt(q)).join("\n");
      if (t < T - 1) text += "\nnext token " + JSON.stringify(DATA.tokens[t + 1]) + ": p " + fmt(lens.target_prob[l][t], 4) + ", rank " + lens.target_rank[l][t];
      td.addEventListener("mousemove", (ev) => showTip(ev, text)); td.addEventListener("mouseleave", hideTip);
      tr.appendChild(td); }
    table.appendChild(tr); });
  $("lens-grid").appendChild(table);
}

// ------------------------------------------------------------------ surprise
function buildSurprise() {
  const s = DATA.surprise, cap = Math.max(8, ...s.bits);
  $("surprise-note").textContent = "Each token coloured by the surprise of predicting it (white 0 bits, red " + cap.toFixed(0) +
    " bits). Mean " + fmt(s.mean_nats) + " nats = " + fmt(s.mean_nats === null ? null : s.mean_nats / Math.LN2) + " bits per token. Hover for rank and alternatives.";
  DATA.tokens.forEach((t, i) => { const span = el("span", {"class": "tok"}, vis(t));
    if (i > 0) { span.style.background = heat(s.bits[i - 1] / cap);
      const text = "token " + i + " " + JSON.stringify(t) + ": " + fmt(s.nats[i - 1]) + " nats, " + fmt(s.bits[i - 1]) +
        " bits, rank " + s.rank[i - 1] + "\nmodel's top guesses:\n" + s.top[i - 1].map(([x, p]) => JSON.stringify(x) + " " + fmt(p)).join("\n");
      span.addEventListener("mousemove", (ev) => showTip(ev, text)); span.addEventListener("mouseleave", hideTip); }
    $("surprise-tokens").appendChild(span); });
}

// ------------------------------------------------------------------ attribution
function buildAttribution() {
  const sel = $("attr-pos"), T = DATA.tokens.length;
  DATA.attributions.forEach((a, t) => sel.appendChild(el("option", {value: t}, t + " " + vis(DATA.tokens[t]))));
  sel.value = T - 1;
  function draw() {
    const a = DATA.attributions[+sel.value];
    $("attr-note").textContent = "logit of " + JSON.stringify(a.token) + (+sel.value < T - 1 ? " (the next token)" : " (the model's top guess)") +
      " = " + fmt(a.total) + "; the parts sum to it (checked).";
    const box = $("attr-bars"); box.textContent = "";
    const scale = Math.max(...a.values.map(Math.abs)) || 1;
    a.labels.forEach((label, i) => { const v = a.values[i], row = el("div", {"class": "bar-row"});
      row.appendChild(el("div", {"class": "bar-label"}, label));
      const track = el("div", {"class": "bar-track"}), bar = el("div", {"class": "bar"});
      const w = 50 * Math.abs(v) / scale; bar.style.width = w + "%";
      bar.style.left = (v >= 0 ? 50 : 50 - w) + "%"; bar.style.background = v >= 0 ? "#1d6fb8" : "#c82828";
      track.appendChild(bar); row.appendChild(track); row.appendChild(el("div", {"class": "bar-value"}, (v >= 0 ? "+" : "") + fmt(v)));
      box.appendChild(row); });
    const grid = $("attr-heads"); grid.textContent = "";
    const table = el("table", {"class": "grid"}), hs = a.heads, m = Math.max(...hs.flat().map(Math.abs)) || 1;
    const head = el("tr"); head.appendChild(el("th", {}, "layer"));
    hs[0].forEach((_, h) => head.appendChild(el("th", {}, "H" + h))); table.appendChild(head);
    hs.forEach((row, l) => { const tr = el("tr"); tr.appendChild(el("th", {}, "L" + l));
      row.forEach((v) => { const td = el("td", {}, fmt(v, 2)); td.style.background = diverging(v, m); tr.appendChild(td); });
      table.appendChild(tr); });
    grid.appendChild(table);
  }
  sel.addEventListener("change", draw); draw();
}

// ------------------------------------------------------------------ head types
function buildHeads() {
  for (const kind in DATA.heads) { const scores = DATA.heads[kind], box = el("div", {"class": "chart"});
    box.appendChild(el("h3", {}, kind.replace(/_/g, "-")));
    const table = el("table", {"class": "grid"}), head = el("tr"); head.appendChild(el("th", {}, "layer"));
    scores[0].forEach((_, h) => head.appendChild(el("th", {}, "H" + h))); table.appendChild(head);
    scores.forEach((row, l) => { const tr = el("tr"); tr.appendChild(el("th", {}, "L" + l));
      row.forEach((v) => { const td = el("td", {}, fmt(v, 2)); td.style.background = heat(v); tr.appendChild(td); });
      table.appendChild(tr); });
    box.appendChild(table); $("heads-tables").appendChild(box); }
}

// ------------------------------------------------------------------ training
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1d6fb8", "#e07b00", "#2a9d4b", "#c82828", "#7b52ab", "#8c564b", "#d6619e", "#6b6b6b", "#b5b800", "#17becf"];
function svg(tag, attrs) { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); return e; }
function lineChart(parent, title, series, opts) {
  opts = opts || {}; const W = 430, Hh = 230, m = {l: 52, r: 10, t: 8, b: 30};
  const box = el("div", {"class": "chart"}); box.appendChild(el("h3", {}, title));
  const s = svg("svg", {width: W, height: Hh, viewBox: "0 0 " + W + " " + Hh});
  const pts = series.flatMap((d) => d.x.map((x, i) => [x, d.y[i]])).filter(([x, y]) => y !== null && isFinite(y) && (!opts.log || y > 0));
  if (!pts.length) return;
  const tr = (y) => opts.log ? Math.log10(y) : y;
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => tr(p[1]))), y1 = Math.max(...pts.map((p) => tr(p[1])));
  if (opts.band) { y0 = Math.min(y0, opts.band[0]); y1 = Math.max(y1, opts.band[1]); }
  if (x1 === x0) x1 = x0 + 1; if (y1 === y0) { y1 += 1; y0 -= 1; }
  const X = (x) => m.l + (x - x0) / (x1 - x0) * (W - m.l - m.r), Y = (y) => Hh - m.b - (tr(y) - y0) / (y1 - y0) * (Hh - m.t - m.b);
  const Yraw = (v) => Hh - m.b - (v - y0) / (y1 - y0) * (Hh - m.t - m.b);
  if (opts.band) s.appendChild(svg("rect", {x: m.l, width: W - m.l - m.r, y: Yraw(opts.band[1]), height: Yraw(opts.band[0]) - Yraw(opts.band[1]), fill: "#e8f4e8"}));
  s.appendChild(svg("line", {x1: m.l, x2: W - m.r, y1: Hh - m.b, y2: Hh - m.b, stroke: "#888"}));
  s.appendChild(svg("line", {x1: m.l, x2: m.l, y1: m.t, y2: Hh - m.b, stroke: "#888"}));
  for (let k = 0; k <= 4; k++) { const v = y0 + (y1 - y0) * k / 4, t = svg("text", {x: m.l - 4, y: Yraw(v) + 4, "text-anchor": "end", "font-size": 10});
    t.textContent = opts.log ? "1e" + v.toFixed(1) : Number(v.toPrecision(3)); s.appendChild(t);
    const u = x0 + (x1 - x0) * k / 4, tx = svg("text", {x: X(u), y: Hh - m.b + 14, "text-anchor": "middle", "font-size": 10});
    tx.textContent = Math.round(u); s.appendChild(tx); }
  series.forEach((d, n) => { let path = "";
    d.x.forEach((x, i) => { const y = d.y[i]; if (y === null || !isFinite(y) || (opts.log && y <= 0)) return;
      path += (path ? "L" : "M") + X(x).toFixed(1) + "," + Y(y).toFixed(1); });
    if (path) s.appendChild(svg("path", {d: path, fill: "none", stroke: d.color || COLORS[n % COLORS.length], "stroke-width": 1.5})); });
  box.appendChild(s);
  const legend = el("div", {"class": "legend"});
  series.slice(0, 12).forEach((d, n) => { const item = el("span", {}, "\u25a0 " + d.name + "  "); item.style.color = d.color || COLORS[n % COLORS.length]; legend.appendChild(item); });
  if (series.length > 12) legend.appendChild(el("span", {}, "(+" + (series.length - 12) + " more)"));
  box.appendChild(legend); parent.appendChild(box);
}
function buildTraining() {
  if (!DATA.run) return;
  const h = DATA.run.history;
  if (h && h.step && h.step.length) {
    lineChart($("train-charts"), "loss (nats per token)", [{name: "train", x: h.step, y: h.train_loss}, {name: "val", x: h.step, y: h.val_loss}]);
    lineChart($("train-charts"), "learning rate", [{name: "lr", x: h.step, y: h.lr}]);
  }
  const rows = DATA.run.health || [];
  if (!rows.length) { $("health-charts").appendChild(el("p", {"class": "note"}, "no health.jsonl in this run (train with --health-every N)")); return; }
  const steps = rows.map((r) => r.step);
  const bands = DATA.run.bands || {};
  const panels = [["params", "update_to_data_log10", "update:data ratio (log10) per tensor", false],
                  ["params", "grad_norm", "gradient norm per tensor", true], ["params", "grad_to_data", "grad:data ratio per tensor", true],
                  ["params", "weight_norm", "weight norm per tensor", false],
                  ["activations", "std", "activation std per layer", false], ["activations", "saturated", "saturated fraction per layer", false],
                  ["activations", "dead", "dead-unit fraction per layer", false], ["attention", "entropy", "attention entropy per head (nats)", false]];
  for (const [group, key, title, log] of panels) {
    const band = bands[key];
    const names = [...new Set(rows.flatMap((r) => Object.keys(r[group] || {})))];
    if (!names.length) continue;
    const series = names.map((n) => ({name: n, x: steps, y: rows.map((r) => (r[group] && r[group][n] && r[group][n][key] !== undefined) ? r[group][n][key] : null)}));
    if (series.every((d) => d.y.every((y) => y === null))) continue;
    lineChart($("health-charts"), title + (band ? " (healthy band shaded)" : ""), series, {log: log, band: band});
  }
  const totals = [["global_grad_norm", "global gradient norm"], ["clipped", "clip events"], ["nonfinite", "non-finite values"]];
  for (const [key, title] of totals) { const y = rows.map((r) => r[key] === undefined ? null : Number(r[key]));
    if (y.some((v) => v !== null)) lineChart($("health-charts"), title, [{name: key, x: steps, y: y}]); }
}

function main() {
  $("title").textContent = DATA.title;
  const m = DATA.model;
  $("meta").textContent = m.family + " model: d_model " + m.d_model + ", " + m.n_layers + " layers, " + m.n_heads +
    " heads (" + m.n_kv_heads + " kv), vocab " + m.vocab_size + "; " + DATA.tokens.length + " tokens";
  buildNav(); buildAttention(); buildLens(); buildSurprise(); buildAttribution(); buildHeads(); buildTraining();
  document.body.dataset.ready = "1";
}
main();
</script>
</body></html>
"""
