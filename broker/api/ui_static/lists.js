// Pages for the broker's optional families (locks, schedules): a read-only
// table of what GET <path> answers, shown only when this broker has the endpoint.
// The nav hides them on a 404 (see app.js); this page says so too.

import { api } from "./api.js";
import { h, replace, table, errorText, every } from "./util.js";

function cellText(v) {
  if (v === null || v === undefined) return "–";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

export function listPage(title, path) {
  const out = h("div", { "aria-live": "polite" });
  async function load() {
    try {
      const answer = await api(path);
      const rows = Array.isArray(answer) ? answer : Object.values(answer).find(Array.isArray) || [];
      const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))];
      replace(out, table(keys.map((k) => ({ label: k, cell: (r) => cellText(r[k]) })), rows, { caption: `${rows.length} ${title.toLowerCase()}` }));
    } catch (e) {
      replace(out, h("p", { class: e.status === 404 ? "empty" : "status error" },
        e.status === 404 ? `This broker has no ${title.toLowerCase()} API.` : errorText(e)));
    }
  }
  load();
  return { el: h("div", {}, h("h1", { tabindex: "-1" }, title), out), stop: every(5, load) };
}
