// The overview: live charts of message rates and queued totals over the last ten
// minutes, the health of memory, disk and file descriptors (with the memory and disk
// alarms), storage (WAL, fsync, checkpoint) state, counts, version and uptime.
// startSampler() first reads the broker's own history (GET /overview/history: a
// sample every 5 s for ten minutes), so the charts do not start empty, then polls
// GET /overview every SAMPLE_S seconds whatever page is open.

import { api } from "./api.js";
import { LineChart } from "./chart.js";
import { h, replace, num, bytes, duration, when, errorText, every, historyPoints } from "./util.js";

export const SAMPLE_S = 2;
const WINDOW_S = 600;
const RATE_KEYS = ["published", "delivered", "acked", "confirmed", "nacked"];

const samples = []; // { t, rates: {...}, ready, unacked }
let latest = null;
let lastError = null;
let prev = null;
const listeners = new Set();

async function sample() {
  try {
    const o = await api("/overview");
    const t = performance.now() / 1000;
    const rates = {};
    for (const k of RATE_KEYS) {
      rates[k] = prev && t > prev.t ? Math.max(0, ((o.stats[k] || 0) - (prev.stats[k] || 0)) / (t - prev.t)) : null;
    }
    prev = { t, stats: o.stats };
    samples.push({ t, rates, ready: o.totals.messages_ready, unacked: o.totals.messages_unacked });
    while (samples.length && samples[0].t < t - WINDOW_S - SAMPLE_S) samples.shift();
    latest = o;
    lastError = null;
  } catch (e) {
    lastError = e;
  }
  for (const f of listeners) f();
}

// The broker's history before this page opened: rates from consecutive samples.
async function loadHistory() {
  try {
    const points = historyPoints(await api("/overview/history"));
    const before = [];
    let last = null;
    for (const { t, sample: s } of points) {
      const rates = {};
      for (const k of RATE_KEYS) rates[k] = last && t > last.t ? Math.max(0, (s[k] - last.s[k]) / (t - last.t)) : null;
      before.push({ t, rates, ready: s.messages_ready, unacked: s.messages_unacked });
      last = { t, s };
    }
    const first = samples.length ? samples[0].t : Infinity;
    samples.unshift(...before.filter((p) => p.t < first));
  } catch (e) {
    // an older broker without history: the charts fill as the page samples
  }
}

let started = false;
export function startSampler() {
  if (started) return;
  started = true;
  loadHistory().then(sample);
  every(SAMPLE_S, sample);
}

function card(label, value, key) {
  return h("div", {}, h("dt", {}, label), h("dd", { "data-key": key || null }, value));
}

function share(used, of) {
  return used !== null && used !== undefined && of ? ` (${Math.round(100 * used / of)} %)` : "";
}

// Memory against its high watermark, free disk, open file descriptors, and the
// alarm that blocks publishers (docs/operations.md, "Memory and disk alarms").
function showHealth(o, health, alarm) {
  const mem = o.memory, disk = o.disk, fds = o.file_descriptors, flow = o.flow;
  if (!mem) return; // an older broker
  const blocked = flow && flow.blocked;
  alarm.className = blocked ? "status alarm error" : "status alarm";
  alarm.textContent = blocked ? `Publishing is blocked: ${flow.reason}` : "";
  replace(health,
    card("Memory / high watermark", bytes(mem.used_bytes) + " / " + (mem.high_watermark_bytes ? bytes(mem.high_watermark_bytes) + share(mem.used_bytes, mem.high_watermark_bytes) : "none"), "memory"),
    card("Memory alarm", mem.alarm ? "RAISED" : "ok", "memory_alarm"),
    card("Memory limit", mem.limit_bytes ? `${bytes(mem.limit_bytes)} (${mem.limit_from})` : "unknown", "memory_limit"),
    card("Disk free", disk.free_bytes === null ? "memory only" : bytes(disk.free_bytes) + " of " + bytes(disk.total_bytes), "disk_free"),
    card("Disk alarm", disk.alarm ? "RAISED" : "ok", "disk_alarm"),
    card("File descriptors", num(fds.open) + (fds.limit ? " of " + num(fds.limit) + share(fds.open, fds.limit) : ""), "fds"),
  );
  for (const key of ["memory_alarm", "disk_alarm"]) {
    const dd = health.querySelector(`[data-key=${key}]`);
    if (dd && dd.textContent === "RAISED") dd.className = "bad";
  }
}

