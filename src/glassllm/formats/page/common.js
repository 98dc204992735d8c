// What the two pages share -- `glassllm inspect`'s report (glassllm/lens/page/report.js) and
// `glassllm serve`'s page (glassllm/serve/page/app.js): each inlines this file before its own
// script (glassllm.formats.inline_json.page_files).
"use strict";
const $ = (id) => document.getElementById(id);
const tip = $("tooltip");
function showTip(ev, text) { tip.textContent = text; tip.style.display = "block";
  tip.style.left = (ev.clientX + 14) + "px"; tip.style.top = (ev.clientY + 10) + "px"; }
function hideTip() { tip.style.display = "none"; }
function el(tag, attrs, text) { const e = document.createElement(tag);
  for (const k in (attrs || {})) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text; return e; }
function fmt(x, d) { return (x === null || x === undefined) ? "-" : Number(x).toFixed(d === undefined ? 3 : d); }
function blue(a) { return "rgba(29,111,184," + Math.max(0, Math.min(1, a)).toFixed(3) + ")"; }
function heat(v) { const x = Math.max(0, Math.min(1, v)); // white -> orange -> red
  return "rgb(255," + Math.round(255 - 180 * x) + "," + Math.round(255 - 235 * x) + ")"; }
function diverging(v, scale) { const x = Math.max(-1, Math.min(1, v / (scale || 1)));
  return x >= 0 ? "rgba(29,111,184," + x.toFixed(3) + ")" : "rgba(200,40,40," + (-x).toFixed(3) + ")"; }

// A padded vocabulary's id that no token has comes from the server as "(padding id N)"
// (glassllm.lens.trace.token_text): shown as it is, never quoted nor with its spaces marked.
const PADDING = /^\(padding id \d+\)$/;
function quoted(t) { return PADDING.test(t) ? t : JSON.stringify(t); }
function cellText(t, vis) { return PADDING.test(t) ? t : vis(t).replace(/ /g, "\u2423"); }

// One nav button per section.view, which calls the page's own show(name); the training view
// only where there is a run.
function buildNav(hasRun) {
  for (const s of document.querySelectorAll("section.view")) {
    const name = s.id.slice(5);
    if (name === "training" && !hasRun) { s.remove(); continue; }
    const b = el("button", {"data-view": name, "id": "nav-" + name}, s.dataset.title);
    b.addEventListener("click", () => show(name));
    $("nav").appendChild(b);
  }
}

// The attention map's token labels: one per token, each exactly one cell wide (cls "att-xlabel":
// keys, above the map, written upwards) or high ("att-ylabel": queries, to its left), so label j
// spans column (row) j at any length; each page's CSS (.att-map) lays the boxes out.
// text: a token's display text (each page's vis). Returns the label elements.
function mapLabels(box, tokens, cls, size, cell, text) {
  box.textContent = "";
  return tokens.map((t, i) => {
    const e = el("div", {"class": "att-label " + cls, "data-i": i, "title": i + " " + JSON.stringify(t)}, text(t).replace(/ /g, "\u2423"));
    e.style[size] = cell + "px"; e.style.lineHeight = cell + "px";
    e.style.fontSize = Math.min(12, cell - 3) + "px"; box.appendChild(e); return e; });
}

// The charts' SVG: elements, the palette, round ticks, the axes and the line chart itself
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1d6fb8", "#e07b00", "#2a9d4b", "#c82828", "#7b52ab", "#8c564b", "#d6619e", "#6b6b6b", "#b5b800", "#17becf"];
function svg(tag, attrs) { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); return e; }

