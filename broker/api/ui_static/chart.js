// A small line chart drawn as SVG: time on x (the last `windowS` seconds), one line
// per series, the y axis from 0 to a rounded maximum. The legend under it shows each
// series' latest value, and the chart's accessible name says the same in words.

import { h } from "./util.js";

const SVG = "http://www.w3.org/2000/svg";
const W = 600, H = 160, PAD_L = 48, PAD_R = 8, PAD_T = 8, PAD_B = 20;

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function short(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(v >= 1e7 ? 0 : 1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(v >= 1e4 ? 0 : 1) + "k";
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

export class LineChart {
  // series: [{ key, label }] (colours come from the stylesheet: .s0, .s1, ...)
  constructor(title, series, { windowS = 300, format = short } = {}) {
    this.title = title;
    this.series = series;
    this.windowS = windowS;
    this.format = format;
    this.svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", class: "chart-svg" });
    this.legend = h("ul", { class: "legend" });
    this.el = h("figure", { class: "chart" }, h("figcaption", {}, title), this.svg, this.legend);
  }

  // points: [{ t (seconds), values: { key: number|null } }], oldest first
  draw(points) {
    const svg = this.svg;
    svg.replaceChildren();
    const now = points.length ? points[points.length - 1].t : 0;
    const t0 = now - this.windowS;
    // the seconds of history drawn (for tests and the curious: the chart's reach)
    svg.dataset.span = points.length ? Math.max(0, now - Math.max(points[0].t, t0)).toFixed(1) : "0";
    let max = 0;
    for (const p of points) for (const { key } of this.series) {
      const v = p.values[key];
      if (v !== null && v !== undefined && v > max) max = v;
    }
    max = niceMax(max);
    const x = (t) => PAD_L + (W - PAD_L - PAD_R) * Math.max(0, (t - t0) / this.windowS);
    const y = (v) => PAD_T + (H - PAD_T - PAD_B) * (1 - v / max);
    for (const frac of [0, 0.5, 1]) {
      const yy = y(max * frac);
      svg.appendChild(s("line", { x1: PAD_L, x2: W - PAD_R, y1: yy, y2: yy, class: "grid" }));
      svg.appendChild(s("text", { x: PAD_L - 4, y: yy + 4, class: "axis", "text-anchor": "end" }, this.format(max * frac)));
    }
    svg.appendChild(s("text", { x: PAD_L, y: H - 4, class: "axis" }, `-${Math.round(this.windowS / 60)} min`));
    svg.appendChild(s("text", { x: W - PAD_R, y: H - 4, class: "axis", "text-anchor": "end" }, "now"));
    this.series.forEach(({ key }, i) => {
      let d = "";
      let pen = false;
      for (const p of points) {
        const v = p.values[key];
        if (p.t < t0 || v === null || v === undefined) { pen = false; continue; }
        d += `${pen ? "L" : "M"}${x(p.t).toFixed(1)},${y(v).toFixed(1)}`;
        pen = true;
      }
      if (d) svg.appendChild(s("path", { d, class: `line s${i}` }));
      const last = points[points.length - 1];
      const v = last && last.values[key];
      if (v !== null && v !== undefined) svg.appendChild(s("circle", { cx: x(last.t), cy: y(v), r: 3, class: `dot f${i}` }));
    });
    const last = points.length ? points[points.length - 1].values : {};
    const words = [];
    this.legend.replaceChildren(...this.series.map(({ key, label }, i) => {
      const v = last[key];
      const text = v === null || v === undefined ? "–" : this.format(v);
      words.push(`${label} ${text}`);
      return h("li", {}, h("span", { class: `swatch s${i}`, "aria-hidden": "true" }), `${label}: `, h("strong", { "data-series": key }, text));
    }));
    svg.setAttribute("aria-label", `${this.title}, last ${Math.round(this.windowS / 60)} minutes; now ${words.join(", ")}`);
  }
}
