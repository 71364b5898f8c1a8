// Users, permissions and API tokens (an administrator's page; docs/security.md):
// the list of users with their tags and permissions, a form to add a user or change
// its password and tags (PUT /users/{name}), one to set its permissions
// (PUT /users/{name}/permissions), deleting a user (confirmed), and a user's tokens:
// list, make one (its secret shown once), revoke (DELETE /tokens/{id}).

import { api } from "./api.js";
import { confirmAction } from "./dialogs.js";
import { h, replace, when, field, statusLine, table, errorText } from "./util.js";

const enc = encodeURIComponent;

function tagsOf(text) {
  return text.split(/[\s,]+/).map((t) => t.trim()).filter(Boolean);
}

// A permission pattern; "" matches nothing, and says so.
function pattern(p) {
  return p ? h("code", {}, p) : h("span", { class: "empty", title: "matches nothing" }, "none");
}

export function usersPage() {
  const list = h("div", { id: "user-list", "aria-live": "polite" });
  const error = h("p", { class: "status error", role: "alert" });
  const tokens = h("section", { id: "tokens", "aria-labelledby": "h-tokens" });
  const userForm = userFormOf(load);
  const permForm = permissionsFormOf(load);
  let users = [];

  async function load() {
    try {
      users = (await api("/users")).users;
      error.textContent = "";
    } catch (e) {
      error.textContent = e.status === 404 ? "This broker has no users API." : "Cannot list the users: " + errorText(e);
      return;
    }
    replace(list, table([
      { label: "Name", cell: (u) => u.name },
      { label: "Tags", cell: (u) => u.tags.map((t) => h("span", { class: "tag" }, t)) },
      { label: "Configure", cell: (u) => pattern(u.permissions.configure) },
      { label: "Write", cell: (u) => pattern(u.permissions.write) },
      { label: "Read", cell: (u) => pattern(u.permissions.read) },
      { label: "Password", cell: (u) => u.has_password ? "set" : "none" },
      { label: "Actions", cell: (u) => [
        h("button", { type: "button", "aria-label": `Edit user ${u.name}`, onclick: () => { userForm.edit(u); permForm.edit(u); } }, "Edit"), " ",
        h("button", { type: "button", "aria-label": `Tokens of ${u.name}`, onclick: () => showTokens(u.name) }, "Tokens"), " ",
        h("button", { type: "button", class: "danger", "aria-label": `Delete user ${u.name}`, onclick: async (ev) => {
          const button = ev.currentTarget;
          if (!(await confirmAction(`Delete user ${u.name} and its tokens? Its open channels end at once.`, "Delete"))) return button.focus();
          try { await api("/users/" + enc(u.name), { method: "DELETE" }); load(); replace(tokens); } catch (e) { error.textContent = errorText(e); }
        } }, "Delete"),
      ] },
    ], users, { caption: `${users.length} users`, empty: "No users: the broker serves loopback without credentials. Add one below (then log in as it)." }));
  }

  async function showTokens(name) {
    const out = h("div", { id: "token-list" });
    const status = statusLine();
    async function refresh() {
      try {
        const all = (await api(`/users/${enc(name)}/tokens`)).tokens;
        replace(out, table([
          { label: "Id", cell: (t) => h("code", {}, t.id) },
          { label: "Description", cell: (t) => t.description || "–" },
          { label: "Created", cell: (t) => when(t.created_s) },
          { label: "Expires", cell: (t) => t.expires_s ? when(t.expires_s) : "never" },
          { label: "Actions", cell: (t) => h("button", { type: "button", class: "danger", "aria-label": `Revoke token ${t.id}`, onclick: async (ev) => {
            const button = ev.currentTarget;
            if (!(await confirmAction(`Revoke token ${t.id} of ${name}?`, "Revoke"))) return button.focus();
            try { await api("/tokens/" + enc(t.id), { method: "DELETE" }); status.ok(`Token ${t.id} revoked.`); refresh(); } catch (e) { status.fail(e); }
          } }, "Revoke") },
        ], all, { caption: `Tokens of ${name}`, empty: `${name} has no tokens.` }));
      } catch (e) {
        status.fail(e);
      }
    }
    const description = h("input", { name: "description", maxlength: "255", autocomplete: "off" });
    const expires = h("input", { type: "number", name: "expires_in_s", min: "1" });
    const secret = h("p", { id: "token-secret", role: "status" });
    const form = h("form", { class: "panel", id: "token-form", "aria-labelledby": "h-token-form" },
      h("h3", { id: "h-token-form" }, `Make a token for ${name}`),
      h("div", { class: "row" }, field("Description", description), field("Expires in (seconds, empty: never)", expires)),
      h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Make token")), secret);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      try {
        const body = { description: description.value };
        if (expires.value) body.expires_in_s = Number(expires.value);
        const t = await api(`/users/${enc(name)}/tokens`, { method: "POST", json: body });
        replace(secret, "Token made; copy it now, it is not shown again: ", h("code", { id: "token-value" }, t.token));
        refresh();
      } catch (e) { replace(secret, errorText(e)); }
    });
    replace(tokens, h("h2", { id: "h-tokens" }, `API tokens of ${name}`), out, status, form);
    refresh();
    tokens.scrollIntoView({ block: "nearest" });
  }

  const el = h("div", {},
    h("h1", { tabindex: "-1" }, "Users"),
    error, list, userForm.el, permForm.el, tokens);
  load();
  return { el, stop: null };
}