// Round tick values: Heckbert, "Nice numbers for graph labels", Graphics Gems (1990). niceNum(x,
// round) is 1, 2, 5 or 10 times a power of ten near x (round: the nearest; else the next up).
function niceNum(x, round) {
  const e = Math.floor(Math.log10(x)), f = x / 10 ** e;
  const nf = round ? (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) : (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10);
  return nf * 10 ** e;
}
// About n ticks on [lo, hi], every one a multiple of a 1-2-5 step. loose: the axis grows to the
// ticks around the data (Heckbert's loose labelling); tight: only ticks inside [lo, hi]. integer:
// a step of at least 1 (training steps). Returns {ticks: [[value, label]], lo, hi}.
function niceTicks(lo, hi, n, loose, integer) {
  if (!(hi > lo)) { hi = lo + 1; }
  let step = niceNum(niceNum(hi - lo, false) / Math.max(1, n - 1), true);
  if (integer) step = Math.max(1, step);
  const first = loose ? Math.floor(lo / step + 1e-9) : Math.ceil(lo / step - 1e-9);
  const last = loose ? Math.ceil(hi / step - 1e-9) : Math.floor(hi / step + 1e-9);
  if (!loose && last - first < 1 && n < 40) return niceTicks(lo, hi, 2 * n, loose, integer);  // two at least
  const ticks = [];
  for (let k = first; k <= last; k++) { const v = Number((k * step).toPrecision(12)) || 0; ticks.push([v, tickText(v, step)]); }
  return {ticks: ticks, lo: loose ? ticks[0][0] : lo, hi: loose ? ticks[ticks.length - 1][0] : hi};
}
// A tick's text: as many decimals as its step has ("0.25" never "0.2500001"), exponent form for
// the very small and the very large ("2e-5", "1e6").
function tickText(v, step) {
  if (v === 0) return "0";
  if (Math.abs(v) >= 1e6 || step < 1e-4) return Number(v.toPrecision(12)).toExponential().replace("e+", "e");
  return v.toFixed(Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
}
// Ticks of a log axis whose ends lo, hi are log10 values: powers of ten where the range holds
// three or more (every 2nd, 5th... of many), else 1, 2 and 5 times them, else round values of the
// plain scale inside the range (a range of less than a factor of 2). Positions in log10.
function logTicks(lo, hi) {
  const a = Math.ceil(lo - 1e-9), b = Math.floor(hi + 1e-9), power = (m, e) => [Math.log10(m) + e, powerText(m, e)];
  if (b - a >= 2) { const every = b - a > 6 ? niceNum((b - a) / 5, true) : 1, out = [];
    for (let e = Math.ceil(a / every) * every; e <= b; e += every) out.push(power(1, e));
    return out; }
  const out = [];
  for (let e = Math.floor(lo) - 1; e <= Math.ceil(hi); e++) for (const m of [1, 2, 5]) {
    const t = Math.log10(m) + e; if (t >= lo - 1e-9 && t <= hi + 1e-9) out.push(power(m, e)); }
  if (out.length >= 2) return out;
  return niceTicks(10 ** lo, 10 ** hi, 5, false).ticks.filter(([v]) => v > 0).map(([v, text]) => [Math.log10(v), text]);
}
function powerText(m, e) { return e >= -3 && e <= 4 ? (m * 10 ** e).toFixed(Math.max(0, -e)) : m + "e" + e; }

// The axes of a chart: a shaded band, the two lines, each tick's text. box: {W, Hh, m}; x, y:
// {ticks, lo, hi} (y's ticks on its drawn scale: log10 on a log chart).
function axes(s, box, opts, x, y) {
  const {W, Hh, m} = box, Yraw = (v) => Hh - m.b - (v - y.lo) / (y.hi - y.lo) * (Hh - m.t - m.b), X = (v) => m.l + (v - x.lo) / (x.hi - x.lo) * (W - m.l - m.r);
  if (opts.band) s.appendChild(svg("rect", {x: m.l, width: W - m.l - m.r, y: Yraw(opts.band[1]), height: Math.max(0, Yraw(opts.band[0]) - Yraw(opts.band[1])), fill: "#e8f4e8"}));
  s.appendChild(svg("line", {x1: m.l, x2: W - m.r, y1: Hh - m.b, y2: Hh - m.b, stroke: "#888"}));
  s.appendChild(svg("line", {x1: m.l, x2: m.l, y1: m.t, y2: Hh - m.b, stroke: "#888"}));
  for (const [v, text] of y.ticks) { const t = svg("text", {x: m.l - 4, y: Yraw(v) + 3.5, "text-anchor": "end", "font-size": 10, "class": "ytick"});
    t.textContent = text; s.appendChild(t); s.appendChild(svg("line", {x1: m.l - 3, x2: m.l, y1: Yraw(v), y2: Yraw(v), stroke: "#888"})); }
  for (const [v, text] of x.ticks) { const t = svg("text", {x: X(v), y: Hh - m.b + 14, "text-anchor": "middle", "font-size": 10, "class": "xtick"});
    t.textContent = text; s.appendChild(t); s.appendChild(svg("line", {x1: X(v), x2: X(v), y1: Hh - m.b, y2: Hh - m.b + 3, stroke: "#888"})); }
}

// A line chart of series [{name, x, y, color?}] in parent: round ticks (x tight, y loose, a log
// axis at powers of ten), margins wide enough for every tick's text (the last x label whole).
// opts: {log, band: [lo, hi] on the drawn scale, top: name (in colour) only the `top` series
// farthest from the others and draw the rest grey, id}.
const CHAR_PX = 6.5;  // an upper bound on a digit's width at font-size 10, for the margins
function lineChart(parent, title, series, opts) {
  opts = opts || {}; const W = 430, Hh = 230;
  const ok = (y) => y !== null && y !== undefined && isFinite(y) && (!opts.log || y > 0);
  const pts = series.flatMap((d) => d.x.map((x, i) => [x, d.y[i]])).filter(([x, y]) => x !== null && ok(y));
  if (!pts.length) return;
  const tr = (y) => opts.log ? Math.log10(y) : y;
  let x0 = Math.min(...pts.map((p) => p[0])), x1 = Math.max(...pts.map((p) => p[0]));
  let y0 = Math.min(...pts.map((p) => tr(p[1]))), y1 = Math.max(...pts.map((p) => tr(p[1])));
  if (opts.band) { y0 = Math.min(y0, opts.band[0]); y1 = Math.max(y1, opts.band[1]); }
  if (x1 === x0) x1 = x0 + 1; if (y1 === y0) { y1 += 1; y0 -= 1; }
  const xs = niceTicks(x0, x1, 5, false, pts.every((p) => Number.isInteger(p[0])));
  const ys = opts.log ? {ticks: logTicks(y0, y1), lo: y0, hi: y1} : niceTicks(y0, y1, 5, true);
  const widest = (ticks) => Math.max(0, ...ticks.map(([, t]) => t.length)) * CHAR_PX;
  const lastX = xs.ticks.length ? xs.ticks[xs.ticks.length - 1] : [x1, ""];
  const m = {l: Math.max(40, widest(ys.ticks) + 10), r: 10, t: 8, b: 30};
  // the last x label's centre at m.l + (1 - d) * (W - m.l - m.r), d its distance from the right end
  // as a share of the axis: its half-width and 2 px must fit before W
  const d = (x1 - lastX[0]) / (x1 - x0), half = lastX[1].length * CHAR_PX / 2;
  m.r = d < 1 ? Math.max(10, (half + 2 - d * (W - m.l)) / (1 - d)) : 10;
  const X = (x) => m.l + (x - x0) / (x1 - x0) * (W - m.l - m.r), Y = (y) => Hh - m.b - (tr(y) - ys.lo) / (ys.hi - ys.lo) * (Hh - m.t - m.b);
  const chart = el("div", {"class": "chart"}); if (opts.id) chart.id = opts.id;
  chart.appendChild(el("h3", {}, title));
  const s = svg("svg", {width: W, height: Hh, viewBox: "0 0 " + W + " " + Hh, "data-points": pts.length});
  axes(s, {W, Hh, m}, opts, {ticks: xs.ticks, lo: x0, hi: x1}, ys);
  const named = opts.top ? outliers(series, opts.top, tr, opts.log) : series.map((_, n) => n).filter((n) => series[n].y.some(ok));
  const colour = new Map(named.map((n, k) => [n, series[n].color || COLORS[k % COLORS.length]]));
  const order = series.map((_, n) => n).filter((n) => !colour.has(n)).concat(named);  // grey under
  for (const n of order) { const d = series[n]; let path = "";
    d.x.forEach((x, i) => { if (x === null || !ok(d.y[i])) return; path += (path ? "L" : "M") + X(x).toFixed(1) + "," + Y(d.y[i]).toFixed(1); });
    if (!path) continue;
    const line = svg("path", {d: path, fill: "none", "stroke-width": colour.has(n) ? 1.6 : 1, "class": colour.has(n) ? "named" : "grey", "data-name": d.name});
    if (colour.has(n)) line.setAttribute("stroke", colour.get(n));
    const hover = svg("title", {}); hover.textContent = d.name; line.appendChild(hover); s.appendChild(line);
    if (d.dots) d.x.forEach((x, i) => { if (x === null || !ok(d.y[i])) return;  // a mark per point (sparse series)
      const dot = svg("circle", {cx: X(x).toFixed(1), cy: Y(d.y[i]).toFixed(1), r: 2.5, "class": "dot", "data-name": d.name});
      dot.setAttribute("fill", colour.has(n) ? colour.get(n) : "#cfcfcf");
      const tip = svg("title", {}); tip.textContent = d.name + " " + x + ": " + d.y[i]; dot.appendChild(tip); s.appendChild(dot); }); }
  chart.appendChild(s); chart.appendChild(legend(series, named, colour)); parent.appendChild(chart);
}
function legend(series, named, colour) {
  const box = el("div", {"class": "legend"});
  named.forEach((n) => { const item = el("span", {"class": "legend-item"}, "\u25a0 " + series[n].name + "  ");
    item.style.color = colour.get(n); box.appendChild(item); });
  const others = series.length - named.length;
  if (others) { const rest = el("span", {"class": "legend-rest"}, "\u25a0 " + others + " other" + (others > 1 ? "s" : "") + " in grey (hover a line for its name)");
    rest.style.color = "#888"; box.appendChild(rest); }
  return box;
}
// The indices of the `k` series to name: those whose last value lies farthest from the median
// of all the last values (on the chart's scale: log10 for a log chart) -- the outliers a reader
// looks for among ~30 tensors; the others are drawn grey. All of them when there are <= k.
function outliers(series, k, tr, log) {
  const last = series.map((d) => { for (let i = d.y.length - 1; i >= 0; i--) { const y = d.y[i];
    if (y !== null && isFinite(y) && (!log || y > 0)) return tr(y); } return null; });
  const known = series.map((_, n) => n).filter((n) => last[n] !== null);
  if (known.length <= k) return known;
  const sorted = known.map((n) => last[n]).sort((a, b) => a - b), median = sorted[Math.floor(sorted.length / 2)];
  return known.sort((a, b) => Math.abs(last[b] - median) - Math.abs(last[a] - median) || a - b).slice(0, k);
}
const HEALTH_NAMED = 5;  // series named (in colour) per health panel; the rest are grey
