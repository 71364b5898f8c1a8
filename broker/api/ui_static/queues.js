// The queue list: filtered, sorted and paginated by the broker (GET /queues with
// page, page_size, name, sort, order), so it stays fast at 10,000 queues; refreshed
// every few seconds, with publish and deliver rates from the counters' change.
// Declaring a queue is a form above the list.

import { api, seg } from "./api.js";
import { h, replace, num, rate, field, parseJsonField, statusLine, table, errorText, Rates, every } from "./util.js";

const REFRESH_S = 3;
// Kept while the tab lives, so going back to the list finds it as it was left.
const state = { name: "", sort: "name", order: "asc", page: 1, page_size: 50 };
const rates = new Rates();

const COLUMNS = [
  { label: "Name", sort: "name", cell: (q) => h("a", { href: "#/queue/" + encodeURIComponent(q.name) }, q.name) },
  { label: "Features", cell: (q) => flags(q) },
  { label: "Ready", sort: "messages_ready", num: true, key: "ready", cell: (q) => num(q.messages_ready) },
  { label: "Unacked", sort: "messages_unacked", num: true, key: "unacked", cell: (q) => num(q.messages_unacked) },
  { label: "Total", sort: "messages", num: true, key: "total", cell: (q) => num(q.messages) },
  { label: "Consumers", sort: "consumers", num: true, key: "consumers", cell: (q) => num(q.consumers) },
  { label: "Publish", sort: "published", num: true, cell: (q) => rate(q.rates.published) },
  { label: "Deliver", sort: "delivered", num: true, cell: (q) => rate(q.rates.delivered) },
  { label: "Ack", num: true, cell: (q) => rate(q.rates.acked) },
];

// Badges for a queue's features and arguments, as RabbitMQ's management shows them
// (D, AD, Excl, TTL, Exp, Lim, Lim B, DLX, DLK, Pri, SAC, DLim, Ovf, Q); each says
// its meaning and value in its title, and arguments without a badge show as "Args".
const ARG_BADGES = [
  ["x-message-ttl", "TTL", (v) => `message TTL ${v} ms`],
  ["x-expires", "Exp", (v) => `queue expires after ${v} ms unused`],
  ["x-max-length", "Lim", (v) => `at most ${v} messages`],
  ["x-max-length-bytes", "Lim B", (v) => `at most ${v} bytes of messages`],
  ["x-overflow", "Ovf", (v) => `overflow: ${v}`],
  ["x-dead-letter-exchange", "DLX", (v) => `dead-letter exchange ${v === "" ? "(default)" : v}`],
  ["x-dead-letter-routing-key", "DLK", (v) => `dead-letter routing key ${v}`],
  ["x-delivery-limit", "DLim", (v) => `delivery limit ${v}`],
  ["x-max-priority", "Pri", (v) => `priorities 0..${v}`],
  ["x-single-active-consumer", "SAC", () => "single active consumer"],
  ["x-consumer-timeout", "CT", (v) => `consumer ack timeout ${v} ms`],
];

function badge(text, title, arg) {
  return h("span", { class: "tag" + (text === "Q" ? " q" : ""), title, "aria-label": title, "data-arg": arg || null }, text);
}

export function flags(q) {
  const args = q.arguments || {};
  const out = [
    q.durable ? badge("D", "durable") : null,
    q.auto_delete ? badge("AD", "auto-delete") : null,
    q.exclusive ? badge("Excl", "exclusive") : null,
    args["x-queue-type"] === "quorum" ? badge("Q", "quorum queue type", "x-queue-type") : null,
  ];
  const known = new Set(["x-queue-type"]);
  for (const [arg, text, says] of ARG_BADGES) {
    known.add(arg);
    if (args[arg] !== undefined && args[arg] !== false) out.push(badge(text, says(args[arg]), arg));
  }
  const rest = Object.keys(args).filter((k) => !known.has(k));
  if (rest.length) out.push(badge("Args", rest.map((k) => `${k}: ${JSON.stringify(args[k])}`).join("; ")));
  return out;
}

