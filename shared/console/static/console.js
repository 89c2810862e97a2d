// The jobfence console: a client of /api/v1 like any other. Every page is built from API
// answers with DOM nodes and textContent (nothing a job carries is ever parsed as HTML),
// and refreshed every two seconds while the tab is visible.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 2000;
const state = { me: null, token: sessionStorage.getItem("jobfence-token"), timer: null,
                cursors: [], lastKey: null };

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

// -- building DOM ------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick") node.addEventListener("click", v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function table(headers, rows, attrs = {}) {
  return el("table", attrs, el("thead", {}, el("tr", {}, headers.map(h => el("th", {}, h)))),
            el("tbody", {}, rows));
}

function badge(status) { return el("span", { class: "badge s-" + status }, status); }

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

function button(label, action, attrs = {}) {
  return el("button", { ...attrs, hidden: !operator(), onclick: async (ev) => {
    ev.target.disabled = true;
    try { await action(); flash(label + ": done"); }
    catch (e) { flash(label + ": " + e.message, true); }
    finally { ev.target.disabled = false; refresh(true); }
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

// -- pages -------------------------------------------------------------------------------

async function queuesPage() {
  const { queues } = await api("/queues");
  const rows = queues.map(q => el("tr", { "data-queue": q.queue },
    el("td", {}, el("a", { href: "#/jobs?queue=" + encodeURIComponent(q.queue) }, q.queue)),
    el("td", { class: "state" }, q.paused ? badge("paused") : badge("active")),
    el("td", { class: "num" }, q.limit === null ? "-" : q.limit),
    el("td", { class: "num depth" }, q.pending),
    el("td", { class: "num" }, q.scheduled),
    el("td", { class: "num running" }, q.running),
    el("td", { class: "num" }, q.waiting),
    el("td", { class: "num" }, human(Math.round(q.oldest_ready_age_seconds))),
    el("td", { class: "row-verbs" }, q.paused
      ? button("Resume", () => post(`/queues/${encodeURIComponent(q.queue)}/resume`),
               { "data-action": "resume" })
      : button("Pause", () => post(`/queues/${encodeURIComponent(q.queue)}/pause`,
                                   { reason: "from the console" }),
               { "data-action": "pause" }),
      button("Limit", async () => {
        const given = prompt(`At most how many running jobs of ${q.queue}, across every pod? ` +
                             "(empty: no limit)", q.limit === null ? "" : String(q.limit));
        if (given === null) throw new Error("unchanged");
        const limit = given.trim() === "" ? null : Number(given);
        if (limit !== null && !(Number.isInteger(limit) && limit >= 0)) {
          throw new Error("give a whole number, or nothing");
        }
        await post(`/queues/${encodeURIComponent(q.queue)}/limit`, { limit });
      }, { "data-action": "limit" }))));
  return [el("h1", {}, "Queues"),
          queues.length ? table(["queue", "state", "limit", "pending", "scheduled", "running",
                                 "waiting", "oldest ready", ""], rows, { id: "queues" })
                        : el("p", { class: "empty" }, "No queue has jobs yet.")];
}

function routeParams() {
  const [, query = ""] = location.hash.split("?");
  return new URLSearchParams(query);
}

async function jobsPage() {
  const params = routeParams();
  const filters = new URLSearchParams();
  for (const k of ["status", "queue", "resource", "label", "parent"]) {
    if (params.get(k)) filters.set(k, params.get(k));
  }
  const after = params.get("after");
  const page = await api("/jobs?" + filters.toString() + (after ? "&after=" + after : "")
                         + "&limit=50");
  const form = el("form", { id: "job-filters", class: "filters" },
    el("select", { name: "status", "aria-label": "status" },
       ["", "waiting", "pending", "running", "succeeded", "failed", "cancelled"].map(s =>
         el("option", { value: s, selected: s === (params.get("status") || "") },
            s || "any status"))),
    ["queue", "resource", "label", "parent"].map(k =>
      el("input", { name: k, placeholder: k === "label" ? "label key=value" : k,
                    value: params.get(k) || "" })),
    el("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const next = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) next.set(k, v);
    location.hash = "#/jobs?" + next.toString();
  });
  const rows = page.jobs.map(j => el("tr", { "data-job": j.job_id },
    el("td", {}, el("a", { href: "#/jobs/" + j.job_id, class: "mono" }, j.job_id)),
    el("td", {}, badge(j.status)),
    el("td", { class: "num" }, `${j.attempt_count}/${j.max_attempts}`),
    el("td", {}, j.queue), el("td", {}, j.resource || ""),
    el("td", {}, j.actions.map(a => a.name).join(", ")),
    el("td", {}, when(j.created_at))));
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
  return [el("h1", {}, "Jobs"), form,
          table(["job", "status", "attempt", "queue", "resource", "actions", "created"], rows,
                { id: "jobs" }),
          page.jobs.length ? null : el("p", { class: "empty" }, "No job matches."), nav];
}

function tail(label, text) {
  if (!text) return null;
  return el("details", { open: true, class: "tail" }, el("summary", {}, label),
            el("pre", { class: "tail-" + label }, text));
}

function outputLink(url) {
  return /^https?:\/\//.test(url) ? el("a", { href: url, rel: "noreferrer" }, url)
                                  : el("code", {}, url);
}

async function jobPage(id) {
  const j = await api("/jobs/" + encodeURIComponent(id));
  const facts = [["status", badge(j.status)], ["attempts", `${j.attempt_count}/${j.max_attempts}`],
    ["queue", j.queue], ["resource", j.resource], ["priority", j.priority],
    ["scheduled for", j.run_at], ["claimed by", j.status === "running" ? j.claimed_by : null],
    ["lease expires", j.lease_expires_at ? when(j.lease_expires_at) : null],
    ["created", when(j.created_at)], ["started", when(j.started_at)],
    ["finished", when(j.finished_at)], ["reason", j.reason], ["error", j.error],
    ["parent", j.parent_id ? el("a", { href: "#/jobs/" + j.parent_id }, j.parent_id) : null],
    ["labels", Object.keys(j.labels || {}).length ? JSON.stringify(j.labels) : null],
    ["manifest", j.manifest]].filter(([, v]) => v !== null && v !== undefined && v !== "");
  const actions = j.actions.map((a, i) => {
    const r = a.result || {};
    return el("li", { class: "action", "data-action-index": i },
      el("div", { class: "action-head" }, el("strong", {}, `${i + 1}. ${a.name}`), " ",
         badge(a.status), r.exit_code !== undefined ? el("span", { class: "exit" },
                                                         ` exit ${r.exit_code}`) : null),
      a.error ? el("p", { class: "error" }, a.error) : null,
      tail("stdout", r.stdout_tail), tail("stderr", r.stderr_tail || a.error_detail),
      (r.outputs || []).length ? el("ul", { class: "outputs" },
                                    r.outputs.map(u => el("li", {}, outputLink(u)))) : null);
  });
  const attempts = (j.attempts || []).map(a => el("tr", {},
    el("td", { class: "num" }, a.number), el("td", {}, a.claimed_by || ""),
    el("td", {}, when(a.started_at)), el("td", {}, badge(a.outcome)),
    el("td", {}, a.reason || ""), el("td", {}, when(a.ended_at))));
  const events = (j.events || []).map(e => el("li", {},
    el("time", { datetime: e.at }, new Date(e.at).toISOString().replace("T", " ").slice(0, 23)),
    " ", e.from_status || "—", " → ", badge(e.to_status), " ", e.reason || ""));
  let children = null;
  if (j.children) {
    const c = j.children, done = (c.succeeded || 0) + (c.failed || 0) + (c.cancelled || 0);
    children = el("section", { id: "children" }, el("h2", {}, "Children"),
      el("progress", { max: c.total || 1, value: done }),
      el("p", {}, `${done} of ${c.total} done — `,
         Object.entries(c).filter(([k]) => k !== "total").map(([k, v]) => `${k} ${v}`).join(", "),
         " ", el("a", { href: "#/jobs?parent=" + j.job_id }, "list them")));
  }
  const active = ["waiting", "pending", "running"].includes(j.status);
  const verbs = el("div", { class: "verbs" },
    active ? button("Cancel", () => post(`/jobs/${j.job_id}/cancel`,
                                         { reason: "from the console" }),
                    { id: "cancel-job", class: "danger" }) : null,
    ["failed", "cancelled"].includes(j.status) && !j.children
      ? button("Retry", () => post(`/jobs/${j.job_id}/retry`, { reason: "from the console" }),
               { id: "retry-job" }) : null);
  return [el("h1", {}, "Job ", el("span", { class: "mono", id: "job-id" }, j.job_id)), verbs,
          el("dl", { class: "facts", id: "job-facts" },
             facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, v)])),
          children,
          el("h2", {}, "Actions"), el("ol", { class: "actions", id: "actions" }, actions),
          el("h2", {}, "Attempts"),
          attempts.length ? table(["#", "claimed by", "started", "ended as", "why", "ended"],
                                  attempts, { id: "attempts" })
                          : el("p", { class: "empty" }, j.children
                               ? "A parent runs nothing itself: its children do."
                               : "Not claimed yet."),
          el("h2", {}, "Audit trail"), el("ol", { class: "timeline", id: "events" }, events)];
}

async function functionsPage() {
  const f = await api("/functions");
  const rows = f.functions.map(fn => el("tr", { "data-function": fn.function },
    el("td", {}, fn.function),
    el("td", {}, fn.last_status ? badge(fn.last_status) : "never run"),
    el("td", {}, when(fn.last_run_at)), el("td", {}, when(fn.last_success_at)),
    el("td", {}, fn.healthy === null ? badge("unknown")
                                     : badge(fn.healthy ? "healthy" : "unhealthy")),
    el("td", { class: "num" }, fn.consecutive_failures || 0),
    el("td", {}, button("Run now", async () => {
      const reason = prompt(`Why run ${fn.function} now? (recorded with the run)`);
      if (!reason) throw new Error("a reason is needed");
      await post(`/functions/${fn.function}/trigger`, { reason });
    }, { "data-action": "trigger" }))));
  const runs = f.runs.map(r => el("tr", {}, el("td", {}, r.function), el("td", {}, badge(r.status)),
    el("td", {}, r.trigger + (r.triggered_by ? ` by ${r.triggered_by}` : "")),
    el("td", {}, when(r.started_at)),
    el("td", { class: "num" }, r.duration_seconds === null ? "" : r.duration_seconds.toFixed(2) + "s"),
    el("td", {}, r.error || "")));
  const triggers = f.triggers.map(t => el("tr", {}, el("td", {}, t.function),
    el("td", {}, t.requested_by), el("td", {}, t.reason), el("td", {}, when(t.requested_at)),
    el("td", {}, badge(t.outcome)), el("td", {}, t.job_name || t.error || "")));
  return [el("h1", {}, "Periodic functions"),
          table(["function", "last run", "when", "last success", "health",
                 "failures in a row", ""], rows, { id: "functions" }),
          el("h2", {}, "Recent runs"),
          table(["function", "status", "trigger", "started", "took", "error"], runs,
                { id: "runs" }),
          el("h2", {}, "Manual triggers"),
          triggers.length ? table(["function", "by", "why", "when", "outcome", "job"], triggers,
                                  { id: "triggers" })
                          : el("p", { class: "empty" }, "None yet.")];
}

// -- chrome: drain switch, identity, login -----------------------------------------------

async function header() {
  const d = await api("/drain");
  const pill = document.getElementById("drain");
  pill.replaceChildren(d.draining ? "draining" : "accepting work",
    operator() ? el("button", { id: "drain-toggle", onclick: async () => {
      const on = !d.draining;
      if (on && !confirm("Drain: refuse new work and let running jobs finish?")) return;
      try { await post("/drain", { on, reason: "from the console" }); }
      catch (e) { flash("drain: " + e.message, true); }
      refresh(true);
    } }, d.draining ? "Stop draining" : "Drain") : null);
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

// -- routing and live refresh ------------------------------------------------------------

function route() {
  const path = location.hash.replace(/^#/, "").split("?")[0] || "/queues";
  const job = path.match(/^\/jobs\/([0-9a-fA-F-]{36})$/);
  if (job) return ["jobs", () => jobPage(job[1])];
  if (path === "/jobs") return ["jobs", jobsPage];
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
    const [nodes] = await Promise.all([page(), header()]);
    if (key !== location.hash) return;  // the user moved on meanwhile
    const view = document.getElementById("view");
    const focused = document.activeElement && view.contains(document.activeElement)
      && document.activeElement.matches("input, select");
    if (focused && !force && key === state.lastKey) return;  // never under the user's typing
    view.replaceChildren(...[nodes].flat().filter(Boolean));
    view.dataset.page = name;
    view.dataset.loadedAt = String(Date.now());
    state.lastKey = key;
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

window.addEventListener("hashchange", () => refresh(true));
start();
