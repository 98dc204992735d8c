// The page of `glassllm inspect` (glassllm/lens/report.py inlines this file into report.html,
// after glassllm/formats/page/common.js: $, tip, el, the colour scales, buildNav).
// DATA: what glassllm.lens.report.page_data computed, from the page's JSON block.
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
function vis(t) { return t.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5") || "\u2205"; }

// ------------------------------------------------------------------ navigation
function show(name) {
  for (const s of document.querySelectorAll("section.view")) s.classList.toggle("active", s.id === "view-" + name);
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.view === name);
}

// ------------------------------------------------------------------ attention
function buildAttention() {
  const L = DATA.attention.length, H = DATA.attention[0].length, T = DATA.tokens.length;
  for (let l = 0; l < L; l++) $("att-layer").appendChild(el("option", {value: l}, String(l)));
  for (let h = 0; h < H; h++) $("att-head").appendChild(el("option", {value: h}, String(h)));
  const spans = DATA.tokens.map((t, i) => { const s = el("span", {"class": "tok", "data-i": i}, vis(t));
    $("att-tokens").appendChild(s); return s; });
  // one cell per query x key; at least 12 px so that a label fits, at most 26 for short prompts
  const cell = Math.max(12, Math.min(26, Math.floor(740 / T)));
  const canvas = $("att-canvas"); canvas.width = cell * T; canvas.height = cell * T;
  canvas.style.width = cell * T + "px"; canvas.style.height = cell * T + "px";  // never scaled
  const ctx = canvas.getContext("2d");
  const rows = () => DATA.attention[+$("att-layer").value][+$("att-head").value];
  mapLabels($("att-xlabels"), DATA.tokens, "att-xlabel", "width", cell, vis);
  const ylabels = mapLabels($("att-ylabels"), DATA.tokens, "att-ylabel", "height", cell, vis);
  function draw() {
    const r = rows(); ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    for (let i = 0; i < T; i++) for (let j = 0; j <= i; j++) {
      ctx.fillStyle = blue(r[i][j]); ctx.fillRect(j * cell, i * cell, cell, cell); }
    ctx.strokeStyle = "#999"; ctx.strokeRect(0, 0, canvas.width, canvas.height);
  }
  function light(i) { const r = rows();
    spans.forEach((s, j) => { s.style.background = j <= i ? blue(r[i][j]) : "transparent";
      s.classList.toggle("query", j === i); });
    ylabels.forEach((e, j) => e.classList.toggle("query", j === i)); }
  function clear() { spans.forEach((s) => { s.style.background = "transparent"; s.classList.remove("query"); });
    ylabels.forEach((e) => e.classList.remove("query")); }
  for (const group of [spans, ylabels])
    group.forEach((s, i) => { s.addEventListener("mouseenter", () => light(i)); s.addEventListener("mouseleave", clear); });
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
      const td = el("td", {}, cellText(tok, vis)); td.style.background = heat(p);
      let text = name + ", after position " + t + ":\n" + lens.top[l][t].map(([x, q]) => quoted(x) + " " + fmt(q)).join("\n");
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
        " bits, rank " + s.rank[i - 1] + "\nmodel's top guesses:\n" + s.top[i - 1].map(([x, p]) => quoted(x) + " " + fmt(p)).join("\n");
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
    $("attr-note").textContent = "logit of " + quoted(a.token) + (+sel.value < T - 1 ? " (the next token)" : " (the model's top guess)") +
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

// ------------------------------------------------------------------ training (lineChart: common.js)
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
    lineChart($("health-charts"), title + (band ? " (healthy band shaded)" : ""), series, {log: log, band: band, top: HEALTH_NAMED});
  }
  const totals = [["global_grad_norm", "global gradient norm"], ["clipped", "clip events"], ["nonfinite", "non-finite values"]];
  for (const [key, title] of totals) { const y = rows.map((r) => r[key] === undefined ? null : Number(r[key]));
    if (y.some((v) => v !== null)) lineChart($("health-charts"), title, [{name: key, x: steps, y: y}]); }
}

