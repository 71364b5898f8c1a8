// The cluster as this node sees it (GET /cluster, docs/cluster.md): its nodes (alive
// or not, since when, the queues each owns), etcd's endpoints and their health, the
// etcd revision this node's view has applied, and each replicated (quorum) queue's
// leader, followers, in-sync set, epoch and lags. A broker started without --etcd
// answers {"enabled": false}: the page says it is a single node (and the nav hides
// the section, app.js).

import { api } from "./api.js";
import { h, replace, num, when, table, errorText, every } from "./util.js";

const REFRESH_S = 3;

function yesNo(value, yes, no, unknown = "unknown") {
  if (value === null || value === undefined) return h("span", { class: "muted" }, unknown);
  return h("span", { class: value ? "ok" : "bad" }, value ? yes : no);
}

function queueLinks(names) {
  if (!names || !names.length) return "none";
  return names.map((q, i) => [i ? ", " : "", h("a", { href: "#/queue/" + encodeURIComponent(q) }, q)]);
}

function summary(c) {
  return h("dl", { class: "facts", id: "cluster-summary" },
    h("dt", {}, "Cluster"), h("dd", {}, c.cluster_name),
    h("dt", {}, "This node"), h("dd", {}, `${c.node} (${c.url})`),
    h("dt", {}, "View revision"), h("dd", { id: "cluster-revision" }, num(c.revision)),
    h("dt", {}, "Synced with etcd"), h("dd", {}, yesNo(c.synced, "yes", "not yet")),
    h("dt", {}, "Member (lease held)"), h("dd", {}, yesNo(c.member, "yes", "no")),
    h("dt", {}, "Lease TTL"), h("dd", {}, `${c.lease_ttl_s} s`),
    h("dt", {}, "Runs the schedules"), h("dd", {}, c.schedules_runner ? "yes" : "no"));
}

function nodesTable(c) {
  return table([
    { label: "Node", key: "name", cell: (n) => n.this_node ? h("strong", {}, n.name, " (this node)") : n.name },
    { label: "URL", key: "url", cell: (n) => n.url || "–" },
    { label: "Alive", key: "alive", cell: (n) => yesNo(n.alive, "alive", "down") },
    { label: "Since", key: "since", cell: (n) => when(n.since) },
    { label: "Queues owned", key: "queues", cell: (n) => queueLinks(n.queues) },
  ], c.nodes, { caption: `${c.nodes.length} node(s), ${c.nodes.filter((n) => n.alive).length} alive`, empty: "No nodes known." });
}

function etcdTable(c) {
  const e = c.etcd || { endpoints: [] };
  return [
    h("p", { id: "etcd-state", class: e.ok ? "status ok" : "status error" },
      e.ok ? "etcd answers: metadata changes are accepted." : `etcd is unreachable: ${e.error || "no answer"}. Metadata changes are refused until it answers again.`),
    table([
      { label: "Endpoint", key: "url", cell: (p) => p.url },
      { label: "Healthy", key: "healthy", cell: (p) => yesNo(p.healthy, "healthy", "failing", "not tried yet") },
      { label: "Last checked", key: "checked_at", cell: (p) => when(p.checked_at) },
      { label: "Error", key: "error", cell: (p) => p.error || "–" },
    ], e.endpoints, { caption: `${e.endpoints.length} etcd endpoint(s)` }),
  ];
}

function replicatedTable(c) {
  const rows = Object.entries(c.replicated_queues || {}).map(([name, r]) => ({ name, ...r }));
  const lag = (r) => {
    if (!r.lag) return "–";
    const parts = Object.entries(r.lag).map(([n, v]) => `${n}: ${num(v)}`);
    return parts.length ? parts.join(", ") : "–";
  };
  return table([
    { label: "Queue", key: "name", cell: (r) => h("a", { href: "#/queue/" + encodeURIComponent(r.name) }, r.name) },
    { label: "Leader", key: "leader", cell: (r) => r.leader || h("span", { class: "bad" }, "none") },
    { label: "Followers", key: "followers", cell: (r) => (r.followers || []).join(", ") || "–" },
    { label: "In sync", key: "in_sync", cell: (r) => (r.in_sync || []).join(", ") || "–" },
    { label: "Epoch", key: "epoch", num: true, cell: (r) => num(r.epoch) },
    { label: "Lag (entries)", key: "lag", cell: lag },
    { label: "Refusing", key: "refusing", cell: (r) => r.refusing ? h("span", { class: "bad" }, "no quorum") : "no" },
  ], rows, { caption: `${rows.length} replicated queue(s)`, empty: "No replicated (quorum) queues." });
}

export function clusterPage() {
  const out = h("div", { id: "cluster", "aria-live": "polite" });
  const error = h("p", { class: "status error", role: "alert" });

  async function load() {
    let c;
    try {
      c = await api("/cluster");
      error.textContent = "";
    } catch (e) {
      error.textContent = "Cannot read the cluster's state: " + errorText(e);
      return;
    }
    if (!c.enabled) {
      replace(out, h("p", { class: "empty", id: "single-node" },
        "Single node: this broker is not part of a cluster", c.reason ? ` (${c.reason})` : "", "."));
      return;
    }
    const errors = (c.apply_errors || []).length
      ? [h("h2", {}, "Changes this node refused"), h("ul", { id: "apply-errors" }, c.apply_errors.map((e) => h("li", {}, typeof e === "string" ? e : JSON.stringify(e))))]
      : null;
    replace(out,
      summary(c),
      h("h2", {}, "Nodes"), h("div", { id: "cluster-nodes" }, nodesTable(c)),
      h("h2", {}, "etcd"), h("div", { id: "cluster-etcd" }, etcdTable(c)),
      h("h2", {}, "Replicated queues"), h("div", { id: "cluster-replicated" }, replicatedTable(c)),
      errors);
  }

  load();
  const stop = every(REFRESH_S, () => { if (!out.contains(document.activeElement)) load(); });
  return { el: h("div", {}, h("h1", { tabindex: "-1" }, "Cluster"), error, out), stop };
}
