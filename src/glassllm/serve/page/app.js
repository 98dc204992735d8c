// The page of `glassllm serve` (glassllm/serve/page.py inlines this file into index.html,
// after glassllm/formats/page/common.js: $, tip, el, the colour scales, buildNav).
// INFO: the server's description (its model, its run, its limits), from the page's JSON
// block. Every number shown comes from the server's JSON API (docs/serve.md); the page only
// draws. Text from the model or the run is only ever set as textContent, never as HTML.
"use strict";
const INFO = JSON.parse(document.getElementById("serve-data").textContent);
const TOKEN = new URLSearchParams(location.search).get("token") || "";
const state = {model: "", prompt: "", analysis: null, attention: {}, ablated: new Set(), runCursor: "",
               sampleOf: null, generating: null, asked: {}};

// ------------------------------------------------------------------ small helpers
function hover(node, text) { node.addEventListener("mousemove", (ev) => showTip(ev, typeof text === "function" ? text() : text));
  node.addEventListener("mouseleave", hideTip); }
function vis(t) { return String(t).replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205"; }
function clear(node) { node.textContent = ""; return node; }
function options(select, items) { clear(select); items.forEach(([value, text]) => select.appendChild(el("option", {value: value}, text))); }
function status(text, isError) { $("status").textContent = text; $("status").classList.toggle("error", !!isError); }
function tokenField(text) { const t = text.trim(); if (t === "") return null;  // "#12" is an id, anything else text
  return /^#\d+$/.test(t) ? Number(t.slice(1)) : text; }

// opts: {signal (an AbortSignal), stream (true: the Response itself, for a stream of lines)}
async function api(path, body, opts) {
  opts = opts || {};
  const init = {method: body === undefined ? "GET" : "POST", signal: opts.signal,
                headers: {"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"}};
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(path, init);
  if (!r.ok) { let message = "HTTP " + r.status;
    try { message = (await r.json()).error || message; } catch (e) { /* not JSON */ }
    throw new Error(message); }
  return opts.stream ? r : r.json();
}
// The answer to the latest request of a kind ("analyze", "patch", ...), or null for one that
// is not the latest: a newer request of the kind aborts the older (the server then stops its
// work), and an answer whose echoed `request` id is not the latest one is never drawn -- so an
// analysis of a slow model arriving after that of a fast one picked since is dropped.
async function latest(kind, path, body) {
  const before = state.asked[kind];
  if (before) before.controller.abort();
  const mine = {id: kind + "-" + ((before ? before.n : 0) + 1), n: (before ? before.n : 0) + 1, controller: new AbortController()};
  state.asked[kind] = mine;
  try {
    const r = await api(path, Object.assign({}, body, {request: mine.id}), {signal: mine.controller.signal});
    return state.asked[kind] === mine && r.request === mine.id ? r : null;
  } catch (e) {
    if (e.name === "AbortError" || state.asked[kind] !== mine) return null;
    throw e;
  }
}

// ------------------------------------------------------------------ navigation
function show(name) {
  for (const s of document.querySelectorAll("section.view")) s.classList.toggle("active", s.id === "view-" + name);
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.view === name);
  state.view = name;
  if (name === "attribution" && state.analysis) runAttribution();
  if (name === "ablate" && state.analysis) runAblation();
  if (name === "features" && state.analysis) { if (!state.featuresOpened) { state.featuresOpened = true; openDictionary(); } else runFeaturePrompt(); }
}

// ------------------------------------------------------------------ the model and the prompt
function describe(m) {
  if (!m && INFO.default_model) { $("meta").textContent = INFO.default_model + " (the run's newest model): loading..."; return; }
  if (!m) { $("meta").textContent = "no model yet" + (INFO.run ? " (the run has not saved one)" : ""); return; }
  const c = m.config;
  $("meta").textContent = (m.label || m.name) + ": " + c.family + " model, d_model " + c.d_model + ", " + c.n_layers +
    " layers, " + c.n_heads + " heads (" + c.n_kv_heads + " kv), vocab " + c.vocab_size + ", max_len " + c.max_len +
    ", " + Number(m.parameters).toLocaleString() + " parameters; tokenizer " + m.tokenizer;
}
function fillModels(models) {
  const items = [];
  if (INFO.model) items.push(["", INFO.model.label + " (--model)"]);
  (models || []).forEach((f) => items.push([f.name, f.name + " (run " + f.kind + ")"]));
  if (!items.length) items.push(["", "(none yet)"]);
  const keep = state.model; options($("model"), items);
  $("model").value = items.some(([v]) => v === keep) ? keep : items[0][0]; state.model = $("model").value;
}
async function analyze() {
  state.prompt = $("prompt").value; status("analysing...");
  const started = performance.now();
  try {
    const a = await latest("analyze", "/api/analyze", {model: state.model, prompt: state.prompt, k: 5});
    if (!a) return;  // a newer analysis was asked for
    state.analysis = a; state.attention = {}; describe(a.model_info); document.body.dataset.model = a.model;
    promptNote(a.cut);
    (a.attention || []).forEach((layer, l) => { state.attention[l] = layer; });
    drawAll();
    status(a.tokens.ids.length + " tokens, mean surprise " + fmt(a.surprise.mean_nats) + " nats (" +
           fmt(a.surprise.mean_bits) + " bits) per token; " + Math.round(performance.now() - started) + " ms");
    document.body.dataset.ready = "1";
  } catch (e) { status(e.message, true); document.body.dataset.ready = "error"; }
}
// A prompt over the model's max_len is cut by the server to its first max_len tokens: said here
function promptNote(cut) { const note = $("prompt-note"); note.textContent = cut ? "Note: " + cut + "." : ""; note.hidden = !cut; }
function drawAll() {
  const a = state.analysis, T = a.tokens.ids.length;
  drawSurprise(); buildAttention(); drawLens();
  options($("attr-pos"), a.tokens.texts.map((t, i) => [i, i + " " + vis(t)])); $("attr-pos").value = T - 1;
  options($("abl-pos"), a.tokens.texts.map((t, i) => [i, i + " " + vis(t)])); $("abl-pos").value = T - 1;
  buildAblationGrid();
  if (!$("patch-corrupted").value) $("patch-corrupted").value = state.prompt;
  if (state.view === "attribution") runAttribution();
  if (state.view === "ablate") runAblation();
  if (state.view === "features") { if (!state.featuresOpened) { state.featuresOpened = true; openDictionary(); } else runFeaturePrompt(); }
}

// ------------------------------------------------------------------ tokens and surprise
function drawSurprise() {
  const a = state.analysis, s = a.surprise, unit = $("surprise-unit").value, box = clear($("surprise-tokens"));
  const values = unit === "rank" ? s.rank.map((r) => Math.log2(1 + r)) : s[unit];
  const cap = Math.max(unit === "bits" ? 8 : unit === "nats" ? 5.5 : 8, ...values.filter((v) => v !== null));
  $("surprise-note").textContent = "mean " + fmt(s.mean_nats) + " nats = " + fmt(s.mean_bits) + " bits per token (white 0, red " +
    (unit === "rank" ? "rank " + Math.round(2 ** cap - 1) : cap.toFixed(1) + " " + unit) + ")";
  a.tokens.texts.forEach((t, i) => { const span = el("span", {"class": "tok", "data-i": i}, vis(t));
    if (i > 0) { span.style.background = heat((values[i - 1] || 0) / cap);
      hover(span, "token " + i + " " + JSON.stringify(t) + " (id " + a.tokens.ids[i] + "): " + fmt(s.nats[i - 1]) + " nats, " +
        fmt(s.bits[i - 1]) + " bits, rank " + s.rank[i - 1] + "\nthe model's top guesses:\n" +
        s.top[i - 1].map(([x, p]) => "  " + quoted(x) + " " + fmt(p)).join("\n")); }
    else hover(span, "token 0 " + JSON.stringify(t) + ": nothing before it to predict it from");
    box.appendChild(span); });
}

// ------------------------------------------------------------------ attention
function headLabel(l, h) {
  const heads = state.analysis.heads, best = [];
  for (const kind in heads) if (heads[kind].measurable && heads[kind].scores[l][h] >= 0.4) best.push([heads[kind].scores[l][h], kind]);
  best.sort((x, y) => y[0] - x[0]);
  return best.length ? best[0][1].replace("_token", "").replace("previous", "prev").replace("duplicate", "dup") + " " + fmt(best[0][0], 2) : "";
}
function headScores(l, h) { const heads = state.analysis.heads;
  return Object.keys(heads).map((k) => k.replace(/_/g, "-") + " " + (heads[k].measurable ? fmt(heads[k].scores[l][h], 2) : "n/a")).join(", "); }
async function layerAttention(l) {
  const a = state.analysis, held = state.attention;
  if (!held[l]) {  // asked for the analysis drawn: its model and prompt, kept with it
    const r = await api("/api/attention", {model: a.model, prompt: a.prompt, layer: l});
    held[l] = r.attention[0];
  }
  return held[l];
}
function drawPattern(canvas, rows, cell) {
  const T = rows.length, ctx = canvas.getContext("2d"); canvas.width = cell * T; canvas.height = cell * T;
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  for (let i = 0; i < T; i++) for (let j = 0; j <= i; j++) { ctx.fillStyle = blue(rows[i][j]); ctx.fillRect(j * cell, i * cell, cell, cell); }
}
function buildAttention() {
  const a = state.analysis;
  const L = a.heads.induction.scores.length, H = a.heads.induction.scores[0].length;
  options($("att-layer"), [...Array(L).keys()].map((l) => [l, String(l)]));
  const box = clear($("att-tokens"));
  state.attSpans = a.tokens.texts.map((t, i) => { const s = el("span", {"class": "tok", "data-i": i}, vis(t));
    s.addEventListener("mouseenter", () => lightTokens(i)); s.addEventListener("mouseleave", unlightTokens);
    box.appendChild(s); return s; });
  const grid = clear($("att-grid")); grid.style.gridTemplateColumns = "repeat(" + H + ", auto)";
  state.thumbs = [];
  const T = a.tokens.ids.length, cell = Math.max(1, Math.min(4, Math.floor(72 / T)));
  for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
    const box = el("div", {"class": "thumb", "data-layer": l, "data-head": h}), canvas = el("canvas");
    canvas.width = canvas.height = cell * T;
    box.appendChild(canvas); box.appendChild(el("div", {}, "L" + l + "H" + h));
    box.appendChild(el("div", {"class": "label"}, headLabel(l, h) || "\u00a0"));
    hover(box, "L" + l + "H" + h + ": " + headScores(l, h));
    box.addEventListener("click", () => { $("att-layer").value = l; pickLayer().then(() => { $("att-head").value = h; drawAttention(); }); });
    grid.appendChild(box); state.thumbs.push([l, h, canvas, cell, box]);
  }
  // the big map: a cell of 12 px at least, so that a token label fits beside each row and column
  state.bigCell = Math.max(12, Math.min(22, Math.floor(520 / T)));
  mapLabels($("att-xlabels"), a.tokens.texts, "att-xlabel", "width", state.bigCell, vis);
  state.rowLabels = mapLabels($("att-ylabels"), a.tokens.texts, "att-ylabel", "height", state.bigCell, vis);
  state.rowLabels.forEach((e, i) => { e.addEventListener("mouseenter", () => lightTokens(i)); e.addEventListener("mouseleave", unlightTokens); });
  fillThumbs(); pickLayer();
}
async function fillThumbs() {
  for (const [l, h, canvas, cell] of state.thumbs) {
    if (!state.attention[l]) continue;  // too large to send at once: drawn when its layer is picked
    drawPattern(canvas, state.attention[l][h], cell);
  }
}
async function pickLayer() {
  const l = +$("att-layer").value, H = state.analysis.heads.induction.scores[0].length, keep = $("att-head").value;
  options($("att-head"), [...Array(H).keys()].map((h) => [h, h + (headLabel(l, h) ? " (" + headLabel(l, h) + ")" : "")]));
  if (keep !== "" && +keep < H) $("att-head").value = keep;
  try { await layerAttention(l); fillThumbs(); drawAttention(); } catch (e) { status(e.message, true); }
}
function drawAttention() {
  const l = +$("att-layer").value, h = +$("att-head").value, rows = (state.attention[l] || [])[h];
  if (!rows) return;
  const T = rows.length, cell = state.bigCell, canvas = $("att-canvas");
  drawPattern(canvas, rows, cell); canvas.dataset.cell = cell;
  canvas.style.width = canvas.style.height = cell * T + "px";  // never scaled: the labels keep to the cells
  for (const [tl, th, , , box] of state.thumbs) box.classList.toggle("picked", tl === l && th === h);
}
function lightTokens(i) { const l = +$("att-layer").value, h = +$("att-head").value, rows = (state.attention[l] || [])[h];
  if (!rows) return;
  state.attSpans.forEach((s, j) => { s.style.background = j <= i ? blue(rows[i][j]) : "transparent"; s.classList.toggle("query", j === i); });
  state.rowLabels.forEach((e, j) => e.classList.toggle("query", j === i)); }
