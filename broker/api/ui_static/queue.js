// One queue: its numbers and depth chart (polled every two seconds), bindings,
// consumers, and the operator's tools: publish a test message, get and ack/nack,
// browse without consuming (delivery count, x-death), redrive a dead-letter queue,
// purge and delete (both confirmed first).

import { api, seg } from "./api.js";
import { LineChart } from "./chart.js";
import { confirmAction } from "./dialogs.js";
import { flags } from "./queues.js";
import { h, replace, num, json, when, field, statusLine, table, errorText, every, historyPoints } from "./util.js";

const POLL_S = 2;
const WINDOW_S = 600;

function bodyText(m) {
  if (m.body !== undefined) return m.body;
  if (m.body_b64 !== undefined) return `(binary, base64) ${m.body_b64}`;
  return "(body not readable)";
}

// x-death, newest first: "rejected ×2 in jobs (exchange orders, keys jobs) at ..."
function deaths(list) {
  return h("ul", { class: "deaths" }, list.map((d) => h("li", {},
    h("strong", {}, d.reason), d.count > 1 ? ` ×${d.count}` : "", ` in ${d.queue}`,
    ` (exchange ${d.exchange === "" ? "(default)" : d.exchange}`,
    d["routing-keys"] ? `, key ${d["routing-keys"].join(", ")}` : "", ")",
    d.time ? ` at ${when(d.time)}` : "")));
}

function messageView(m, extra) {
  const props = m.properties || {};
  const rows = [
    ["seq", m.seq], ["state", m.state], ["delivery count", m.delivery_count],
    ["redelivered", m.redelivered], ["exchange", m.exchange === "" ? "(default)" : m.exchange],
    ["routing key", m.routing_key], ["enqueued", m.enqueued_at ? when(m.enqueued_at) : null],
    ["due", m.due_at ? when(m.due_at) : null], ["lease", m.lease_id],
  ];
  for (const [k, v] of Object.entries(props)) {
    if (k === "headers" && v && v["x-death"]) {
      // x-death is shown on its own, readably; the other headers as JSON
      const { "x-death": _, ...rest } = v;
      if (Object.keys(rest).length) rows.push([k, JSON.stringify(rest)]);
      continue;
    }
    rows.push([k, typeof v === "object" ? JSON.stringify(v) : v]);
  }
  if (m.x_death) rows.push(["x-death", deaths(m.x_death)]);
  return h("article", { class: "message", "aria-label": `message ${m.seq ?? m.lease_id ?? ""}` },
    h("dl", {}, rows.filter(([, v]) => v !== undefined && v !== null).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v instanceof Node ? v : String(v))])),
    h("pre", { class: "body" }, bodyText(m)),
    extra || null);
}

