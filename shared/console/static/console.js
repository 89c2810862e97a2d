// The jobfence console: a client of /api/v1 like any other. Every page is built from API
// answers with DOM nodes and text nodes (dom.js: nothing a job carries is ever parsed as
// HTML), and refreshed every two seconds while the tab is visible — in place: only what
// changed is touched, so a selection, an open output block or a half-typed filter survive.
// Every cancel, retry and bulk action asks first, naming what it will touch.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 2000;
const state = { me: null, token: sessionStorage.getItem("jobfence-token"), timer: null,
                cursors: [], lastKey: null, selected: new Set(), revealed: {}, after: [],
                logs: {} };

// -- talking to the API ------------------------------------------------------------------

async function api(path, options = {}) {
  const headers = { "Accept": "application/json" };
  if (options.method === "POST") headers["Content-Type"] = "application/json";
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  const resp = await fetch(API + path, { method: options.method || "GET", headers,
    body: options.method === "POST" ? JSON.stringify(options.body || {}) : undefined,
    credentials: "same-origin" });
  let data = null;
  try { data = await resp.json(); } catch (e) { data = { error: resp.statusText }; }
  if (resp.status === 401) showLogin();
  if (!resp.ok) {
    const err = new Error((data && data.error) || resp.statusText);
    err.status = resp.status;
    throw err;
  }
  return data;
}

function post(path, body) { return api(path, { method: "POST", body }); }

// -- small pieces --------------------------------------------------------------------------

function table(headers, rows, attrs = {}) {
  return el("table", attrs, el("thead", {}, el("tr", {}, headers.map(h => el("th", {}, h)))),
            el("tbody", {}, rows));
}

function badge(status, title) {
  return el("span", { class: "badge s-" + status, title }, status.replace(/_/g, " "));
}

function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const secs = Math.round((Date.now() - d.getTime()) / 1000);
  const ago = secs < 0 ? "in " + human(-secs) : human(secs) + " ago";
  return el("time", { datetime: iso, title: d.toISOString() }, ago);
}

function human(secs) {
  if (secs < 90) return secs + "s";
  if (secs < 5400) return Math.round(secs / 60) + "m";
  if (secs < 172800) return Math.round(secs / 3600) + "h";
  return Math.round(secs / 86400) + "d";
}

function operator() { return state.me && state.me.may_operate; }

// A button of an operator's verb: hidden from readers; says how it went.
function button(label, action, attrs = {}) {
  return el("button", { ...attrs, hidden: !operator(), onclick: async (ev) => {
    const target = ev.currentTarget;
    target.disabled = true;
    try {
      const said = await action();
      if (said !== false) flash(typeof said === "string" ? said : label + ": done");
    } catch (e) { flash(label + ": " + e.message, true); }
    finally { target.disabled = false; refresh(true); }
  } }, label);
}

function flash(text, bad = false) {
  const f = document.getElementById("flash");
  f.textContent = text;
  f.className = bad ? "bad" : "good";
  f.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { f.hidden = true; }, 6000);
}

function plural(n, what) { return `${n.toLocaleString()} ${what}${n === 1 ? "" : "s"}`; }

function refusals(out) {
  const r = Object.entries(out.refused || {}).map(([k, v]) => `${k.replace(/_/g, " ")} ${v}`);
  return r.length ? ` (left as they were: ${r.join(", ")})` : "";
}

function routeParams() {
  const [, query = ""] = location.hash.split("?");
  return new URLSearchParams(query);
}

// -- jobs ----------------------------------------------------------------------------------

const VERB_STATUSES = { retry: ["failed", "cancelled"], cancel: ["waiting", "pending", "running"] };

function filtersOf(params) {
  const f = {};
  for (const k of ["status", "queue", "resource", "label", "parent"]) {
    if (params.get(k)) f[k] = params.get(k);
  }
  return f;
}

