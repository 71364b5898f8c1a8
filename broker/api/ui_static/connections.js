// Who is connected: every open channel and streaming consumer (GET /channels), by
// client address, with consumers, unacked deliveries, prefetch and rates; close one
// (DELETE /channels/{id}: the client gets a closing event, its unacked deliveries
// go back to their queues).

import { api } from "./api.js";
import { confirmAction } from "./dialogs.js";
import { h, replace, num, rate, when, table, errorText, statusLine, Rates, every } from "./util.js";

const REFRESH_S = 3;
const rates = new Rates();

export function connectionsPage() {
  const list = h("div", { id: "channel-list" });
  const error = h("p", { class: "status error", role: "alert" });
  const status = statusLine();
  status.id = "close-status";

  async function load() {
    let chans;
    try {
      chans = (await api("/channels")).channels;
      error.textContent = "";
    } catch (e) {
      error.textContent = "Cannot list channels: " + errorText(e);
      return;
    }
    const t = performance.now() / 1000;
    for (const c of chans) c.rates = rates.update(c.id, { publishes: c.publishes, deliveries: c.deliveries }, t);
    chans.sort((a, b) => (a.remote || "").localeCompare(b.remote || "") || a.id - b.id);
    const clients = new Set(chans.map((c) => (c.remote || "").replace(/:\d+$/, "")));
    replace(list, table([
      { label: "Client", cell: (c) => c.connection_name ? `${c.remote || "–"} (${c.connection_name})` : c.remote || "–" },
      chans.some((c) => c.user_agent) ? { label: "Library", cell: (c) => c.user_agent || "–" } : null,
      chans.some((c) => c.user) ? { label: "User", cell: (c) => c.user || "–" } : null,
      { label: "Channel", cell: (c) => `${c.id} (${c.kind})` },
      { label: "Open since", cell: (c) => when(c.opened_at) },
      { label: "Consumers", cell: (c) => c.consumers.length ? c.consumers.map((k) => h("div", {}, `${k.consumer_tag} ← `, h("a", { href: "#/queue/" + encodeURIComponent(k.queue) }, k.queue))) : "none" },
      { label: "Unacked", num: true, cell: (c) => num(c.unacked) },
      { label: "Prefetch", num: true, cell: (c) => c.prefetch || c.default_prefetch || c.consumers.map((k) => k.prefetch).join(", ") || "none" },
      { label: "Publish", num: true, cell: (c) => rate(c.rates.publishes) },
      { label: "Deliver", num: true, cell: (c) => rate(c.rates.deliveries) },
      { label: "Actions", cell: (c) => h("button", {
        type: "button", class: "danger", "aria-label": `Close channel ${c.id} of ${c.remote || "unknown client"}`,
        onclick: async (ev) => {
          const button = ev.currentTarget;
          if (!(await confirmAction(`Close channel ${c.id} of ${c.remote || "an unknown client"}? Its unacked messages go back to their queues.`, "Close"))) return button.focus();
          try {
            await api("/channels/" + c.id, { method: "DELETE", json: { reason: "closed from the management UI" } });
            status.ok(`Channel ${c.id} closed.`);
          } catch (e) { status.fail(e); }
          load();
        } }, "Close") },
    ], chans, {
      caption: `${chans.length} channel(s) from ${clients.size} client address(es)`,
      empty: "No channels are open. (REST calls come and go and are not listed.)",
    }));
  }

  const el = h("div", {}, h("h1", { tabindex: "-1" }, "Connections and channels"), error, status, list);
  load();
  const stop = every(REFRESH_S, () => { if (!list.contains(document.activeElement)) load(); });
  return { el, stop };
}