function unlightTokens() { state.attSpans.forEach((s) => { s.style.background = "transparent"; s.classList.remove("query"); });
  state.rowLabels.forEach((e) => e.classList.remove("query")); }
function attentionCanvasTip(ev) {
  const canvas = $("att-canvas"), cell = +canvas.dataset.cell, b = canvas.getBoundingClientRect(), a = state.analysis;
  const rows = (state.attention[+$("att-layer").value] || [])[+$("att-head").value];
  const j = Math.floor((ev.clientX - b.left) / cell), i = Math.floor((ev.clientY - b.top) / cell);
  if (!rows || i < 0 || i >= rows.length || j < 0 || j > i) { hideTip(); return; }
  showTip(ev, "query " + i + " " + JSON.stringify(a.tokens.texts[i]) + " \u2192 key " + j + " " + JSON.stringify(a.tokens.texts[j]) + ": " + fmt(rows[i][j], 4));
}

// ------------------------------------------------------------------ logit lens
function drawLens() {
  const a = state.analysis, lens = a.lens, T = a.tokens.ids.length, by = $("lens-color").value;
  const table = el("table", {"class": "grid", "id": "lens-table"}), head = el("tr");
  head.appendChild(el("th", {}, "layer \\ after")); a.tokens.texts.forEach((t) => head.appendChild(el("th", {}, vis(t))));
  table.appendChild(head);
  lens.layers.forEach((name, l) => { const tr = el("tr"); tr.appendChild(el("th", {}, name));
    for (let t = 0; t < T; t++) { const [tok, p] = lens.top[l][t][0];
      const td = el("td", {}, cellText(tok, vis));
      td.style.background = heat(by === "target" ? (t < T - 1 ? lens.target_prob[l][t] : 0) : p);
      let text = name + ", after position " + t + " " + JSON.stringify(a.tokens.texts[t]) + ":\n" +
        lens.top[l][t].map(([x, q]) => "  " + quoted(x) + " " + fmt(q)).join("\n");
      if (t < T - 1) text += "\ntrue next token " + JSON.stringify(a.tokens.texts[t + 1]) + ": p " + fmt(lens.target_prob[l][t], 4) + ", rank " + lens.target_rank[l][t];
      hover(td, text); tr.appendChild(td); }
    table.appendChild(tr); });
  clear($("lens-grid")).appendChild(table);
  $("lens-note").textContent = "self-check: the last row equals the model's own probabilities within " + fmt(lens.self_check, 9);
}