export function queuePage(name) {
  const path = "/queues/" + seg(name);
  const cards = h("dl", { class: "cards", id: "queue-stats" });
  const info = h("div", {});
  const error = h("p", { class: "status error", role: "alert" });
  const chart = new LineChart("Queue depth", [
    { key: "ready", label: "ready" }, { key: "unacked", label: "unacked" }, { key: "delayed", label: "delayed" },
  ], { windowS: WINDOW_S });
  const points = [];
  // What the broker kept of this queue before the page opened (a sample every 5 s).
  api(path + "/history").then((history) => {
    const first = points.length ? points[0].t : Infinity;
    points.unshift(...historyPoints(history).filter((p) => p.t < first).map(({ t, sample: x }) => (
      { t, values: { ready: x.messages_ready, unacked: x.messages_unacked, delayed: x.messages_delayed } })));
    chart.draw(points);
  }, () => {});
  const bindings = h("div", { id: "queue-bindings" });
  const consumers = h("div", { id: "queue-consumers" });

  async function refresh() {
    try {
      const q = await api(path);
      error.textContent = "";
      points.push({ t: performance.now() / 1000, values: { ready: q.messages_ready, unacked: q.messages_unacked, delayed: q.messages_delayed } });
      while (points.length > WINDOW_S / POLL_S + 2) points.shift();
      chart.draw(points);
      replace(cards,
        h("div", {}, h("dt", {}, "Ready"), h("dd", { id: "depth-ready" }, num(q.messages_ready))),
        h("div", {}, h("dt", {}, "Unacked"), h("dd", { id: "depth-unacked" }, num(q.messages_unacked))),
        h("div", {}, h("dt", {}, "Delayed"), h("dd", {}, num(q.messages_delayed))),
        h("div", {}, h("dt", {}, "Consumers"), h("dd", {}, num(q.consumers))),
        h("div", { title: "messages that entered the queue: publishes and dead letters" }, h("dt", {}, "Arrived"), h("dd", { id: "arrived" }, num(q.message_stats.published))),
        h("div", {}, h("dt", {}, "Delivered"), h("dd", {}, num(q.message_stats.delivered))),
        h("div", {}, h("dt", {}, "Acked"), h("dd", {}, num(q.message_stats.acked))),
        h("div", {}, h("dt", {}, "Redelivered"), h("dd", {}, num(q.message_stats.redelivered))));
      const args = Object.entries(q.arguments || {});
      replace(info, h("p", { id: "queue-features" }, flags(q)),
        args.length ? h("dl", { class: "args", id: "queue-arguments", "aria-label": "Arguments" },
          args.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, h("code", {}, JSON.stringify(v)))))) : null,
        Object.keys(q.message_stats.dead_lettered || {}).length ? h("p", {}, "Dead-lettered from here: ",
          Object.entries(q.message_stats.dead_lettered).map(([why, n]) => `${why} ${num(n)}`).join(", ")) : null);
    } catch (e) {
      error.textContent = e.status === 404 ? `There is no queue ${name} (deleted?).` : "Cannot read the queue: " + errorText(e);
    }
  }

  async function refreshLists() {
    try {
      const all = (await api("/bindings")).bindings.filter((b) => b.queue === name);
      replace(bindings, table([
        { label: "From exchange", cell: (b) => b.exchange === "" ? "(default)" : b.exchange },
        { label: "Routing key", cell: (b) => h("code", {}, b.routing_key) },
        { label: "Arguments", cell: (b) => h("code", {}, json(b.arguments)) },
      ], all, { caption: "Bindings to this queue", empty: "Only the default exchange's binding (routing key = the queue's name)." }));
      const chans = (await api("/channels")).channels;
      const rows = [];
      for (const c of chans) for (const k of c.consumers) if (k.queue === name) rows.push({ ...k, channel: c });
      replace(consumers, table([
        { label: "Consumer tag", cell: (k) => k.consumer_tag },
        { label: "Channel", cell: (k) => `${k.channel.id} (${k.channel.kind})` },
        { label: "Client", cell: (k) => k.channel.remote || "–" },
        { label: "Prefetch", num: true, cell: (k) => k.prefetch || "none" },
        { label: "Unacked", num: true, cell: (k) => num(k.unacked) },
        { label: "Ack", cell: (k) => (k.no_ack ? "auto (no-ack)" : "manual") },
      ], rows, { caption: "Consumers of this queue", empty: "No consumers." }));
    } catch (e) {
      replace(bindings, h("p", { class: "status error" }, errorText(e)));
    }
  }

  const el = h("div", {},
    h("p", {}, h("a", { href: "#/queues" }, "← Queues")),
    h("h1", { tabindex: "-1" }, "Queue ", h("span", { id: "queue-name" }, name)),
    error, info,
    h("section", { "aria-labelledby": "h-depth" }, h("h2", { id: "h-depth", class: "visually-hidden" }, "Depth"), cards, h("div", { class: "charts" }, chart.el)),
    h("section", { "aria-labelledby": "h-bindings" }, h("h2", { id: "h-bindings" }, "Bindings"), bindings),
    h("section", { "aria-labelledby": "h-consumers" }, h("h2", { id: "h-consumers" }, "Consumers"), consumers),
    publishForm(name, refresh),
    getForm(path, refresh),
    browseSection(path),
    redriveForm(path, refresh),
    dangerSection(name, path, refresh));

  refresh();
  refreshLists();
  const stops = [every(POLL_S, refresh), every(5, refreshLists)];
  return { el, stop: () => stops.forEach((stop) => stop()) };
}

function publishForm(queue, after) {
  const body = h("textarea", { name: "body", rows: "3" }, "hello");
  const contentType = h("input", { name: "content_type", value: "text/plain" });
  const persistent = h("input", { type: "checkbox", name: "persistent", checked: true });
  const status = statusLine();
  const form = h("form", { class: "panel", id: "publish-form", "aria-labelledby": "h-publish" },
    h("h2", { id: "h-publish" }, "Publish a test message"),
    h("p", { class: "hint" }, "Through the default exchange, with this queue's name as the routing key."),
    field("Body", body),
    h("div", { class: "row" }, field("Content type", contentType), field("Persistent", persistent)),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Publish")),
    status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const r = await api("/exchanges/amq.default/publish", {
        method: "POST", query: { routing_key: queue, mandatory: "true" }, body: body.value,
        headers: { "Content-Type": contentType.value || "application/octet-stream", "X-Delivery-Mode": persistent.checked ? "2" : "1" },
      });
      status.ok(`Published: confirm ${r.confirm}, routed to ${r.routed} queue(s).`);
      after();
    } catch (e) {
      status.fail(e);
    }
  });
  return form;
}

