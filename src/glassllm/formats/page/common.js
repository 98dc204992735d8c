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

// The charts' SVG: elements, the palette, and the axes (ticks on both, a shaded band)
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1d6fb8", "#e07b00", "#2a9d4b", "#c82828", "#7b52ab", "#8c564b", "#d6619e", "#6b6b6b", "#b5b800", "#17becf"];
function svg(tag, attrs) { const e = document.createElementNS(NS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); return e; }
function axes(s, box, opts, x0, x1, y0, y1) {
  const {W, Hh, m} = box, Yraw = (v) => Hh - m.b - (v - y0) / (y1 - y0) * (Hh - m.t - m.b), X = (x) => m.l + (x - x0) / (x1 - x0) * (W - m.l - m.r);
  if (opts.band) s.appendChild(svg("rect", {x: m.l, width: W - m.l - m.r, y: Yraw(opts.band[1]), height: Math.max(0, Yraw(opts.band[0]) - Yraw(opts.band[1])), fill: "#e8f4e8"}));
  s.appendChild(svg("line", {x1: m.l, x2: W - m.r, y1: Hh - m.b, y2: Hh - m.b, stroke: "#888"}));
  s.appendChild(svg("line", {x1: m.l, x2: m.l, y1: m.t, y2: Hh - m.b, stroke: "#888"}));
  for (let k = 0; k <= 4; k++) { const v = y0 + (y1 - y0) * k / 4, t = svg("text", {x: m.l - 4, y: Yraw(v) + 4, "text-anchor": "end", "font-size": 10});
    t.textContent = opts.log ? "1e" + v.toFixed(1) : Number(v.toPrecision(3)); s.appendChild(t);
    const u = x0 + (x1 - x0) * k / 4, tx = svg("text", {x: X(u), y: Hh - m.b + 14, "text-anchor": "middle", "font-size": 10});
    tx.textContent = Math.round(u); s.appendChild(tx); }
}
