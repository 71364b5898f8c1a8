// Small DOM and formatting helpers shared by every page. Elements are built with
// h(), which sets text through textContent only: queue names, message bodies and
// headers come from users and are never parsed as HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "class") {
      el.className = value;
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

const numberFormat = new Intl.NumberFormat("en");
export function num(n) {
  if (n === undefined || n === null) return "–";
  return numberFormat.format(n);
}

export function rate(n) {
  if (n === undefined || n === null || !isFinite(n)) return "–";
  if (n >= 100) return numberFormat.format(Math.round(n)) + "/s";
  return n.toFixed(1) + "/s";
}

export function bytes(n) {
  if (n === undefined || n === null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}

export function duration(s) {
  if (s === undefined || s === null) return "–";
  if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  const d = Math.floor(s / 86400), hh = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
  return (d ? d + "d " : "") + (d || hh ? hh + "h " : "") + m + "m";
}

// ISO 8601 in UTC, to the second ("2026-11-26T15:07:28Z"): the same on every
// browser whatever its locale, and the form the broker's logs use.
export function when(unixSeconds) {
  if (!unixSeconds) return "–";
  return new Date(unixSeconds * 1000).toISOString().replace(/\.\d+Z$/, "Z");
}

// The broker's history (GET /overview/history, /queues/{name}/history) on this
// page's clock (performance.now() seconds), as [{ t, sample }], oldest first.
export function historyPoints(history) {
  const offset = performance.now() / 1000 - history.now;
  return history.samples.map((sample) => ({ t: sample.t + offset, sample }));
}

export function json(value) {
  if (value === undefined || value === null) return "";
  if (typeof value === "object" && Object.keys(value).length === 0) return "";
  return JSON.stringify(value);
}

// An input with its label (every control is labelled; the id ties them).
let fieldId = 0;
export function field(label, input, hint) {
  const id = input.id || "f" + (++fieldId);
  input.id = id;
  const hintEl = hint ? h("small", { id: id + "-hint", class: "hint" }, hint) : null;
  if (hintEl) input.setAttribute("aria-describedby", hintEl.id);
  if (input.type === "checkbox") {
    return h("div", { class: "field check" }, input, h("label", { for: id }, label), hintEl);
  }
  return h("div", { class: "field" }, h("label", { for: id }, label), input, hintEl);
}

export function parseJsonField(text, what) {
  if (!text.trim()) return {};
  let value;
  try { value = JSON.parse(text); } catch (e) { throw new Error(`${what} is not valid JSON: ${e.message}`); }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new Error(`${what} must be a JSON object`);
  }
  return value;
}

// A status line for a form: role=status so screen readers announce the outcome.
export function statusLine() {
  const el = h("p", { class: "status", role: "status" });
  el.ok = (text) => { el.className = "status ok"; el.textContent = text; };
  el.fail = (err) => { el.className = "status error"; el.textContent = errorText(err); };
  el.clear = () => { el.className = "status"; el.textContent = ""; };
  return el;
}

export function errorText(err) {
  if (err && err.status) return `${err.status} ${err.code || ""}: ${err.message}`;
  return (err && err.message) || String(err);
}

// Rates from counters: keeps the previous sample per key.
export class Rates {
  constructor() { this.prev = new Map(); }
  update(key, counters, t) {
    const prev = this.prev.get(key);
    this.prev.set(key, { counters, t });
    const out = {};
    for (const [name, value] of Object.entries(counters)) {
      out[name] = prev && t > prev.t && prev.counters[name] !== undefined
        ? Math.max(0, (value - prev.counters[name]) / (t - prev.t)) : null;
    }
    return out;
  }
}

export function table(columns, rows, { caption, empty = "None." } = {}) {
  columns = columns.filter(Boolean);
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption || "table" },
    h("table", {},
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.num ? "num" : null }, c.label)))),
      h("tbody", {}, rows.map((row) => h("tr", {}, columns.map((c) =>
        h("td", { class: c.num ? "num" : null, "data-col": c.key || null }, c.cell(row))))))));
}

// setInterval for polling, skipped while the tab is hidden (a background tab costs
// the broker nothing); returns the function that stops it.
export function every(seconds, fn) {
  const timer = setInterval(() => { if (!document.hidden) fn(); }, seconds * 1000);
  return () => clearInterval(timer);
}