// ------------------------------------------------------------------ attribution
function bars(box, labels, values, plain) {
  clear(box); const scale = Math.max(...values.map((v) => Math.abs(v || 0))) || 1;
  labels.forEach((label, i) => { const v = values[i] || 0, row = el("div", {"class": "bar-row"});
    row.appendChild(el("div", {"class": "bar-label"}, label));
    const track = el("div", {"class": "bar-track"}), bar = el("div", {"class": "bar"}), w = (plain ? 100 : 50) * Math.abs(v) / scale;
    bar.style.width = w + "%"; bar.style.left = (plain ? 0 : v >= 0 ? 50 : 50 - w) + "%"; bar.style.background = v >= 0 ? "#1d6fb8" : "#c82828";
    track.appendChild(bar); row.appendChild(track); row.appendChild(el("div", {"class": "bar-value"}, (v >= 0 && !plain ? "+" : "") + fmt(v, plain ? 4 : 3)));
    box.appendChild(row); });
}
function headTable(values, cellText) {
  const table = el("table", {"class": "grid"}), m = Math.max(...values.flat().map((v) => Math.abs(v || 0))) || 1, head = el("tr");
  head.appendChild(el("th", {}, "layer")); values[0].forEach((_, h) => head.appendChild(el("th", {}, "H" + h))); table.appendChild(head);
  values.forEach((row, l) => { const tr = el("tr"); tr.appendChild(el("th", {}, "L" + l));
    row.forEach((v, h) => { const td = el("td", {}, cellText ? cellText(v, l, h) : fmt(v, 2)); td.style.background = diverging(v || 0, m); tr.appendChild(td); });
    table.appendChild(tr); });
  return table;
}
async function runAttribution() {
  const body = {model: state.model, prompt: state.prompt, position: +$("attr-pos").value,
                token: tokenField($("attr-token").value), against: tokenField($("attr-against").value)};
  const check = $("attr-check");
  try {
    const r = await latest("attribution", "/api/attribution", body);
    if (!r) return;
    check.classList.remove("error");
    check.textContent = r.of + " of " + quoted(r.token_text) + (r.against === null ? "" : " minus " + quoted(r.against_text)) +
      " after position " + r.position + " = " + fmt(r.total, 4) + "; self-check " + r.self_check + " (residual error " + fmt(r.residual_error, 9) + ")";
    const order = r.values.map((v, i) => i).sort((i, j) => Math.abs(r.values[j]) - Math.abs(r.values[i])).slice(0, 16);
    bars($("attr-bars"), order.map((i) => r.labels[i]), order.map((i) => r.values[i]));
    clear($("attr-heads")).appendChild(headTable(r.heads));
  } catch (e) { check.classList.add("error"); check.textContent = e.message; clear($("attr-bars")); clear($("attr-heads")); }
}