// Retry or cancel: the jobs ticked on this page, or every job the filters select (counted
// first by a dry run, so that the confirmation names the number).
async function bulk(verb, filters) {
  const done = verb === "retry" ? "retried" : "cancelled";
  let body;
  let what;
  if (state.selected.size) {
    body = { job_ids: Array.from(state.selected) };
    what = plural(body.job_ids.length, "selected job");
  } else {
    const statuses = filters.status ? [filters.status] : VERB_STATUSES[verb];
    body = { ...filters, status: statuses.filter(s => VERB_STATUSES[verb].includes(s)) };
    if (!body.status.length) throw new Error(`${verb} acts on ${VERB_STATUSES[verb].join(" or ")} jobs`);
    const dry = await post(`/jobs/${verb}`, { ...body, dry_run: true });
    if (!dry.matched) throw new Error("no job matches");
    body.limit = dry.matched;
    what = plural(dry.matched, "job") + " matching " + Object.entries({ ...filters,
      status: body.status.join(",") }).map(([k, v]) => `${k}=${v}`).join(", ");
  }
  const ok = await confirmAction({ title: `${verb[0].toUpperCase() + verb.slice(1)} ${what}?`,
    message: verb === "cancel" ? "Running commands are stopped within a second; a parent's "
      + "children are cancelled with it." : "Each runs again with a new attempt budget.",
    confirm: `${verb[0].toUpperCase() + verb.slice(1)} ${what.split(" matching")[0]}`,
    danger: verb === "cancel", reason: true });
  if (!ok) return false;
  const out = await post(`/jobs/${verb}`, { ...body, reason: ok.reason || "from the console" });
  state.selected.clear();
  return `${done} ${plural(out[done], "job")}${refusals(out)}`;
}

async function jobsPage() {
  const params = routeParams();
  const filters = filtersOf(params);
  const after = params.get("after");
  const page = await api("/jobs?" + new URLSearchParams(filters).toString()
                         + (after ? "&after=" + after : "") + "&limit=50");
  const form = el("form", { id: "job-filters", class: "filters", onsubmit: (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    for (const [k, v] of new FormData(ev.currentTarget)) if (v) next.set(k, v);
    location.hash = "#/jobs?" + next.toString();
  } },
    el("select", { name: "status", "aria-label": "status" },
       ["", "waiting", "pending", "running", "succeeded", "failed", "cancelled"].map(s =>
         el("option", { value: s, selected: s === (params.get("status") || "") },
            s || "any status"))),
    ["queue", "resource", "label", "parent"].map(k =>
      el("input", { name: k, placeholder: k === "label" ? "label key=value" : k,
                    value: params.get(k) || "" })),
    el("button", { type: "submit" }, "Filter"));
  const onPage = new Set(page.jobs.map(j => j.job_id));
  for (const id of Array.from(state.selected)) if (!onPage.has(id)) state.selected.delete(id);
  const tick = (id) => el("input", { type: "checkbox", class: "pick", "aria-label": "select",
    checked: state.selected.has(id), onchange: (ev) => {
      if (ev.currentTarget.checked) state.selected.add(id); else state.selected.delete(id);
      refresh(true);
    } });
  const rows = page.jobs.map(j => el("tr", { key: j.job_id, "data-job": j.job_id,
                                             class: state.selected.has(j.job_id) ? "picked" : null },
    operator() ? el("td", { class: "pick-cell" }, tick(j.job_id)) : null,
    el("td", {}, el("a", { href: "#/jobs/" + j.job_id, class: "mono" }, j.job_id)),
    el("td", {}, badge(j.status)),
    el("td", { class: "num" }, `${j.attempt_count}/${j.max_attempts}`),
    el("td", {}, j.queue), el("td", {}, j.resource || ""),
    el("td", { class: "mono summary", title: j.summary }, j.summary),
    el("td", {}, when(j.created_at))));
  const all = operator() && page.jobs.length ? el("input", { type: "checkbox", id: "pick-all",
    "aria-label": "select the page", checked: page.jobs.every(j => state.selected.has(j.job_id)),
    onchange: (ev) => {
      for (const j of page.jobs) {
        if (ev.currentTarget.checked) state.selected.add(j.job_id); else state.selected.delete(j.job_id);
      }
      refresh(true);
    } }) : null;
  const n = state.selected.size;
  const bar = operator() ? el("div", { id: "selection-bar", class: "selection-bar" },
    el("span", { id: "selection-count" }, n ? plural(n, "job") + " selected"
                                            : "Nothing selected: act on every job the filters select"),
    button(n ? "Retry selected" : "Retry all matching", () => bulk("retry", filters),
           { id: "bulk-retry", disabled: !n && filters.status
                                         && !VERB_STATUSES.retry.includes(filters.status) }),
    button(n ? "Cancel selected" : "Cancel all matching", () => bulk("cancel", filters),
           { id: "bulk-cancel", class: "danger",
             disabled: !n && filters.status && !VERB_STATUSES.cancel.includes(filters.status) }),
    n ? el("button", { id: "selection-clear", onclick: () => { state.selected.clear(); refresh(true); } },
           "Clear") : null) : null;
  const nav = el("div", { class: "pager" },
    el("button", { disabled: !after, onclick: () => {
      const back = new URLSearchParams(filters);
      const prev = state.cursors.pop();
      if (prev) back.set("after", prev);
      location.hash = "#/jobs?" + back.toString();
    } }, "Newer"),
    el("button", { id: "next-page", disabled: !page.next, onclick: () => {
      state.cursors.push(after || "");
      const fwd = new URLSearchParams(filters);
      fwd.set("after", page.jobs[page.jobs.length - 1].job_id);
      location.hash = "#/jobs?" + fwd.toString();
    } }, "Older"));
  const head = ["job", "status", "attempt", "queue", "resource", "runs", "created"];
  const t = table(operator() ? ["", ...head] : head, rows, { id: "jobs" });
  if (all) t.querySelector("th").append(all);
  return [el("h1", {}, "Jobs"), form, bar, t,
          page.jobs.length ? null : el("p", { class: "empty" }, "No job matches."), nav];
}

