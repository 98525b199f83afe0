// Stacked bar charts drawn as SVG elements by this script (no chart library, no inline script).
import { h } from "./ui.js";

const NS = "http://www.w3.org/2000/svg";

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].map((m) => m * p).find((m) => m >= v);
}

// `categories`: the x labels; `series`: [{ name, values }] (values aligned with categories),
// stacked. `title` names the chart for assistive technology; a table beside it has the numbers.
export function stackedBars(title, categories, series, unit = "") {
  const width = Math.max(360, 48 + categories.length * 56);
  const height = 240;
  const left = 48, bottom = 40, top = 12;
  const plotH = height - bottom - top;
  const totals = categories.map((_, i) => series.reduce((sum, se) => sum + (Number(se.values[i]) || 0), 0));
  const max = niceMax(Math.max(0, ...totals));
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", "aria-label": title, class: "chart" });
  svg.append(s("title", {}, title));
  for (let t = 0; t <= 4; t++) {
    const y = top + plotH - (plotH * t) / 4;
    svg.append(s("line", { x1: left, x2: width - 8, y1: y, y2: y, class: "grid" }));
    svg.append(s("text", { x: left - 6, y: y + 4, class: "axis", "text-anchor": "end" }, fmt((max * t) / 4)));
  }
  const band = (width - left - 8) / Math.max(1, categories.length);
  const barW = Math.min(40, band * 0.7);
  categories.forEach((cat, i) => {
    const x = left + i * band + (band - barW) / 2;
    let y = top + plotH;
    series.forEach((se, k) => {
      const v = Number(se.values[i]) || 0;
      if (v <= 0) return;
      const hgt = (plotH * v) / max;
      y -= hgt;
      const rect = s("rect", { x, y, width: barW, height: hgt, class: `bar s${k % 8}` });
      rect.append(s("title", {}, `${cat} · ${se.name}: ${fmt(v)}${unit}`));
      svg.append(rect);
    });
    svg.append(s("text", { x: x + barW / 2, y: height - bottom + 16, class: "axis", "text-anchor": "middle" }, cat));
  });
  const legend = h(
    "ul",
    { class: "legend", "aria-label": `${title}: legend` },
    series.map((se, k) => h("li", {}, h("span", { class: `swatch s${k % 8}`, "aria-hidden": "true" }), se.name)),
  );
  return h("figure", { class: "chart-box" }, svg, legend);
}

function fmt(v) {
  if (Number.isInteger(v)) return String(v);
  return String(Number(v.toPrecision(Math.abs(v) < 1 ? 2 : 3)));
}