// ------------------------------------------------------------------ ablation
function buildAblationGrid() {
  const a = state.analysis, L = a.heads.induction.scores.length, H = a.heads.induction.scores[0].length;
  const table = el("table", {"class": "grid", "id": "abl-table-grid"}), head = el("tr");
  head.appendChild(el("th", {}, "layer")); for (let h = 0; h < H; h++) head.appendChild(el("th", {}, "H" + h));
  head.appendChild(el("th", {}, "MLP")); table.appendChild(head);
  const toggle = (key, button) => { if (state.ablated.has(key)) state.ablated.delete(key); else state.ablated.add(key);
    button.classList.toggle("on", state.ablated.has(key)); runAblation(); };
  for (let l = 0; l < L; l++) { const tr = el("tr"); tr.appendChild(el("th", {}, "L" + l));
    for (let h = 0; h < H; h++) { const key = "h" + l + "." + h, b = el("button", {"class": "abl abl-head", "data-layer": l, "data-head": h, "id": "abl-L" + l + "H" + h}, "L" + l + "H" + h);
      b.classList.toggle("on", state.ablated.has(key)); b.addEventListener("click", () => toggle(key, b));
      const td = el("td"); td.appendChild(b); tr.appendChild(td); }
    const key = "m" + l, b = el("button", {"class": "abl abl-mlp", "data-layer": l, "id": "abl-mlp" + l}, "MLP" + l);
    b.classList.toggle("on", state.ablated.has(key)); b.addEventListener("click", () => toggle(key, b));
    const td = el("td"); td.appendChild(b); tr.appendChild(td); table.appendChild(tr); }
  clear($("abl-grid")).appendChild(table);
}
async function runAblation() {
  const heads = [], mlps = [];
  for (const key of state.ablated) { if (key[0] === "h") heads.push(key.slice(1).split(".").map(Number)); else mlps.push(+key.slice(1)); }
  try {
    const r = await latest("ablate", "/api/ablate", {model: state.model, prompt: state.prompt, heads: heads, mlps: mlps,
                                                    how: $("abl-how").value, position: +$("abl-pos").value, k: 8});
    if (!r) return;  // a newer click is on its way
    const loss = $("abl-loss"); loss.classList.remove("error");
    loss.dataset.clean = r.clean_loss; loss.dataset.ablated = r.ablated_loss; loss.dataset.change = r.loss_change;
    loss.textContent = "loss on the prompt: " + fmt(r.clean_loss, 4) + " nats clean \u2192 " + fmt(r.ablated_loss, 4) + " ablated (" +
      (r.loss_change >= 0 ? "+" : "") + fmt(r.loss_change, 4) + ") with " + (heads.length + mlps.length) + " part(s) " + r.how + "-ablated";
    const table = el("table", {"class": "grid"}), head = el("tr");
    ["next token after " + r.position, "p clean", "p ablated", "logit clean", "logit ablated", "logit change"].forEach((t) => head.appendChild(el("th", {}, t)));
    table.appendChild(head);
    r.rows.forEach((row) => { const tr = el("tr"); tr.appendChild(el("td", {}, quoted(row.text)));
      [row.clean_prob, row.ablated_prob, row.clean_logit, row.ablated_logit].forEach((v) => tr.appendChild(el("td", {}, fmt(v, 4))));
      const d = row.ablated_logit - row.clean_logit, td = el("td", {}, (d >= 0 ? "+" : "") + fmt(d, 4)); td.style.background = diverging(d, 2);
      tr.appendChild(td); table.appendChild(tr); });
    clear($("abl-table")).appendChild(table);
  } catch (e) { $("abl-loss").classList.add("error"); $("abl-loss").textContent = e.message; }
}