export function declareQueueForm(onDone) {
  const name = h("input", { name: "name", required: true, maxlength: "255", autocomplete: "off" });
  const durable = h("input", { type: "checkbox", name: "durable", checked: true });
  const autoDelete = h("input", { type: "checkbox", name: "auto_delete" });
  const args = h("textarea", { name: "arguments", rows: "2", placeholder: '{"x-max-length": 1000}' });
  const status = statusLine();
  const form = h("form", { class: "panel", id: "declare-queue", "aria-labelledby": "h-declare-queue" },
    h("h2", { id: "h-declare-queue" }, "Declare a queue"),
    h("div", { class: "row" },
      field("Name", name),
      field("Durable", durable),
      field("Auto-delete", autoDelete)),
    field("Arguments (JSON)", args, "x-message-ttl, x-max-length, x-dead-letter-exchange, x-max-priority… (docs/http-api.md)"),
    h("div", { class: "buttons" }, h("button", { class: "primary", type: "submit" }, "Declare queue")),
    status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const body = { durable: durable.checked, auto_delete: autoDelete.checked, arguments: parseJsonField(args.value, "Arguments") };
      const q = await api("/queues/" + seg(name.value), { method: "PUT", json: body });
      status.ok(`Queue ${q.name} declared.`);
      onDone && onDone(q);
    } catch (e) {
      status.fail(e);
    }
  });
  return form;
}

export function queuesPage() {
  const filter = h("input", { type: "search", name: "filter", value: state.name, autocomplete: "off" });
  const size = h("select", { name: "page_size" }, [20, 50, 100, 500].map((n) => h("option", { value: n, selected: n === state.page_size }, n)));
  const list = h("div", { id: "queue-list", "aria-live": "polite", "aria-busy": "true" });
  const pager = h("div", { class: "pager" });
  const error = h("p", { class: "status error", role: "alert" });
  const el = h("div", {},
    h("h1", { tabindex: "-1" }, "Queues"),
    h("div", { class: "row" },
      field("Filter by name", filter, "Part of a name, any case"),
      field("Per page", size)),
    error, list, pager,
    declareQueueForm(() => load()));

  let typing = null;
  filter.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => { state.name = filter.value; state.page = 1; load(); }, 250);
  });
  size.addEventListener("change", () => { state.page_size = Number(size.value); state.page = 1; load(); });

  function sortButton(c) {
    if (!c.sort) return c.label;
    const active = state.sort === c.sort;
    const arrow = active ? (state.order === "asc" ? " ▲" : " ▼") : "";
    return h("button", {
      type: "button", class: "sort",
      "aria-label": `${c.label}: sort ${active && state.order === "asc" ? "descending" : "ascending"}`,
      onclick: () => {
        if (active) state.order = state.order === "asc" ? "desc" : "asc";
        else { state.sort = c.sort; state.order = c.sort === "name" ? "asc" : "desc"; }
        state.page = 1;
        load(c.sort);
      },
    }, c.label + arrow);
  }

  let seq = 0;
  async function load(focusSort) {
    const mine = ++seq;
    let answer;
    try {
      answer = await api("/queues", { query: state });
    } catch (e) {
      if (mine === seq) error.textContent = "Cannot list the queues: " + errorText(e);
      return;
    }
    if (mine !== seq) return; // a newer request is on its way
    error.textContent = "";
    const t = performance.now() / 1000;
    for (const q of answer.queues) {
      q.rates = rates.update(q.name, q.message_stats, t);
    }
    if (answer.page > answer.pages && answer.filtered > 0) { state.page = answer.pages; return load(); }
    const columns = COLUMNS.map((c) => ({ ...c, label: sortButton(c) }));
    const rendered = table(columns, answer.queues, {
      caption: `${num(answer.filtered)} of ${num(answer.total)} queues, sorted by ${state.sort} ${state.order === "asc" ? "ascending" : "descending"}`,
      empty: answer.total ? "No queue matches the filter." : "No queues yet: declare one below.",
    });
    for (const th of rendered.querySelectorAll ? rendered.querySelectorAll("th") : []) {
      const i = [...th.parentNode.children].indexOf(th);
      if (COLUMNS[i].sort === state.sort) th.setAttribute("aria-sort", state.order === "asc" ? "ascending" : "descending");
    }
    replace(list, rendered);
    list.setAttribute("aria-busy", "false");
    if (focusSort) {
      const b = [...list.querySelectorAll("th button")].find((x) => x.textContent.startsWith(COLUMNS.find((c) => c.sort === focusSort).label));
      if (b) b.focus();
    }
    replace(pager,
      h("button", { type: "button", disabled: state.page <= 1, onclick: () => { state.page--; load(); } }, "← Previous"),
      h("span", { id: "page-of" }, `Page ${answer.page} of ${answer.pages}`),
      h("button", { type: "button", disabled: state.page >= answer.pages, onclick: () => { state.page++; load(); } }, "Next →"));
  }

  load();
  // A refresh would rebuild the table under a keyboard user's focus: skip it then.
  const stop = every(REFRESH_S, () => { if (!list.contains(document.activeElement)) load(); });
  return { el, stop };
}
