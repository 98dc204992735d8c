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