// ------------------------------------------------------------------ patching
async function runPatching() {
  const note = $("patch-note"); note.classList.remove("error"); note.textContent = "running the sweep...";
  clear($("patch-grid")); $("patch-detail").textContent = "";
  try {
    const r = await latest("patch", "/api/patch", {model: state.model, clean: $("prompt").value, corrupted: $("patch-corrupted").value,
      target: $("patch-target").value, correct: tokenField($("patch-correct").value), wrong: tokenField($("patch-wrong").value)});
    if (!r) return;  // a newer sweep was asked for (this one was stopped)
    state.patch = r; note.dataset.correct = r.correct; note.dataset.wrong = r.wrong;
    note.textContent = "metric: logit(" + quoted(r.correct_text) + ") \u2212 logit(" + quoted(r.wrong_text) + ") after position " +
      r.position + ": clean run " + fmt(r.clean_metric, 4) + ", corrupted run " + fmt(r.corrupted_metric, 4) + "; patching " + r.target;
    drawPatchGrid(r);
  } catch (e) { note.classList.add("error"); note.textContent = e.message; }
}
function drawPatchGrid(r) {
  const byHead = r.axes[1] === "head", cols = r.values[0].length, table = el("table", {"class": "grid", "id": "patch-table"}), head = el("tr");
  head.appendChild(el("th", {}, byHead ? "layer \\ head" : "layer \\ position"));
  for (let c = 0; c < cols; c++) head.appendChild(el("th", {}, byHead ? "H" + c : c + " " + vis(r.clean_tokens.texts[c])));
  table.appendChild(head);
  r.values.forEach((row, l) => { const tr = el("tr"); tr.appendChild(el("th", {}, "L" + l));
    row.forEach((v, c) => { const n = r.normalised ? r.normalised[l][c] : null;
      const td = el("td", {"class": "cell", "data-layer": l, "data-col": c, "data-value": v}, n === null ? "" : fmt(n, 2));
      td.style.background = diverging(n === null ? 0 : n, 1);
      td.addEventListener("click", () => patchDetail(r, l, c, td)); tr.appendChild(td); });
    table.appendChild(tr); });
  clear($("patch-grid")).appendChild(table);
}
function patchDetail(r, l, c, td) {
  for (const cell of document.querySelectorAll("#patch-table td.cell")) cell.classList.remove("picked");
  td.classList.add("picked");
  const byHead = r.axes[1] === "head", n = r.normalised ? r.normalised[l][c] : null;
  $("patch-detail").textContent = "layer " + l + (byHead ? ", head " + c : ", position " + c + " (clean " + JSON.stringify(r.clean_tokens.texts[c]) +
    ", corrupted " + JSON.stringify(r.corrupted_tokens.texts[c]) + ")") + "\npatched blocks." + l + "." + r.target.split(".").slice(2).join(".") +
    "\nmetric after patching: " + fmt(r.values[l][c], 5) + "\nclean " + fmt(r.clean_metric, 5) + ", corrupted " + fmt(r.corrupted_metric, 5) +
    "\nrestored share (metric - corrupted) / (clean - corrupted): " + (n === null ? "- (clean equals corrupted)" : fmt(n, 4));
}

// ------------------------------------------------------------------ generation
function numberField(id) { const v = $(id).value.trim(); return v === "" ? null : Number(v); }
async function runGeneration() {
  if (state.generating) return;
  const out = clear($("gen-text")), steps = clear($("gen-steps")), controller = new AbortController();
  clear($("gen-dist")); state.genSteps = [];
  state.generating = controller; $("gen-run").disabled = true; $("gen-stop").disabled = false; $("gen-status").textContent = "generating...";
  $("gen-status").classList.remove("error");
  const body = {model: state.model, prompt: $("prompt").value, max_new_tokens: numberField("gen-max"), temperature: numberField("gen-temp"),
                top_k: numberField("gen-topk"), top_p: numberField("gen-topp"), seed: numberField("gen-seed"), k: 8};
  const prompt = el("span", {"class": "prompt"}, body.prompt), produced = el("span", {"id": "gen-produced"});
  out.appendChild(prompt); out.appendChild(produced);
  try {
    const response = await api("/api/generate", body, {signal: controller.signal, stream: true});
    await readLines(response, (msg) => onGenerated(msg, produced, steps));
  } catch (e) {
    $("gen-status").textContent = e.name === "AbortError" ? "stopped" : e.message;
    $("gen-status").classList.toggle("error", e.name !== "AbortError");
    out.dataset.done = "1";
  } finally { state.generating = null; $("gen-run").disabled = false; $("gen-stop").disabled = true; }
}
async function readLines(response, onLine) {
  const reader = response.body.getReader(), decoder = new TextDecoder();
  let buffer = "";
  for (;;) { const {value, done} = await reader.read(); if (done) break;
    buffer += decoder.decode(value, {stream: true});
    let i; while ((i = buffer.indexOf("\n")) >= 0) { onLine(JSON.parse(buffer.slice(0, i))); buffer = buffer.slice(i + 1); } }
}
function onGenerated(msg, produced, steps) {
  if (msg.event === "token") {
    produced.textContent += msg.text; state.genSteps.push(msg);
    const chip = el("span", {"class": "tok", "data-i": msg.index}, vis(msg.piece));
    chip.addEventListener("click", () => showStep(msg.index)); hover(chip, "step " + msg.index + ": p " + fmt(msg.prob, 4));
    steps.appendChild(chip); showStep(msg.index);
  } else if (msg.event === "end") {
    produced.textContent += msg.text; $("gen-status").textContent = "done: " + (msg.reason === "stop" ? "end-of-text drawn" : "length reached") +
      ", " + state.genSteps.length + " tokens"; $("gen-text").dataset.done = "1";
  } else if (msg.event === "error") { $("gen-status").textContent = msg.error; $("gen-status").classList.add("error"); $("gen-text").dataset.done = "1"; }
}
function showStep(index) { const msg = state.genSteps[index];
  for (const chip of document.querySelectorAll("#gen-steps .tok")) chip.classList.toggle("chosen", +chip.dataset.i === index);
  const box = $("gen-dist"); bars(box, msg.top.map(([t]) => JSON.stringify(t)), msg.top.map(([, p]) => p), true);
  box.insertBefore(el("h3", {}, "step " + index + ": drew " + JSON.stringify(msg.piece) + " (p " + fmt(msg.prob, 4) + ") from"), box.firstChild); }