export function overviewPage() {
  const rateChart = new LineChart("Message rates (per second)", [
    { key: "published", label: "publish" },
    { key: "delivered", label: "deliver" },
    { key: "acked", label: "ack" },
    { key: "confirmed", label: "confirm" },
    { key: "nacked", label: "nack" },
  ], { windowS: WINDOW_S });
  const depthChart = new LineChart("Queued messages", [
    { key: "ready", label: "ready" },
    { key: "unacked", label: "unacked" },
  ], { windowS: WINDOW_S });
  const summary = h("dl", { class: "cards", id: "summary" });
  const storage = h("dl", { class: "cards", id: "storage" });
  const health = h("dl", { class: "cards", id: "health" });
  const alarm = h("p", { class: "status alarm", id: "alarm", role: "status" });
  const error = h("p", { class: "status error", role: "alert" });
  const el = h("div", {},
    h("h1", { tabindex: "-1" }, "Overview"),
    error,
    alarm,
    h("section", { "aria-labelledby": "h-summary" }, h("h2", { id: "h-summary" }, "Broker"), summary),
    h("section", { "aria-labelledby": "h-health" }, h("h2", { id: "h-health" }, "Memory, disk and file descriptors"), health),
    h("section", { "aria-labelledby": "h-charts" }, h("h2", { id: "h-charts" }, "Activity"),
      h("div", { class: "charts" }, rateChart.el, depthChart.el)),
    h("section", { "aria-labelledby": "h-storage" }, h("h2", { id: "h-storage" }, "Write-ahead log and checkpoints"), storage),
  );

  function update() {
    error.textContent = lastError ? "Cannot reach the broker: " + errorText(lastError) : "";
    rateChart.draw(samples.map((p) => ({ t: p.t, values: p.rates })));
    depthChart.draw(samples.map((p) => ({ t: p.t, values: { ready: p.ready, unacked: p.unacked } })));
    const o = latest;
    if (!o) return;
    const t = o.totals;
    replace(summary,
      card("Version", o.version, "version"),
      card("Uptime", duration(o.uptime_s), "uptime"),
      card("Queues", num(t.queues), "queues"),
      card("Exchanges", num(t.exchanges), "exchanges"),
      card("Channels", num(t.channels), "channels"),
      card("Consumers", num(t.consumers), "consumers"),
      card("Ready", num(t.messages_ready), "messages_ready"),
      card("Unacked", num(t.messages_unacked), "messages_unacked"),
    );
    showHealth(o, health, alarm);
    const st = o.storage;
    if (!st.enabled) {
      replace(storage, card("Storage", "memory only (no data directory)", "storage"));
      return;
    }
    replace(storage,
      card("State", st.ok ? "ok" : "failing", "storage_ok"),
      card("WAL written", bytes(st.wal_bytes_written), "wal_bytes"),
      card("Segments", num(st.wal_segments), "wal_segments"),
      card("fsyncs", num(st.wal_fsyncs), "wal_fsyncs"),
      card("Last fsync", duration(st.last_fsync_s), "last_fsync"),
      card("Durable LSN", num(st.durable_lsn) + " / " + num(st.last_lsn), "durable_lsn"),
      card("Checkpoints", num(st.checkpoints), "checkpoints"),
      card("Last checkpoint", st.last_checkpoint_at ? when(st.last_checkpoint_at) + " (LSN " + num(st.last_checkpoint_lsn) + ", " + duration(st.last_checkpoint_duration_s) + ")" : "none since start", "last_checkpoint"),
      card("Paged out", num(st.messages_paged_out), "paged_out"),
      card("fsync mode", st.fsync, "fsync_mode"),
    );
  }
  listeners.add(update);
  update();
  return { el, stop: () => listeners.delete(update) };
}