function userFormOf(after) {
  const name = h("input", { name: "name", required: true, maxlength: "255", autocomplete: "off" });
  const password = h("input", { type: "password", name: "password", autocomplete: "new-password" });
  const tags = h("input", { name: "tags", autocomplete: "off", placeholder: "administrator" });
  const status = statusLine();
  const el = h("form", { class: "panel", id: "user-form", "aria-labelledby": "h-user-form" },
    h("h2", { id: "h-user-form" }, "Add a user, or change its password and tags"),
    h("div", { class: "row" },
      field("Name", name),
      field("Password", password, "Required for a new user; empty keeps the current one"),
      field("Tags", tags, "Comma-separated, e.g. administrator")),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Save user")), status);
  el.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const body = { tags: tagsOf(tags.value) };
      if (password.value) body.password = password.value;
      const u = await api("/users/" + enc(name.value), { method: "PUT", json: body });
      status.ok(`User ${u.name} saved.`);
      password.value = "";
      after();
    } catch (e) { status.fail(e); }
  });
  return {
    el,
    edit(u) { name.value = u.name; tags.value = u.tags.join(", "); password.value = ""; status.clear(); name.focus(); },
  };
}

function permissionsFormOf(after) {
  const user = h("input", { name: "user", required: true, autocomplete: "off" });
  const configure = h("input", { name: "configure", autocomplete: "off", placeholder: "^$" });
  const write = h("input", { name: "write", autocomplete: "off", placeholder: ".*" });
  const read = h("input", { name: "read", autocomplete: "off", placeholder: ".*" });
  const status = statusLine();
  const el = h("form", { class: "panel", id: "permissions-form", "aria-labelledby": "h-permissions-form" },
    h("h2", { id: "h-permissions-form" }, "Set a user's permissions"),
    h("div", { class: "row" },
      field("User", user),
      field("Configure", configure, "Regular expression over names; empty matches nothing"),
      field("Write", write),
      field("Read", read)),
    h("div", { class: "buttons" }, h("button", { type: "submit", class: "primary" }, "Set permissions")), status);
  el.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await api(`/users/${enc(user.value)}/permissions`, {
        method: "PUT", json: { configure: configure.value, write: write.value, read: read.value },
      });
      status.ok(`Permissions of ${user.value} set.`);
      after();
    } catch (e) { status.fail(e); }
  });
  return {
    el,
    edit(u) {
      user.value = u.name;
      configure.value = u.permissions.configure; write.value = u.permissions.write; read.value = u.permissions.read;
      status.clear();
    },
  };
}