function getForm(path, after) {
  const max = h("input", { type: "number", name: "max", min: "1", max: "100", value: "1" });
  const lease = h("input", { type: "number", name: "lease", min: "1", value: "60" });
  const out = h("div", { id: "got-messages" });
  const status = statusLine();
  const form = h("form", { class: "panel", id: "get-form", "aria-labelledby": "h-get" },
    h("h2", { id: "h-get" }, "Get messages"),
    h("p", { class: "hint" }, "Takes messages on a lease: ack removes one, nack puts it back (or drops it, dead-lettered when the queue has a dead-letter exchange). An unsettled lease returns the message when it runs out."),
    h("div", { class: "row" }, field("How many", max), field("Lease (s)", lease)),
    h("div", { class: "buttons" }, h("button", { type: "submit" }, "Get")),
    status, out);

  async function settle(m, how, requeue, box) {
    try {
      const json = { lease_ids: [m.lease_id] };
      if (how === "nack") json.requeue = requeue;
      await api(`${path}/${how}`, { method: "POST", json });
      replace(box, h("p", { class: "status ok", role: "status" }, how === "ack" ? "Acked." : requeue ? "Returned to the queue." : "Rejected."));
      after();
    } catch (e) {
      box.appendChild(h("p", { class: "status error", role: "alert" }, errorText(e)));
    }
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const r = await api(`${path}/get`, { method: "POST", query: { max: max.value, wait: 0, lease: lease.value } });
      const messages = r.messages || [];
      status.ok(messages.length ? `Got ${messages.length} message(s).` : "The queue has no ready message.");
      replace(out, messages.map((m) => {
        const box = h("div", { class: "buttons" });
        replace(box,
          h("button", { type: "button", onclick: () => settle(m, "ack", false, box) }, "Ack"),
          h("button", { type: "button", onclick: () => settle(m, "nack", true, box) }, "Nack, requeue"),
          h("button", { type: "button", onclick: () => settle(m, "nack", false, box) }, "Reject (no requeue)"));
        return messageView(m, box);
      }));
      after();
    } catch (e) {
      status.fail(e);
    }
  });
  return form;
}

function browseSection(path) {
  const limit = h("input", { type: "number", name: "limit", min: "1", max: "1000", value: "20" });
  const out = h("div", { id: "browsed", "aria-live": "polite" });
  const status = statusLine();
  let after = 0;
  const more = h("button", { type: "button", hidden: true }, "More");
  const form = h("form", { class: "panel", id: "browse-form", "aria-labelledby": "h-browse" },
    h("h2", { id: "h-browse" }, "Browse messages"),
    h("p", { class: "hint" }, "Looks at the queue without consuming: nothing is delivered, counted or moved."),
    h("div", { class: "row" }, field("How many", limit)),
    h("div", { class: "buttons" }, h("button", { type: "submit" }, "Browse"), more),
    status, out);

  async function load(fresh) {
    try {
      if (fresh) { after = 0; out.replaceChildren(); }
      const r = await api(`${path}/messages`, { query: { limit: limit.value, after } });
      for (const m of r.messages) out.appendChild(messageView(m));
      after = r.next_after;
      more.hidden = r.messages.length < Number(limit.value);
      status.ok(out.children.length ? `Showing ${out.children.length} message(s).` : "The queue is empty.");
    } catch (e) {
      status.fail(e);
    }
  }
  form.addEventListener("submit", (ev) => { ev.preventDefault(); load(true); });
  more.addEventListener("click", () => load(false));
  return form;
}

function redriveForm(path, after) {
  const count = h("input", { type: "number", name: "count", min: "1", value: "100" });
  const exchange = h("input", { name: "exchange", autocomplete: "off" });
  const key = h("input", { name: "routing_key", autocomplete: "off" });
  const status = statusLine();
  const form = h("form", { class: "panel", id: "redrive-form", "aria-labelledby": "h-redrive" },
    h("h2", { id: "h-redrive" }, "Redrive dead letters"),
    h("p", { class: "hint" }, "Moves messages of a dead-letter queue back where they died (their x-death), or to the exchange given here."),
    h("div", { class: "row" }, field("How many", count), field("To exchange (optional)", exchange), field("Routing key (optional)", key)),
    h("div", { class: "buttons" }, h("button", { type: "submit" }, "Redrive")),
    status);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const json = { count: Number(count.value) };
    if (exchange.value) json.exchange = exchange.value;
    if (key.value) json.routing_key = key.value;
    try {
      const r = await api(`${path}/redrive`, { method: "POST", json });
      status.ok(`Moved ${r.moved} message(s).` + (r.stopped ? ` Stopped: ${r.stopped}` : ""));
      after();
    } catch (e) {
      status.fail(e);
    }
  });
  return form;
}

function dangerSection(name, path, after) {
  const status = statusLine();
  const purge = h("button", { type: "button", class: "danger", id: "purge" }, "Purge");
  const del = h("button", { type: "button", class: "danger", id: "delete-queue" }, "Delete queue");
  purge.addEventListener("click", async () => {
    if (!(await confirmAction(`Purge queue ${name}? Its ready messages are deleted.`, "Purge"))) return purge.focus();
    try {
      const r = await api(`${path}/purge`, { method: "POST" });
      status.ok(`Purged ${r.purged} message(s).`);
      after();
    } catch (e) {
      status.fail(e);
    }
    purge.focus();
  });
  del.addEventListener("click", async () => {
    if (!(await confirmAction(`Delete queue ${name} and every message in it?`, "Delete"))) return del.focus();
    try {
      await api(path, { method: "DELETE" });
      location.hash = "#/queues";
    } catch (e) {
      status.fail(e);
      del.focus();
    }
  });
  return h("section", { class: "panel", "aria-labelledby": "h-danger" },
    h("h2", { id: "h-danger" }, "Purge or delete"),
    h("div", { class: "buttons" }, purge, del), status);
}
