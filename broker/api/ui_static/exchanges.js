// Exchanges and bindings: list exchanges with their message rates in and out
// (from the counters' change, refreshed every few seconds) and declare them, list
// bindings and unbind, bind a queue or an exchange, and publish to an exchange with
// a routing key and properties, showing how many queues it was routed to and the
// broker's confirm.

import { api, seg } from "./api.js";
import { confirmAction } from "./dialogs.js";
import { h, replace, json, num, rate, field, parseJsonField, statusLine, table, errorText, Rates, every } from "./util.js";

const REFRESH_S = 3;
const rates = new Rates();
const TYPES = ["direct", "fanout", "topic", "headers", "x-consistent-hash", "x-delayed-message"];

export function exchangesPage() {
  const list = h("div", { id: "exchange-list" });
  const bindingList = h("div", { id: "binding-list" });
  const error = h("p", { class: "status error", role: "alert" });
  let exchanges = [];
  const exchangeOptions = h("datalist", { id: "exchange-names" });

  async function load() {
    try {
      exchanges = (await api("/exchanges")).exchanges;
      const bindings = (await api("/bindings")).bindings;
      const t = performance.now() / 1000;
      for (const x of exchanges) x.rates = rates.update(x.name, x.message_stats || {}, t);
      error.textContent = "";
      replace(exchangeOptions, exchanges.map((x) => h("option", { value: x.name })));
      replace(list, table([
        { label: "Name", cell: (x) => x.name === "" ? "(default)" : x.name },
        { label: "Type", cell: (x) => x.type },
        { label: "Features", cell: (x) => [x.durable ? h("span", { class: "tag", title: "durable" }, "D") : null,
          x.auto_delete ? h("span", { class: "tag", title: "auto-delete" }, "AD") : null,
          x.internal ? h("span", { class: "tag", title: "internal" }, "I") : null] },
        { label: "Arguments", cell: (x) => h("code", {}, json(x.arguments)) },
        { label: "In", num: true, key: "rate_in", cell: (x) => rate(x.rates.messages_in) },
        { label: "Out", num: true, key: "rate_out", cell: (x) => rate(x.rates.messages_out) },
        { label: "Messages in", num: true, key: "messages_in", cell: (x) => num((x.message_stats || {}).messages_in) },
        { label: "Actions", cell: (x) => x.name.startsWith("amq.") ? "" : h("button", {
          type: "button", class: "danger", "aria-label": `Delete exchange ${x.name}`,
          onclick: async (ev) => {
            const button = ev.currentTarget;
            if (!(await confirmAction(`Delete exchange ${x.name} and its bindings?`, "Delete"))) return button.focus();
            try { await api("/exchanges/" + seg(x.name), { method: "DELETE" }); load(); } catch (e) { error.textContent = errorText(e); }
          } }, "Delete") },
      ], exchanges, { caption: `${exchanges.length} exchanges` }));
      replace(bindingList, table([
        { label: "From exchange", cell: (b) => b.exchange },
        { label: "To", cell: (b) => b.queue !== undefined ? h("a", { href: "#/queue/" + encodeURIComponent(b.queue) }, "queue " + b.queue) : "exchange " + b.to_exchange },
        { label: "Routing key", cell: (b) => h("code", {}, b.routing_key) },
        { label: "Arguments", cell: (b) => h("code", {}, json(b.arguments)) },
        { label: "Actions", cell: (b) => h("button", {
          type: "button", "aria-label": `Unbind ${b.queue ?? b.to_exchange} from ${b.exchange} (${b.routing_key})`,
          onclick: async () => {
            try { await api("/bindings", { method: "DELETE", json: b }); load(); } catch (e) { error.textContent = errorText(e); }
          } }, "Unbind") },
      ], bindings, { caption: `${bindings.length} bindings`, empty: "No bindings (the default exchange reaches every queue by its name)." }));
    } catch (e) {
      error.textContent = "Cannot list exchanges: " + errorText(e);
    }
  }

  const el = h("div", {},
    h("h1", { tabindex: "-1" }, "Exchanges and bindings"),
    error, exchangeOptions,
    h("section", { "aria-labelledby": "h-exchanges" }, h("h2", { id: "h-exchanges" }, "Exchanges"), list),
    declareForm(load),
    h("section", { "aria-labelledby": "h-bindings" }, h("h2", { id: "h-bindings" }, "Bindings"), bindingList),
    bindForm(load),
    publishForm());
  load();
  // A refresh would rebuild the tables under a keyboard user's focus: skip it then.
  const stop = every(REFRESH_S, () => { if (!list.contains(document.activeElement) && !bindingList.contains(document.activeElement)) load(); });
  return { el, stop };
}

