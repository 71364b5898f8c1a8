// The management UI's entry point: the login and confirmation dialogs, the hash
// router (#/queues, #/queue/<name>, ...), and the overview sampler that keeps the
// last minutes of rates in memory whatever page is open.

import { api, onLoginNeeded, loggedIn, logout, basicAuth, bearerAuth, exists, askAgain } from "./api.js";
import { h, replace, errorText } from "./util.js";
import { overviewPage, startSampler } from "./overview.js";
import { queuesPage } from "./queues.js";
import { queuePage } from "./queue.js";
import { exchangesPage } from "./exchanges.js";
import { connectionsPage } from "./connections.js";
import { listPage } from "./lists.js";
import { usersPage } from "./users.js";
import { clusterPage } from "./cluster.js";

const main = document.getElementById("main");

// --- dialogs -----------------------------------------------------------------

onLoginNeeded((reason) => new Promise((resolve) => {
  const dialog = document.getElementById("login");
  const form = document.getElementById("login-form");
  document.getElementById("login-reason").textContent = reason;
  form.reset();
  dialog.addEventListener("close", () => {
    document.getElementById("login-button").hidden = dialog.returnValue === "login";
    if (dialog.returnValue !== "login") return resolve(null);
    const data = new FormData(form);
    const token = String(data.get("token") || "");
    const user = String(data.get("user") || "");
    document.getElementById("logout").hidden = false;
    resolve(token ? bearerAuth(token) : user ? basicAuth(user, String(data.get("password") || "")) : null);
  }, { once: true });
  dialog.showModal();
}));

document.getElementById("login-button").addEventListener("click", () => {
  askAgain();
  render();
});

document.getElementById("logout").addEventListener("click", () => {
  logout();
  location.reload();
});

// --- routing -------------------------------------------------------------------

const routes = [
  [/^#?\/?$/, () => overviewPage()],
  [/^#\/queues$/, () => queuesPage()],
  [/^#\/queue\/(.+)$/, (m) => queuePage(decodeURIComponent(m[1]))],
  [/^#\/exchanges$/, () => exchangesPage()],
  [/^#\/connections$/, () => connectionsPage()],
  [/^#\/locks$/, () => listPage("Locks", "/locks")],
  [/^#\/schedules$/, () => listPage("Schedules", "/schedules")],
  [/^#\/users$/, () => usersPage()],
  [/^#\/cluster$/, () => clusterPage()],
];

let cleanup = null;

function render() {
  if (cleanup) { cleanup(); cleanup = null; }
  const hash = location.hash.split("?")[0];
  for (const a of document.querySelectorAll("#nav a")) {
    const target = a.getAttribute("href");
    const current = target === "#/" ? hash === "" || hash === "#/" : hash === target || hash.startsWith(target.replace(/s$/, "/"));
    if (current) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  for (const [re, page] of routes) {
    const m = hash.match(re);
    if (m) {
      const view = page(m);
      replace(main, view.el);
      cleanup = view.stop || null;
      const title = main.querySelector("h1");
      document.title = (title ? title.textContent + " · " : "") + "ackbus";
      return;
    }
  }
  replace(main, h("h1", {}, "Not found"), h("p", {}, "No such page. ", h("a", { href: "#/" }, "Back to the overview")));
}

window.addEventListener("hashchange", () => { render(); main.focus(); });

async function start() {
  if (loggedIn()) document.getElementById("logout").hidden = false;
  render();
  startSampler();
  try {
    const o = await api("/overview");
    document.getElementById("server").textContent = `v${o.version}`;
  } catch (e) {
    document.getElementById("server").textContent = errorText(e);
  }
  // Who is logged in, on a broker with users (GET /whoami answers).
  api("/whoami").then((me) => {
    if (me && me.name) document.getElementById("server").textContent += ` · ${me.name}`;
  }, () => {});
  // Sections for what this broker has (locks, schedules, users): shown when the
  // API answers, hidden on a 404.
  for (const li of document.querySelectorAll("#nav [data-feature]")) {
    exists(li.dataset.feature).then((yes) => { li.hidden = !yes; });
  }
  // The Cluster section only for a node of a cluster (a single node answers
  // GET /cluster with {"enabled": false}).
  api("/cluster").then((c) => { document.getElementById("nav-cluster").hidden = !(c && c.enabled); }, () => {});
}

start();