// ------------------------------------------------------------------ features
// A dictionary of the server's --features directory, named by the server's own list (never a
// path); its answers are the library's (glassllm.lens.features.browse), drawn as text only.
function featBody(extra) { return Object.assign({model: state.model, dictionary: $("feat-dict").value}, extra); }
function featError(e) { const f = $("feat-facts"); f.classList.add("error"); f.textContent = e.message; }
async function openDictionary() {
  const facts = $("feat-facts"); facts.classList.remove("error"); facts.textContent = "scanning the corpus...";
  try {
    const r = await latest("features-open", "/api/features/open", featBody({}));
    if (!r) return;
    const f = r.facts, reads = f.hook_name + (f.out_name ? " \u2192 " + f.out_name : "");
    facts.textContent = f.kind + " dictionary of " + reads + ", d_in " + f.d_in + ", d_sae " + f.d_sae + (f.k ? ", k " + f.k : "") +
      (r.corpus ? "; over " + Number(f.tokens).toLocaleString() + " tokens of " + INFO.features.corpus + ": L0 " + fmt(f.l0, 2) +
        ", dead " + f.dead + ", dense " + f.dense : "; no corpus (serve --features-data D): no contexts") +
      (r.evaluation ? "; stored evaluation: " + Object.entries(r.evaluation).map(([k, v]) => k + " " + (typeof v === "number" ? fmt(v, 4) : v)).join(", ") : "");
    facts.dataset.dsae = f.d_sae; $("feat-index").max = f.d_sae - 1;
    $("feat-list-title").textContent = "most frequent features";
    featureList((r.frequent || []).map(([i, d]) => [i, "density " + fmt(100 * d, 2) + "%"]));
    runFeaturePrompt();
    if (r.frequent && r.frequent.length) openFeature(r.frequent[0][0]);
  } catch (e) { featError(e); }
}
function featureList(items) {
  const list = clear($("feat-list"));
  items.forEach(([i, text]) => { const li = el("li", {"data-feature": i}, "#" + i + "  " + text);
    li.addEventListener("click", () => openFeature(i)); list.appendChild(li); });
  if (!items.length) list.appendChild(el("li", {"class": "none"}, "none"));
}
async function searchFeatures() {
  const token = tokenField($("feat-token").value); if (token === null) return;
  try {
    const r = await latest("features-search", "/api/features/search", featBody({token: token, k: 15}));
    if (!r) return;
    $("feat-list-title").textContent = "features of " + quoted(r.token_text);
    const items = (r.firing || []).map(([i, v]) => [i, "fires " + fmt(v, 3)]);
    (r.promoting || []).forEach(([i, v]) => items.push([i, "promotes " + fmt(v, 3)]));
    featureList(items);
  } catch (e) { featError(e); }
}
async function openFeature(i) {
  try {
    const r = await latest("features-feature", "/api/features/feature", featBody({feature: Number(i), k: 10}));
    if (!r) return;
    state.feature = r.feature; $("feat-index").value = r.feature; $("feat-steered").textContent = "";
    for (const li of document.querySelectorAll("#feat-list li")) li.classList.toggle("picked", li.dataset.feature === String(r.feature));
    $("feat-title").textContent = "feature #" + r.feature; $("feat-detail").dataset.feature = r.feature;
    $("feat-stats").textContent = r.density === null ? "no corpus: density, histogram and contexts need serve --features-data D" :
      "active on " + fmt(100 * r.density, 3) + "% of the corpus tokens; largest activation " + fmt(r.max, 4);
    drawHistogram(r.histogram);
    const bar = (box, rows) => { if (rows) bars(box, rows.map(([t]) => cellText(t, vis)), rows.map(([, v]) => v)); else clear(box).appendChild(el("p", {"class": "note"}, "none: the decoder writes no residual direction")); };
    bar($("feat-promoted"), r.promoted); bar($("feat-suppressed"), r.suppressed);
    drawContexts(r.contexts || []);
  } catch (e) { featError(e); }
}
function drawHistogram(h) {
  const box = clear($("feat-hist")); if (!h) return;
  const most = Math.max(1, ...h.counts), hist = el("div", {"class": "hist", "id": "feat-hist-bars"});
  h.counts.forEach((c, j) => { const d = el("div"); d.style.height = (100 * c / most) + "%";
    hover(d, c + " activations in " + fmt(h.edges[j], 3) + " .. " + fmt(h.edges[j + 1], 3)); hist.appendChild(d); });
  box.appendChild(hist); const axis = el("div", {"class": "hist-axis"});
  axis.appendChild(el("span", {}, "0")); axis.appendChild(el("span", {}, "activation (non-zero only)")); axis.appendChild(el("span", {}, fmt(h.edges[h.edges.length - 1], 3)));
  box.appendChild(axis);
}
function drawContexts(contexts) {
  const box = clear($("feat-contexts")), top = Math.max(1e-9, ...contexts.map((c) => c.value));
  contexts.forEach((c) => { const row = el("div", {"class": "context"});
    row.appendChild(el("span", {"class": "value"}, fmt(c.value, 3)));
    c.texts.forEach((t, j) => { const span = el("span", {"class": "tok" + (j === c.at ? " chosen" : "")}, vis(t));
      span.style.background = blue(c.activations[j] / top);
      hover(span, quoted(t) + ": activation " + fmt(c.activations[j], 4)); row.appendChild(span); });
    box.appendChild(row); });
  if (!contexts.length) box.appendChild(el("p", {"class": "note"}, "none"));
}
async function runFeaturePrompt() {
  if (!INFO.features || !state.prompt) return;
  try {
    const r = await latest("features-prompt", "/api/features/prompt", featBody({prompt: state.prompt, k: 5}));
    if (!r) return;
    const table = el("table", {"class": "grid", "id": "feat-prompt-table"}), head = el("tr");
    ["#", "token", "active features (activation)"].forEach((t) => head.appendChild(el("th", {}, t))); table.appendChild(head);
    const top = Math.max(1e-9, ...r.activations.flat());
    r.tokens.texts.forEach((t, i) => { const tr = el("tr"); tr.appendChild(el("td", {}, String(i))); tr.appendChild(el("td", {}, cellText(t, vis)));
      const td = el("td"); td.style.textAlign = "left";
      r.features[i].forEach((f, j) => { if (f < 0) return;
        const chip = el("span", {"class": "chip", "data-feature": f}, "#" + f + " " + fmt(r.activations[i][j], 2));
        chip.style.background = blue(r.activations[i][j] / top); chip.addEventListener("click", () => openFeature(f)); td.appendChild(chip); });
      tr.appendChild(td); table.appendChild(tr); });
    clear($("feat-prompt")).appendChild(table);
  } catch (e) { featError(e); }
}
async function steerFeature(how) {
  if (state.feature === undefined) return;
  const out = $("feat-steered"); out.textContent = "generating...";
  try {
    const r = await latest("features-steer", "/api/features/steer", featBody({feature: state.feature, how: how, alpha: Number($("feat-alpha").value),
                                                                             prompt: state.prompt, max_new_tokens: 20}));
    if (!r) return;
    out.textContent = "clean:   " + r.clean.join("") + "\n" + (how === "steer" ? "steered (alpha " + r.alpha + ")" : "ablated") + ": " + r.changed.join("");
    out.dataset.how = how;
  } catch (e) { out.textContent = e.message; }
}
function startFeatures() {
  if (!INFO.features) { $("view-features").remove(); return; }
  options($("feat-dict"), INFO.features.dictionaries.map((n) => [n, n || "(the --features directory)"]));
  $("feat-dict").addEventListener("change", openDictionary);
  $("feat-search").addEventListener("click", searchFeatures);
  $("feat-token").addEventListener("keydown", (ev) => { if (ev.key === "Enter") searchFeatures(); });
  $("feat-open").addEventListener("click", () => { if ($("feat-index").value !== "") openFeature($("feat-index").value); });
  $("feat-steer").addEventListener("click", () => steerFeature("steer"));
  $("feat-ablate").addEventListener("click", () => steerFeature("ablate"));
}

