// The console's job page (what it runs, its outputs, attempts and audit trail) and the
// periodic functions' page.
"use strict";

// An output tail, folded unless it says why an action failed: opened or folded by the
// operator, it stays so across refreshes (dom.js keeps a <details>' open state), and so
// does a selection in it.
function tail(label, text, key, open = false) {
  if (!text) return null;
  const lines = text.replace(/\n$/, "").split("\n").length;
  return el("details", { class: "tail", key, open },
            el("summary", {}, `${label} (last ${plural(lines, "line")})`),
            el("pre", { class: "tail-" + label }, text));
}

// A stream kept whole on S3 (GET /jobs/ID/logs): read only when its block is opened, a
// page (at most 1 MiB) at a time, never on a refresh; "Show more" reads the next page.
function whole(label, a, i, jobId) {
  const r = a.result || {};
  if (!r.output_on_s3 && a.status !== "running") return null;
  const key = `${jobId}/${i}/${label}`;
  const log = state.logs[key];
  const bytes = r[label + "_bytes"];
  const size = typeof bytes === "number" ? plural(bytes, "byte") : "still running";
  const shown = log && log.text !== undefined ? new TextEncoder().encode(log.text).length : 0;
  return el("details", { class: "tail whole", key: `whole-${label}-${i}`,
                         ontoggle: ev => { if (ev.target.open && !log) readLog(key, jobId, i, label); } },
            el("summary", {}, `${label} (whole output, ${size})`),
            !log ? null : log.error ? el("p", { class: "error" }, log.error)
              : log.text === undefined ? el("p", { class: "note" }, "Reading…")
              : el("pre", { class: "log-" + label }, log.text),
            log && log.more ? el("p", { class: "note reading" }, "Reading more…") : null,
            log && log.next ? el("p", { class: "note" }, `The first ${plural(shown, "byte")} are `
              + "shown ", el("button", { type: "button", class: "log-more",
                                    onclick: () => readLog(key, jobId, i, label, log.next) },
                                "Show more"),
              ` or: jobfence logs ${jobId} --stream ${label}`) : null,
            log && !log.next && a.status === "running" ? el("button", { type: "button",
              class: "log-again", onclick: () => readLog(key, jobId, i, label) }, "Read again")
              : null);
}

// One page of one stream (`only`): its text appended to what the block shows.
async function readLog(key, jobId, i, label, next) {
  const had = next ? state.logs[key] : null;
  state.logs[key] = { ...(had || {}), text: had ? had.text : undefined, next: null,
                      more: Boolean(had) };
  refresh(true);
  try {
    const path = next ? next.replace(/^\/api\/v1/, "")
      : `/jobs/${encodeURIComponent(jobId)}/logs?action=${i}&stream=${label}&only=true`;
    const out = await api(path);
    const piece = out.pieces[0] || { text: "" };
    state.logs[key] = piece.unavailable ? { error: piece.unavailable }
      : { text: (had ? had.text : "") + piece.text, next: out.next };
  } catch (e) {
    state.logs[key] = { error: e.message };
  }
  await refresh(true);
}

function usage(r) {
  const u = r.usage;
  if (!u) return null;
  const peak = u.peak_memory_bytes === null ? "unknown"
             : `${(u.peak_memory_bytes / 1048576).toFixed(1)} MiB`;
  return el("span", { class: "usage" }, ` · ${u.cpu_seconds} s CPU, ${peak} peak memory`);
}

function outputLink(url) {
  return /^https?:\/\//.test(url) ? el("a", { href: url, rel: "noreferrer" }, url)
                                  : el("code", {}, url);
}