// -- chrome: drain switch, identity, login -------------------------------------------------

async function header() {
  const d = await api("/drain");
  const pill = document.getElementById("drain");
  update(pill, [d.draining ? "draining" : "accepting work",
    operator() ? el("button", { id: "drain-toggle", onclick: async () => {
      const on = !d.draining;
      const ok = await confirmAction({
        title: on ? "Drain?" : "Stop draining?",
        message: on ? "Refuse new work and let running jobs finish: enqueues are refused, "
                      + "nothing new is claimed." : "Accept and claim work again.",
        confirm: on ? "Drain" : "Stop draining", danger: on, reason: true });
      if (!ok) return;
      try { await post("/drain", { on, reason: ok.reason || "from the console" }); }
      catch (e) { flash("drain: " + e.message, true); }
      refresh(true);
    } }, d.draining ? "Stop draining" : "Drain") : null]);
  pill.className = "pill " + (d.draining ? "bad" : "good");
}

function showLogin() {
  document.getElementById("login").hidden = false;
}

document.getElementById("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = document.getElementById("login-token").value.trim();
  sessionStorage.setItem("jobfence-token", state.token);
  document.getElementById("login").hidden = true;
  start();
});

document.getElementById("search").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("search-input");
  const q = input.value.trim();
  input.value = "";
  input.blur();
  if (/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(q)) {
    location.hash = "#/jobs/" + q.toLowerCase();
  } else if (q) {
    location.hash = "#/jobs?label=" + encodeURIComponent(q);
  }
});

// -- routing and live refresh --------------------------------------------------------------

function route() {
  const path = location.hash.replace(/^#/, "").split("?")[0] || "/queues";
  const job = path.match(/^\/jobs\/([0-9a-fA-F-]{36})$/);
  if (job) return ["jobs", () => jobPage(job[1])];
  if (path === "/jobs") return ["jobs", jobsPage];
  if (path === "/schedules") return ["schedules", schedulesPage];
  const workflow = path.match(/^\/workflows\/([0-9a-fA-F-]{36})$/);
  if (workflow) return ["workflows", () => workflowPage(workflow[1])];
  if (path === "/workflows") return ["workflows", workflowsPage];
  if (path === "/functions") return ["functions", functionsPage];
  return ["queues", queuesPage];
}

async function refresh(force = false) {
  const [name, page] = route();
  const key = location.hash;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("current", a.dataset.nav === name);
  }
  try {
    state.after = [];
    const [nodes] = await Promise.all([page(), header()]);
    if (key !== location.hash) return;  // the user moved on meanwhile
    const view = document.getElementById("view");
    const focused = document.activeElement && view.contains(document.activeElement)
      && document.activeElement.matches("input, select, textarea");
    if (focused && !force && key === state.lastKey) return;  // never under the user's typing
    const fresh = [nodes].flat().filter(Boolean);
    if (key === state.lastKey) update(view, fresh);  // the same page: change what changed
    else view.replaceChildren(...fresh);
    view.dataset.page = name;
    view.dataset.loadedAt = String(Date.now());
    state.lastKey = key;
    for (const after of state.after) await after();
    document.getElementById("live").className = "live ok";
  } catch (e) {
    document.getElementById("live").className = "live stale";
    if (e.status !== 401) flash(e.message, true);
  }
}

async function start() {
  try {
    state.me = await api("/me");
  } catch (e) {
    if (e.status !== 401) flash(e.message, true);
    return;
  }
  document.getElementById("who").textContent =
    `${state.me.user} (${state.me.may_operate ? "operator" : "reader"})`;
  await refresh(true);
  clearInterval(state.timer);
  state.timer = setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
}

window.addEventListener("hashchange", () => {
  state.selected.clear();
  state.revealed = {};
  state.logs = {};
  refresh(true);
});
start();