function declareForm(after) {
  const name = h("input", { name: "name", required: true, autocomplete: "off" });
  const type = h("select", { name: "type" }, TYPES.map((t) => h("option", { value: t }, t)));
  const durable = h("input", { type: "checkbox", name: "durable", checked: true });
  const args = h("textarea", { name: "arguments", rows: "2", placeholder: '{"alternate-exchange": "unrouted"}' });
  const status = statusLine();
  const form = h("form", { class: "panel", id: "declare-exchange", "aria-labelledby": "h-declare-exchange" },
    h("h2", { id: "h-declare-exchange" }, "Declare an exchange"),
    h("div", { class: "row" }, field("Name", name), field("Type", type), field("Durable", durable)),
    field("Arguments (JSON)", args),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Declare exchange")), status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const x = await api("/exchanges/" + seg(name.value), { method: "PUT", json: { type: type.value, durable: durable.checked, arguments: parseJsonField(args.value, "Arguments") } });
      status.ok(`Exchange ${x.name} declared.`);
      after();
    } catch (e) { status.fail(e); }
  });
  return form;
}

function bindForm(after) {
  const exchange = h("input", { name: "exchange", required: true, list: "exchange-names", autocomplete: "off" });
  const kind = h("select", { name: "kind" }, h("option", { value: "queue" }, "queue"), h("option", { value: "to_exchange" }, "exchange"));
  const dest = h("input", { name: "destination", required: true, autocomplete: "off" });
  const key = h("input", { name: "routing_key", autocomplete: "off" });
  const args = h("textarea", { name: "arguments", rows: "2", placeholder: '{"x-match": "all"}' });
  const status = statusLine();
  const form = h("form", { class: "panel", id: "bind-form", "aria-labelledby": "h-bind" },
    h("h2", { id: "h-bind" }, "Bind"),
    h("div", { class: "row" }, field("From exchange", exchange), field("To a", kind), field("Named", dest), field("Routing key", key)),
    field("Arguments (JSON, headers exchanges)", args),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Bind")), status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const body = { exchange: exchange.value, routing_key: key.value, arguments: parseJsonField(args.value, "Arguments") };
      body[kind.value] = dest.value;
      const r = await api("/bindings", { method: "POST", json: body });
      status.ok(r.created ? "Bound." : "That binding already existed.");
      after();
    } catch (e) { status.fail(e); }
  });
  return form;
}

function publishForm() {
  const exchange = h("input", { name: "exchange", list: "exchange-names", value: "amq.default", autocomplete: "off" });
  const key = h("input", { name: "routing_key", autocomplete: "off" });
  const body = h("textarea", { name: "body", rows: "3" });
  const contentType = h("input", { name: "content_type", value: "text/plain" });
  const messageId = h("input", { name: "message_id", autocomplete: "off" });
  const correlation = h("input", { name: "correlation_id", autocomplete: "off" });
  const priority = h("input", { type: "number", name: "priority", min: "0", max: "255" });
  const expiration = h("input", { type: "number", name: "expiration", min: "0" });
  const persistent = h("input", { type: "checkbox", name: "persistent", checked: true });
  const mandatory = h("input", { type: "checkbox", name: "mandatory", checked: true });
  const headers = h("textarea", { name: "headers", rows: "2", placeholder: '{"tenant": "acme"}' });
  const status = statusLine();
  const form = h("form", { class: "panel", id: "publish-exchange", "aria-labelledby": "h-publish-x" },
    h("h2", { id: "h-publish-x" }, "Publish a message"),
    h("div", { class: "row" }, field("Exchange", exchange), field("Routing key", key)),
    field("Body", body),
    h("div", { class: "row" },
      field("Content type", contentType), field("Message id", messageId), field("Correlation id", correlation),
      field("Priority", priority), field("Expiration (ms)", expiration)),
    field("Headers (JSON object)", headers),
    h("div", { class: "row" }, field("Persistent", persistent), field("Mandatory (refuse when unroutable)", mandatory)),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Publish")), status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const hdrs = { "Content-Type": contentType.value || "application/octet-stream", "X-Delivery-Mode": persistent.checked ? "2" : "1" };
      if (messageId.value) hdrs["X-Message-Id"] = messageId.value;
      if (correlation.value) hdrs["X-Correlation-Id"] = correlation.value;
      if (priority.value) hdrs["X-Priority"] = priority.value;
      if (expiration.value) hdrs["X-Expiration"] = expiration.value;
      for (const [k, v] of Object.entries(parseJsonField(headers.value, "Headers"))) hdrs["X-Header-" + k] = typeof v === "string" ? v : JSON.stringify(v);
      const r = await api("/exchanges/" + seg(exchange.value) + "/publish", {
        method: "POST", query: { routing_key: key.value, mandatory: mandatory.checked ? "true" : "false" }, body: body.value, headers: hdrs,
      });
      status.ok(`Confirm: ${r.confirm}; routed to ${r.routed} queue(s).`);
    } catch (e) {
      status.fail(e.code === "no_route" ? { message: `Unroutable: ${e.message} (confirm: ${e.body.confirm})` } : e);
    }
  });
  return form;
}