// ------------------------------------------------------------------ training
function drawCurves(run) {
  const box = clear($("train-charts")), h = run.history, steps = run.steps, rows = run.health || [];
  const val = run.val && run.val.step.length ? run.val : null;  // val.csv: a row per evaluation, live
  const loss = [], lr = [];
  if (steps && steps.step.length) { loss.push({name: "train (per step)", x: steps.step, y: steps.loss}); lr.push({name: "lr", x: steps.step, y: steps.lr}); }
  else if (h && h.step.length) { loss.push({name: "train", x: h.step, y: h.train_loss}); lr.push({name: "lr", x: h.step, y: h.lr}); }
  else if (rows.length) { loss.push({name: "train (health rows)", x: rows.map((r) => r.step), y: rows.map((r) => r.loss)});
    lr.push({name: "lr", x: rows.map((r) => r.step), y: rows.map((r) => r.lr)}); }
  else if (val) loss.push({name: "train (mean per evaluation)", x: val.step, y: val.train_loss});
  // dots: evaluations are sparse, and the first one alone is a point, not a line
  if (val) loss.push({name: "val", x: val.step, y: val.val_loss, color: "#e07b00", dots: true});
  else if (h && h.step.length) loss.push({name: "val", x: h.step, y: h.val_loss, color: "#e07b00", dots: true});
  lineChart(box, "loss (nats per token)", loss, {id: "chart-loss"}); lineChart(box, "learning rate", lr, {id: "chart-lr"});
  if (!box.children.length) box.appendChild(el("p", {"class": "note"}, "no points yet: waiting for the run's files (val.csv, history.csv, a per-step CSV such as steps.csv, or health.jsonl)"));
}
const PANELS = [["params", "update_to_data_log10", "update:data ratio (log10) per tensor", false], ["params", "grad_norm", "gradient norm per tensor", true],
  ["params", "grad_to_data", "grad:data ratio per tensor", true], ["params", "weight_norm", "weight norm per tensor", false],
  ["activations", "std", "activation std per layer", false], ["activations", "saturated", "saturated fraction per layer", false],
  ["activations", "dead", "dead-unit fraction per layer", false], ["attention", "entropy", "attention entropy per head (nats)", false]];