function shellJoin(argv) {
  return argv.map(a => /^[\w@%+=:,./-]+$/.test(a) ? a : "'" + String(a).replace(/'/g, "'\\''") + "'")
             .join(" ");
}

// What an action runs: a command's argv and env (values masked unless an operator asked
// for them), a plugin's params as JSON.
function runs(jobId, a, i) {
  const p = a.params || {};
  const revealed = (state.revealed[jobId] || {})[i];
  const env = revealed || p.env;
  const rest = Object.fromEntries(Object.entries(p).filter(([k]) => k !== "argv" && k !== "env"));
  return el("dl", { class: "runs" },
    Array.isArray(p.argv) ? [el("dt", {}, "argv"), el("dd", {}, el("code", { class: "argv" },
                                                                  shellJoin(p.argv)))] : null,
    env && Object.keys(env).length ? [el("dt", {}, "env"), el("dd", { class: "env" },
      Object.entries(env).map(([k, v]) => el("div", { key: k },
        el("code", {}, k), " = ", el("code", { class: revealed ? "revealed" : "masked" }, v))),
      revealed ? null : button("Reveal values", () => reveal(jobId),
                               { class: "reveal-env", "data-action": "reveal-env" }))] : null,
    Object.keys(rest).length ? [el("dt", {}, "params"),
                                el("dd", {}, el("code", {}, JSON.stringify(rest)))] : null);
}

async function reveal(jobId) {
  const ok = await confirmAction({ title: "Show the env values?",
    message: "They may hold secrets. Who asked, and why, is recorded.",
    confirm: "Show them", reason: true, reasonHint: "why you need them (recorded)" });
  if (!ok) return false;
  if (!ok.reason) throw new Error("say why: it is recorded");
  const out = await post(`/jobs/${jobId}/env`, { reason: ok.reason });
  state.revealed[jobId] = Object.fromEntries(out.actions.map(a => [a.index, a.env]));
  return "env values shown (recorded)";
}

async function jobPage(id) {
  const j = await api("/jobs/" + encodeURIComponent(id));
  const facts = [["status", badge(j.status)], ["attempts", `${j.attempt_count}/${j.max_attempts}`],
    ["snoozes", j.snoozes || null], ["queue", j.queue], ["resource", j.resource], ["priority", j.priority],
    ["scheduled for", j.run_at], ["claimed by", j.status === "running" ? j.claimed_by : null],
    ["lease expires", j.lease_expires_at ? when(j.lease_expires_at) : null],
    ["created", when(j.created_at)], ["started", when(j.started_at)],
    ["finished", when(j.finished_at)], ["reason", j.reason], ["error", j.error],
    ["parent", j.parent_id ? el("a", { href: "#/jobs/" + j.parent_id }, j.parent_id) : null],
    ["labels", Object.keys(j.labels || {}).length ? JSON.stringify(j.labels) : null],
    ["idempotency key", j.idempotency_key],
    ["manifest", j.manifest]].filter(([, v]) => v !== null && v !== undefined && v !== "");
  const actions = j.actions.map((a, i) => {
    const r = a.result || {};
    return el("li", { class: "action", "data-action-index": i, key: "action-" + i },
      el("div", { class: "action-head" }, el("strong", {}, `${i + 1}. ${a.name}`), " ",
         badge(a.status), r.exit_code !== undefined ? el("span", { class: "exit" },
                                                         ` exit ${r.exit_code}`) : null,
         usage(r), a.inactivity_timeout ? el("span", { class: "quiet" },
                                             ` · inactivity timeout ${a.inactivity_timeout}`)
                                       : null),
      runs(j.job_id, a, i),
      a.error ? el("p", { class: "error" }, a.error) : null,
      whole("stdout", a, i, j.job_id) || tail("stdout", r.stdout_tail, `stdout-${i}`),
      whole("stderr", a, i, j.job_id)
        || tail("stderr", r.stderr_tail || a.error_detail, `stderr-${i}`, a.status === "failed"),
      (r.outputs || []).length ? el("ul", { class: "outputs" },
                                    r.outputs.map(u => el("li", {}, outputLink(u)))) : null);
  });
  const attempts = (j.attempts || []).map(a => el("tr", { key: "attempt-" + a.number },
    el("td", { class: "num" }, a.number), el("td", {}, a.claimed_by || ""),
    el("td", {}, when(a.started_at)), el("td", {}, badge(a.outcome)),
    el("td", {}, a.reason || ""), el("td", {}, when(a.ended_at))));
  const events = (j.events || []).map(e => el("li", { key: "event-" + e.event_id },
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
    active ? button("Cancel", async () => {
      const ok = await confirmAction({ title: "Cancel this job?", message: j.status === "running"
        ? "Its command is stopped within a second." : "It will not run.", confirm: "Cancel the job",
        danger: true, reason: true });
      if (!ok) return false;
      await post(`/jobs/${j.job_id}/cancel`, { reason: ok.reason || "from the console" });
    }, { id: "cancel-job", class: "danger" }) : null,
    ["failed", "cancelled"].includes(j.status) && !j.children ? button("Retry", async () => {
      const ok = await confirmAction({ title: "Retry this job?", message: "It runs again "
        + "with a new attempt budget.", confirm: "Retry the job", reason: true });
      if (!ok) return false;
      await post(`/jobs/${j.job_id}/retry`, { reason: ok.reason || "from the console" });
    }, { id: "retry-job" }) : null);
  return [el("h1", {}, "Job ", el("span", { class: "mono", id: "job-id" }, j.job_id)), verbs,
          el("dl", { class: "facts", id: "job-facts" },
             facts.flatMap(([k, v]) => [el("dt", { key: "t-" + k }, k),
                                        el("dd", { "data-fact": k, key: "d-" + k }, v)])),
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
  const rows = f.functions.map(fn => el("tr", { key: fn.function, "data-function": fn.function },
    el("td", {}, fn.function),
    el("td", {}, fn.last_status ? badge(fn.last_status) : "never run"),
    el("td", {}, when(fn.last_run_at)), el("td", {}, when(fn.last_success_at)),
    el("td", {}, fn.healthy === null ? badge("unknown")
                                     : badge(fn.healthy ? "healthy" : "unhealthy")),
    el("td", { class: "num" }, fn.consecutive_failures || 0),
    el("td", {}, button("Run now", async () => {
      const ok = await confirmAction({ title: `Run ${fn.function} now?`,
        message: "A run is safe at any time: a second one at once skips.",
        confirm: "Run it", reason: true, reasonHint: "why now (recorded with the run)" });
      if (!ok) return false;
      if (!ok.reason) throw new Error("a reason is needed");
      await post(`/functions/${fn.function}/trigger`, { reason: ok.reason });
    }, { "data-action": "trigger" }))));
  const runs = f.runs.map(r => el("tr", { key: "run-" + r.run_id }, el("td", {}, r.function),
    el("td", {}, badge(r.status)),
    el("td", {}, r.trigger + (r.triggered_by ? ` by ${r.triggered_by}` : "")),
    el("td", {}, when(r.started_at)),
    el("td", { class: "num" }, r.duration_seconds === null ? "" : r.duration_seconds.toFixed(2) + "s"),
    el("td", {}, r.error || "")));
  const triggers = f.triggers.map(t => el("tr", { key: "trigger-" + t.trigger_id },
    el("td", {}, t.function), el("td", {}, t.requested_by), el("td", {}, t.reason),
    el("td", {}, when(t.requested_at)), el("td", {}, badge(t.outcome)),
    el("td", {}, t.job_name || t.error || "")));
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
