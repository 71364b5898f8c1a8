// The one way the UI talks to the broker: api(). Every call goes through it, so
// credentials are added in one place. The broker serves loopback without credentials
// while it has no users; once it answers 401, a login form asks for a user name and
// password (HTTP Basic) or an API token (Bearer), kept in sessionStorage for this tab
// only, and the call is retried. credentials: "omit" keeps the browser from ever
// attaching (or prompting for) Basic credentials of its own.

const KEY = "ackbus.authorization";

export class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.message || body.reason)) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error;
    this.body = body;
  }
}

let loginPending = null;
let loginHandler = null;

// The page registers the login form: a function returning a promise of the
// Authorization header value, or null when the user gives up.
export function onLoginNeeded(handler) { loginHandler = handler; }

export function loggedIn() { return sessionStorage.getItem(KEY) !== null; }

export function logout() { sessionStorage.removeItem(KEY); }

export function basicAuth(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return "Basic " + btoa(binary);
}

export function bearerAuth(token) { return "Bearer " + token; }

// Once the user cancels the form, calls fail with their 401 instead of asking again
// every few seconds, until askAgain() (the page's "Log in" button).
let declined = false;
export function askAgain() { declined = false; }

function login(reason) {
  if (declined) return Promise.resolve(null);
  if (!loginPending) {
    loginPending = (loginHandler ? loginHandler(reason) : Promise.resolve(null)).then((header) => {
      if (!header) declined = true;
      return header;
    }).finally(() => {
      loginPending = null;
    });
  }
  return loginPending;
}

// path: "/queues" etc.; opts: { method, query, json, body, headers, signal }.
// Answers the decoded JSON (or text); throws ApiError for a non-2xx answer.
export async function api(path, opts = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(opts.query || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  }
  for (let attempt = 0; ; attempt++) {
    const headers = new Headers(opts.headers || {});
    const auth = sessionStorage.getItem(KEY);
    if (auth) headers.set("Authorization", auth);
    let body = opts.body;
    if (opts.json !== undefined) {
      headers.set("Content-Type", "application/json");
      body = JSON.stringify(opts.json);
    }
    const response = await fetch(url, {
      method: opts.method || "GET", headers, body, credentials: "omit",
      cache: "no-store", signal: opts.signal,
    });
    const text = await response.text();
    let data = text;
    if ((response.headers.get("content-type") || "").includes("json") && text) {
      try { data = JSON.parse(text); } catch { data = text; }
    }
    if (response.status === 401 && attempt < 3) {
      const header = await login(auth ? "Those credentials were refused." : "The broker asks you to log in.");
      if (header) { sessionStorage.setItem(KEY, header); continue; }
    }
    if (!response.ok) throw new ApiError(response.status, typeof data === "object" ? data : { message: text });
    return data;
  }
}

// Whether an endpoint exists (a feature of this broker): anything but 404/405.
export async function exists(path) {
  try { await api(path); return true; } catch (e) { return e.status !== undefined && e.status !== 404 && e.status !== 405; }
}

// Paths name entities: amq.default for the default exchange, encoded segments.
export function seg(name) { return encodeURIComponent(name === "" ? "amq.default" : name); }
