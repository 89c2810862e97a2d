// The schedules page: every schedule of users' own work (its cron expression and time
// zone, its next tick, the job it last enqueued), a form to add one, and its verbs: pause,
// resume, delete (which asks first).
"use strict";

const EXAMPLE_SPEC = JSON.stringify({ actions: [{ name: "command",
  params: { argv: ["python", "-m", "nightly_report"] } }], queue: "default" }, null, 2);

function addScheduleForm() {
  const form = el("form", { id: "schedule-form", class: "schedule-form", onsubmit: async (ev) => {
    ev.preventDefault();
    const form = ev.currentTarget;  // gone from the event once it has been handled
    const data = Object.fromEntries(new FormData(form));
    let spec;
    try { spec = JSON.parse(data.spec); }
    catch (e) { flash("spec: not JSON: " + e.message, true); return; }
    try {
      await post("/schedules", { name: data.name, cron: data.cron,
                                 timezone: data.timezone || "UTC", spec });
      flash(`schedule ${data.name} added`);
      form.reset();
      form.closest("details").open = false;
    } catch (e) { flash("add: " + e.message, true); }
    refresh(true);
  } },
    el("label", {}, "Name", el("input", { name: "name", id: "schedule-name", required: true,
                                          placeholder: "nightly-report" })),
    el("label", {}, "Cron", el("input", { name: "cron", id: "schedule-cron", required: true,
                                          placeholder: "30 2 * * *" })),
    el("label", {}, "Time zone", el("input", { name: "timezone", id: "schedule-timezone",
                                               placeholder: "UTC" })),
    el("label", { class: "wide" }, "Job spec (JSON)",
       el("textarea", { name: "spec", id: "schedule-spec", rows: 7 }, EXAMPLE_SPEC)),
    el("button", { type: "submit", id: "schedule-add", class: "primary" }, "Add schedule"));
  return el("details", { id: "new-schedule", class: "new-schedule", hidden: !operator() },
            el("summary", {}, "New schedule"), form);
}

async function schedulesPage() {
  const { schedules, next } = await api("/schedules");
  const path = (s, verb) => `/schedules/${encodeURIComponent(s.name)}/${verb}`;
  const rows = schedules.map(s => el("tr", { key: s.name, "data-schedule": s.name },
    el("td", {}, el("strong", {}, s.name)),
    el("td", { class: "state" }, badge(s.paused ? "paused" : "active")),
    el("td", { class: "mono" }, s.cron), el("td", {}, s.timezone),
    el("td", { class: "next" }, s.paused ? "—" : when(s.next_tick_at)),
    el("td", {}, s.last_tick_at ? when(s.last_tick_at) : "never"),
    el("td", {}, s.last_job_id ? el("a", { href: "#/jobs/" + s.last_job_id, class: "mono" },
                                    s.last_job_id.slice(0, 8) + "…") : ""),
    el("td", { class: "mono summary" }, summaryOf(s.spec)),
    el("td", { class: "row-verbs" },
       s.paused ? button("Resume", () => post(path(s, "resume")), { "data-action": "resume" })
                : button("Pause", () => post(path(s, "pause")), { "data-action": "pause" }),
       button("Delete", async () => {
         const ok = await confirmAction({ title: `Delete the schedule ${s.name}?`,
           message: "It enqueues nothing more; the jobs it enqueued stay.",
           confirm: "Delete it", danger: true });
         if (!ok) return false;
         await post(path(s, "delete"));
       }, { "data-action": "delete", class: "danger" }))));
  return [el("h1", {}, "Schedules"),
          el("p", { class: "muted" }, "Each schedule enqueues its job at every tick of its " +
             "cron expression in its time zone, exactly once (the schedules CronJob, every " +
             "minute); after an outage only the latest missed tick runs."),
          addScheduleForm(),
          schedules.length ? table(["schedule", "state", "cron", "time zone", "next tick",
                                    "last tick", "last job", "runs", ""], rows,
                                   { id: "schedules" })
                           : el("p", { class: "empty" }, "No schedule yet."),
          next ? el("p", { class: "note", id: "schedules-more" }, `The first ${schedules.length} `
                    + "schedules by name are shown: jobfence schedule list shows every one.")
               : null];
}

function summaryOf(spec) {
  const a = (spec.actions || [])[0];
  if (!a) return "";
  const p = a.params || {};
  return Array.isArray(p.argv) ? shellJoin(p.argv) : a.name;
}