// ------------------------------------------------------------------ features (inspect --features)
function featureBars(box, rows) { box.textContent = "";
  if (!rows) { box.appendChild(el("p", {"class": "note"}, "none: the decoder writes no residual direction")); return; }
  const scale = Math.max(...rows.map((r) => Math.abs(r[1]))) || 1;
  rows.forEach(([t, v]) => { const row = el("div", {"class": "bar-row"}); row.appendChild(el("div", {"class": "bar-label"}, cellText(t, vis)));
    const track = el("div", {"class": "bar-track"}), bar = el("div", {"class": "bar"});
    bar.style.width = (100 * Math.abs(v) / scale) + "%"; bar.style.left = "0"; bar.style.background = v >= 0 ? "#1d6fb8" : "#c82828";
    track.appendChild(bar); row.appendChild(track); row.appendChild(el("div", {"class": "bar-value"}, fmt(v, 3))); box.appendChild(row); });
}
function pickFeature(i) {
  const F = DATA.features, f = F.features.find((x) => x.feature === i);
  for (const li of document.querySelectorAll("#feat-list li")) li.classList.toggle("picked", li.dataset.feature === String(i));
  $("feat-detail").dataset.feature = i;
  $("feat-title").textContent = "feature #" + i + (f ? ": largest activation on the prompt " + fmt(f.max, 3) : " (not among the strongest listed)");
  const box = $("feat-tokens"); box.textContent = "";
  if (!f) { featureBars($("feat-promoted"), null); featureBars($("feat-suppressed"), null); return; }
  DATA.tokens.forEach((t, j) => { const span = el("span", {"class": "tok"}, vis(t)); span.style.background = blue(f.activations[j] / (f.max || 1));
    span.addEventListener("mousemove", (ev) => showTip(ev, quoted(t) + ": activation " + fmt(f.activations[j], 4))); span.addEventListener("mouseleave", hideTip);
    box.appendChild(span); });
  featureBars($("feat-promoted"), f.promoted); featureBars($("feat-suppressed"), f.suppressed);
}
function buildFeatures() {
  const F = DATA.features;
  if (!F) return;
  const f = F.facts;
  $("feat-facts").textContent = f.kind + " dictionary of " + f.hook_name + (f.out_name ? " \u2192 " + f.out_name : "") + ", d_in " + f.d_in + ", d_sae " + f.d_sae + (f.k ? ", k " + f.k : "");
  F.features.filter((x) => x.listed).forEach((x) => { const li = el("li", {"data-feature": x.feature}, "#" + x.feature + "  max " + fmt(x.max, 3));
    li.addEventListener("click", () => pickFeature(x.feature)); $("feat-list").appendChild(li); });
  const table = el("table", {"class": "grid", "id": "feat-table"}), head = el("tr");
  ["#", "token", "active features (activation)"].forEach((t) => head.appendChild(el("th", {}, t))); table.appendChild(head);
  const top = Math.max(1e-9, ...F.per_token.flat().map((p) => p[1]));
  DATA.tokens.forEach((t, i) => { const tr = el("tr"); tr.appendChild(el("td", {}, String(i))); tr.appendChild(el("td", {}, cellText(t, vis)));
    const td = el("td"); td.style.textAlign = "left";
    F.per_token[i].forEach(([feat, v]) => { const chip = el("span", {"class": "chip", "data-feature": feat}, "#" + feat + " " + fmt(v, 2));
      chip.style.background = blue(v / top); chip.addEventListener("click", () => pickFeature(feat)); td.appendChild(chip); });
    tr.appendChild(td); table.appendChild(tr); });
  $("feat-per-token").appendChild(table);
  if (F.features.length) pickFeature(F.features[0].feature);
}

function main() {
  $("title").textContent = DATA.title;
  const m = DATA.model;
  $("meta").textContent = m.family + " model: d_model " + m.d_model + ", " + m.n_layers + " layers, " + m.n_heads +
    " heads (" + m.n_kv_heads + " kv), vocab " + m.vocab_size + "; " + DATA.tokens.length + " tokens";
  if (DATA.note) { $("prompt-note").textContent = "Note: " + DATA.note + "."; $("prompt-note").hidden = false; }
  if (!DATA.features) $("view-features").remove();
  buildNav(DATA.run); show("attention"); buildAttention(); buildLens(); buildSurprise(); buildAttribution(); buildHeads(); buildTraining(); buildFeatures();
  document.body.dataset.ready = "1";
}
main();
