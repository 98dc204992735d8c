"""The inspection report: what a model computes on one prompt, as terminal text and as one
self-contained HTML page (`glassllm inspect`).

    ins = inspect_model(model, ids, tokenizer, run_dir="runs")
    print(summary(ins, color=True))
    write_html(ins, "report.html")

The page has no network access of any kind: its CSS, JavaScript and data are inline, it draws
with the DOM, <canvas> and inline SVG, and opens from disk (`tests/test_report_browser.py`
opens it in headless Chromium and checks there are no console errors). Views: attention per
layer and head (a map with a token label per row and per column, each one cell wide, so they
line up at any length; hover a token: where it attends), the logit lens grid, token surprise,
direct logit attribution bars, head types, and, given a run directory, the training curves
(history.csv) and health panels (health.jsonl; of many tensors, the five whose latest value lies
farthest from the others' median are named in colour, the rest drawn grey) -- after
CircuitsVis' attention and logit views and bertviz's head_view, without their CDN.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import unicodedata
from html import escape
from importlib import resources

import numpy as np

from . import interpret
from ..formats.atomic import atomic_write
from ..formats.inline_json import displayable, inline_json, page_files
from ..formats.paths import check_output_paths
from ..model import GlassLM
from .trace import run_with_cache, token_text


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
    note: str | None = None  # said above the views: e.g. the prompt cut to max_len (`fit_prompt`)
    features: dict | None = None  # a dictionary on the prompt (`browse.prompt_section`)


def inspect_model(model: GlassLM, ids, tokenizer=None, run_dir=None, k: int = 5,
                  title: str = "glassllm inspect", note: str | None = None,
                  dictionary=None) -> Inspection:
    """Run every analysis of the report on one prompt (ids (T,), T >= 2).

    Attribution at position t is for the token that actually comes next (t < T-1), and for
    the model's top guess at the last position (among the ids the tokenizer has: a padded
    vocabulary's other ids are never the guess, as `glassllm.generate.mask_padding`; where
    they appear in a top-k list they read "(padding id N)", `token_text`). run_dir: a
    training run directory; its history.csv / health.jsonl, when present, are included.
    note: a line shown above the report's views and in the summary (`fit_prompt`'s).
    dictionary: an SAE or transcoder of this model (`glassllm.lens.features`): its features
    on the prompt become the report's Features view (`browse.prompt_section`).

    Raises ValueError for a prompt of fewer than 2 tokens (nothing to predict) and the
    errors of `glassllm.lens.interpret`'s functions.
    """
    ids = model.check_ids(ids)
    if ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"inspect needs one prompt of at least 2 tokens, got shape {ids.shape}")
    T = ids.shape[1]
    surprise = interpret.token_surprise(model, ids, k=k)
    lens = interpret.logit_lens(model, ids, k=k)
    names = ["blocks.*.attention.pattern"] + interpret.attribution_names(model)
    _, cache = run_with_cache(model, ids, names=names)  # what attribution and the views need
    attributions = []
    limit = getattr(tokenizer, "vocab_size", None)
    for t in range(T):
        token = int(ids[0, t + 1]) if t + 1 < T else None
        attributions.append(interpret.logit_attribution(model, ids, position=t, token=token,
                                                        cache=cache, vocab_limit=limit))
    patterns = cache.stack("blocks.{layer}.attention.pattern")[:, 0]
    head_kinds = {}
    for kind in interpret.HEAD_KINDS:
        detection = interpret.detection_pattern(ids[0], kind)
        head_kinds[kind] = interpret.head_scores(patterns, detection)
    history = health = None
    if run_dir is not None:
        history, health = read_run(run_dir)
    texts = TokenTexts(tokenizer)
    features = None
    if dictionary is not None:
        from .features.browse import prompt_section
        bos = getattr(tokenizer, "bos_id", None)
        features = prompt_section(model, dictionary, ids[0], texts, k=k, vocab_limit=limit,
                                  ignore=() if bos is None else (int(bos),))
    return Inspection(model.cfg.to_dict(), ids[0], texts, surprise, lens, attributions,
                      patterns, head_kinds, history, health, title, note, features)


def fit_prompt(ids, max_len: int) -> tuple[list[int], str | None]:
    """A prompt's ids cut to a model's context: its first `max_len` ids (the text as a reader
    reads it, from the start; a BOS stays first) and a note that says so -- None when it
    fits. What `glassllm inspect` and `glassllm serve` do with a prompt over max_len, rather
    than refusing it."""
    ids = [int(i) for i in ids]
    if len(ids) <= max_len:
        return ids, None
    return ids[:max_len], (f"the prompt is {len(ids)} tokens, over this model's max_len "
                           f"{max_len}: only its first {max_len} are analysed")


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
    if ins.note:
        lines.insert(1, f"note: {ins.note}")
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
                 f"'{_visible(ins.text(attr.token))}' ({attr.of} {attr.total:.3f}):")
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
    if ins.features is not None:
        lines += _features_summary(ins, top)
    return "\n".join(lines)


def _features_summary(ins: Inspection, top: int) -> list[str]:
    """The dictionary's strongest features on the prompt, each with where it peaks and the
    tokens it promotes."""
    f = ins.features["facts"]
    lines = [f"features of the {f['kind']} dictionary on {f['hook_name']} ({f['d_sae']}), "
             f"strongest on the prompt:"]
    for feat in [f for f in ins.features["features"] if f["listed"]][:top]:
        at = feat["at"]
        promotes = ", ".join(f"'{_visible(t)}'" for t, _, _ in (feat["promoted"] or [])[:4])
        lines.append(f"  #{feat['feature']}: max {feat['max']:.3f} at token {at} "
                     f"'{_visible(ins.text(ins.ids[at]))}'" +
                     (f"; promotes {promotes}" if promotes else ""))
    return lines


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
        title=ins.title, note=ins.note, model=ins.cfg, tokens=[text(i) for i in ins.ids],
        ids=[int(i) for i in ins.ids],
        surprise=dict(nats=_r(s.nats), bits=_r(s.bits), rank=s.rank.tolist(),
                      top=[[[text(i), _f(p)] for i, p in zip(ti, tp)]
                           for ti, tp in zip(s.top_ids, s.top_probs)],
                      mean_nats=_f(s.mean_nats, 6)),
        lens=dict(layers=lens.layers,
                  top=[[[[text(i), _f(p)] for i, p in zip(ti, tp)]
                        for ti, tp in zip(row_ids, row_p)]
                       for row_ids, row_p in zip(lens.top_ids, lens.top_probs)],
                  target_prob=_r(lens.target_prob), target_rank=lens.target_rank.tolist()),
        attention=attention, attributions=attributions,
        heads={kind: _r(v, 3) for kind, v in ins.head_kinds.items()},
        run=None, features=ins.features)
    if ins.history is not None or ins.health:
        from .health import BANDS
        data["run"] = dict(history={k: _r(v, 5) for k, v in (ins.history or {}).items()},
                           health=ins.health or [], bands=BANDS)
    return data


def render_html(ins: Inspection) -> str:
    """The report as one HTML document (str): no external resource of any kind.

    The page is `page/report.html` with `page/report.css` and `page/report.js` inlined (the
    policy `default-src 'none'` allows inline style and script only) and `page_data(ins)` as a
    JSON block that the script parses.
    """
    # inline_json: no "</script>" or "<!--" in the data can end or bend the block it sits in
    slots = {"TITLE": escape(displayable(ins.title)), "DATA": inline_json(page_data(ins))}
    # one pass: a title or token that reads "__DATA__" is text, never a slot
    return _SLOT.sub(lambda m: slots[m.group(1)], page_template())


PAGE_FILES = ("report.html", "report.css", "report.js")  # package data, glassllm/lens/page/
_SLOT = re.compile(r"__(TITLE|DATA)__")


@functools.lru_cache(maxsize=1)
def page_template() -> str:
    """report.html with report.css and report.js inlined; the TITLE and DATA slots left open.

    Read with `importlib.resources` from the installed package (pyproject.toml ships the three
    files as package data).

    Raises:
        RuntimeError: a page file is missing, or is not as `render_html` needs it (each slot
            once; no "</style" in the CSS nor "</script" in the script, which would end the
            element they are inlined in) -- a broken installation, not a user error.
    """
    page, css, script = page_files("glassllm.lens", PAGE_FILES, "report page")
    folder = resources.files("glassllm.lens") / "page"
    page = page.replace("__STYLE__", css).replace("__SCRIPT__", script)
    if any(page.count(f"__{slot}__") != 1 for slot in ("TITLE", "DATA")) or \
            "__STYLE__" in page or "__SCRIPT__" in page:
        raise RuntimeError(f"{folder}: the page must hold each slot (__TITLE__, __DATA__, "
                           f"__STYLE__, __SCRIPT__) exactly once")
    return page


def check_report_path(path, label: str = "--out") -> None:
    """Refuse, before any analysis runs, a report path that cannot be written: empty, a
    directory, in a directory that does not exist, or without write permission there
    (`glassllm.formats.paths.check_output_paths`). Raises ValueError, one line naming
    `label` and path."""
    check_output_paths({label: path})
    directory = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(directory):
        raise ValueError(f"{label} {os.fspath(path)}: directory {directory} does not exist")


def write_html(ins: Inspection, path) -> str:
    """Write `render_html(ins)` to path atomically; returns path."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(render_html(ins))
    return os.fspath(path)