function drawHealth(run) {
  const box = clear($("health-charts")), rows = run.health || [], steps = rows.map((r) => r.step), bands = run.bands || {};
  if (!rows.length) { box.appendChild(el("p", {"class": "note"}, "no health.jsonl rows yet (train with --health-every N)")); return; }
  for (const [group, key, title, log] of PANELS) {
    const names = [...new Set(rows.flatMap((r) => Object.keys(r[group] || {})))];
    const series = names.map((n) => ({name: n, x: steps, y: rows.map((r) => (r[group] && r[group][n] && r[group][n][key] !== undefined) ? r[group][n][key] : null)}));
    if (series.length) lineChart(box, title + (bands[key] ? " (healthy band shaded)" : ""), series, {id: "health-" + key, log: log, band: bands[key], top: HEALTH_NAMED});
  }
  const events = [["global_grad_norm", "global gradient norm", true], ["clip_events", "clip events since the last row", false], ["skipped_steps", "skipped steps since the last row", false]];
  for (const [key, title, log] of events) { const y = rows.map((r) => r[key] === undefined || r[key] === null ? null : Number(r[key]));
    if (y.some((v) => v !== null)) lineChart(box, title, [{name: key, x: steps, y: y}], {id: "health-" + key, log: log}); }
}
function drawRunLists(run) {
  const warnings = clear($("train-warnings"));
  run.warnings.slice(-30).forEach((w) => warnings.appendChild(el("li", {}, "step " + w.step + ": " + w.message)));
  run.problems.forEach((p) => warnings.appendChild(el("li", {}, "cannot read " + p)));
  if (!warnings.children.length) warnings.appendChild(el("li", {"class": "none"}, "none"));
  const models = clear($("train-models"));
  run.models.forEach((f) => { const li = el("li", {}, f.name + " (" + f.kind + ", " + new Date(f.mtime * 1000).toLocaleTimeString() + ") ");
    const b = el("button", {"data-model": f.name}, "open in the model views");
    b.addEventListener("click", () => { fillModels(run.models); $("model").value = f.name; state.model = f.name; state.ablated.clear(); show("tokens"); analyze(); });
    li.appendChild(b); models.appendChild(li); });
  if (!run.models.length) models.appendChild(el("li", {}, "none yet (the best model is saved at each evaluation that improves)"));
}
// The run as the page holds it: each poll asks for what came after its cursor (/api/run?after=,
// docs/serve.md) and appends it; an answer that is not incremental (the files were replaced, or
// a resumed run wrote steps again) starts it afresh.
function mergeRun(run) {
  const held = run.incremental && state.run ? state.run : {history: null, steps: null, health: [], warnings: [], val: {step: [], val_loss: [], train_loss: []}};
  if (run.steps) { if (!held.steps || held.stepsFile !== run.steps_file) held.steps = {step: [], loss: [], lr: [], skips: []};
    for (const key of ["step", "loss", "lr", "skips"]) for (const v of run.steps[key]) held.steps[key].push(v); }
  else held.steps = null;
  held.stepsFile = run.steps_file;
  for (const row of run.health) held.health.push(row);
  if (run.val) for (const key of ["step", "val_loss", "train_loss"]) for (const v of run.val[key]) held.val[key].push(v);
  for (const w of run.warnings) held.warnings.push(w);
  if ("history" in run) held.history = run.history;
  Object.assign(held, {run_dir: run.run_dir, exists: run.exists, bands: run.bands, problems: run.problems, models: run.models,
                       newest_model: run.newest_model});
  state.run = held;
  return held;
}
async function pollRun() {
  let again = 1500;
  try {
    const answer = await api("/api/run?after=" + encodeURIComponent(state.runCursor)), models = JSON.stringify(answer.models);
    const changed = !answer.incremental || answer.steps && answer.steps.step.length || answer.health.length ||
      answer.val && answer.val.step.length || "history" in answer ||
      JSON.stringify(answer.problems) !== JSON.stringify((state.run || {}).problems) || models !== state.runModels;
    const run = mergeRun(answer);
    state.runCursor = answer.cursor;
    if (answer.more) again = 0;  // more rows waiting: fetch them at once, draw when all are in
    else if (changed || state.runDirty) {
      drawCurves(run); drawHealth(run); drawRunLists(run); state.runDirty = false;
      const pts = run.steps ? run.steps.step.length : run.history ? run.history.step.length : run.health.length;
      $("train-status").textContent = run.run_dir + (run.exists ? "" : " (does not exist yet)") + ": " + pts + " points, " +
        run.health.length + " health rows, " + run.val.step.length + " evaluations; updated " + new Date().toLocaleTimeString();
      $("train-status").dataset.points = pts; $("train-status").dataset.evaluations = run.val.step.length;
      if (models !== state.runModels) { state.runModels = models; fillModels(run.models); }
      const newest = run.models.find((f) => f.name === run.newest_model);
      const key = newest ? newest.name + "@" + newest.mtime : null;
      if (key && key !== state.sampleOf) { state.sampleOf = key; sampleRun(); }
    }
    if (answer.more) state.runDirty = true;
  } catch (e) { $("train-status").textContent = "cannot read the run: " + e.message; }
  setTimeout(pollRun, again);
}
async function sampleRun() {
  const box = $("train-sample");
  try { const r = await latest("sample", "/api/run/sample", {prompt: "", max_new_tokens: 120, temperature: 0.8, seed: 0});
    if (!r) return;
    box.textContent = r.text; box.dataset.model = r.model; }
  catch (e) { box.textContent = e.message; }
}

// ------------------------------------------------------------------ start
function main() {
  startFeatures(); buildNav(INFO.run); describe(INFO.model); fillModels(INFO.run_models);
  options($("patch-target"), INFO.targets.map((t) => [t, t]));
  $("analyze").addEventListener("click", () => { state.ablated.clear(); analyze(); });
  $("prompt").addEventListener("keydown", (ev) => { if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); analyze(); } });
  $("model").addEventListener("change", () => { state.model = $("model").value; state.featuresOpened = false; state.ablated.clear(); analyze(); });
  $("surprise-unit").addEventListener("change", drawSurprise);
  $("att-layer").addEventListener("change", pickLayer); $("att-head").addEventListener("change", drawAttention);
  $("att-canvas").addEventListener("mousemove", attentionCanvasTip); $("att-canvas").addEventListener("mouseleave", hideTip);
  $("lens-color").addEventListener("change", drawLens);
  $("attr-run").addEventListener("click", runAttribution); $("attr-pos").addEventListener("change", runAttribution);
  $("abl-how").addEventListener("change", runAblation); $("abl-pos").addEventListener("change", runAblation);
  $("abl-clear").addEventListener("click", () => { state.ablated.clear(); buildAblationGrid(); runAblation(); });
  $("patch-run").addEventListener("click", runPatching);
  $("gen-run").addEventListener("click", runGeneration);
  $("gen-stop").addEventListener("click", () => { if (state.generating) state.generating.abort(); });
  if (INFO.run) $("train-sample-run").addEventListener("click", sampleRun);
  show(INFO.model || (INFO.run_models || []).length || !INFO.run ? "tokens" : "training");
  if (INFO.run) pollRun();
  if (INFO.model || (INFO.run_models || []).some((f) => f.kind === "model")) analyze();
  else document.body.dataset.ready = "1";
}
main();
