// The queues page: each queue's counts by state and settings, what is wrong with it (ready
// work and no recent claim; work that no worker has ever claimed), and a chart per queue
// of the last hour from the stored histograms — jobs finished a minute by status, and the
// run time's 50th, 95th and 99th percentiles — drawn by uPlot (vendored, MIT); and, for a
// queue with a limit on each group or round-robin across groups, its busiest groups.
"use strict";

const CHARTED = 8;  // queues with a chart (the busiest first)
const charts = {};  // queue -> uPlot, kept across refreshes (its data is replaced)
const GROUPS_SHOWN = 20;  // groups listed of a queue with group settings (the busiest first)

function sum(obj) { return Object.values(obj || {}).reduce((a, b) => a + b, 0); }

function chartData(minutes) {
  const x = minutes.map(m => new Date(m.minute).getTime() / 1000);
  const count = (s) => minutes.map(m => (m.finished[s] || 0));
  const pct = (k) => minutes.map(m => (m[k] === null ? null : m[k]));
  return [x, count("succeeded"), count("failed"), count("cancelled"),
          pct("run_p50"), pct("run_p95"), pct("run_p99")];
}

function chartOptions(width) {
  const bars = uPlot.paths.bars({ size: [0.6, 10] });
  return { width, height: 170, legend: { live: false },
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true }, n: { range: (u, lo, hi) => [0, Math.max(1, hi)] },
              s: { range: (u, lo, hi) => [0, Math.max(1, hi || 1)] } },
    series: [{},
      { label: "succeeded", scale: "n", stroke: "#15803d", fill: "rgba(21,128,61,.35)", paths: bars },
      { label: "failed", scale: "n", stroke: "#b91c1c", fill: "rgba(185,28,28,.35)", paths: bars },
      { label: "cancelled", scale: "n", stroke: "#6b7280", fill: "rgba(107,114,128,.3)", paths: bars },
      { label: "run p50", scale: "s", stroke: "#1d4ed8", width: 2, spanGaps: true },
      { label: "p95", scale: "s", stroke: "#7c3aed", width: 1.5, dash: [6, 3], spanGaps: true },
      { label: "p99", scale: "s", stroke: "#b45309", width: 1.5, dash: [2, 3], spanGaps: true }],
    axes: [{ stroke: "#6b7280" },
           { scale: "n", label: "finished / min", stroke: "#6b7280", size: 50 },
           { scale: "s", side: 1, label: "run time (s)", stroke: "#6b7280", size: 55,
             grid: { show: false } }] };
}

// After the page is in place: a chart in each chart box, made once and then given new data.
function drawCharts(histories) {
  for (const [queue, plot] of Object.entries(charts)) {
    if (!document.body.contains(plot.root)) { plot.destroy(); delete charts[queue]; }
  }
  for (const box of document.querySelectorAll(".chart[data-queue]")) {
    const queue = box.dataset.queue;
    const data = chartData(histories[queue] || []);
    if (charts[queue] && box.contains(charts[queue].root)) charts[queue].setData(data);
    else {
      box.replaceChildren();
      charts[queue] = new uPlot(chartOptions(Math.max(320, box.clientWidth - 8)), data, box);
    }
  }
}

function flagsOf(q) {
  return [q.stalled ? badge("stalled", "ready work has waited over 5 minutes and no job " +
                                       "of this queue was claimed in that time") : null,
          q.never_served ? badge("no_worker_yet", "no worker has ever claimed a job of this " +
                                 "queue: is there a pool (a ScaledJob) serving it?") : null];
}

// A queue with group settings: its busiest groups (tenants), each one's jobs by state.
function groupsCard(queue, groups) {
  const rows = groups.slice(0, GROUPS_SHOWN).map(g => el("tr", { key: String(g.group) },
    el("td", {}, g.group === null ? el("span", { class: "muted" }, "(no group)") : g.group),
    el("td", { class: "num depth" }, g.pending), el("td", { class: "num" }, g.scheduled),
    el("td", { class: "num running" }, g.running), el("td", { class: "num" }, g.waiting)));
  return el("section", { class: "groups-card", key: "groups-" + queue, "data-queue": queue },
    el("h3", {}, queue, el("span", { class: "muted" }, ` — its groups (${groups.length}` +
                           (groups.length > GROUPS_SHOWN ? `, the ${GROUPS_SHOWN} busiest` : "") + ")")),
    groups.length ? table(["group", "pending", "scheduled", "running", "waiting"], rows)
                  : el("p", { class: "empty" }, "No group has active jobs."));
}

async function queuesPage() {
  const { queues } = await api("/queues");
  const grouped = queues.filter(q => q.group_limit !== null && q.group_limit !== undefined || q.fair);
  const groups = Object.fromEntries(await Promise.all(grouped.map(async q =>
    [q.queue, (await api(`/queues/${encodeURIComponent(q.queue)}/groups`)).groups])));
  const busiest = [...queues].sort((a, b) => (b.pending + b.running) - (a.pending + a.running))
    .slice(0, CHARTED).map(q => q.queue);
  const histories = Object.fromEntries(await Promise.all(busiest.map(async q =>
    [q, (await api(`/queues/${encodeURIComponent(q)}/history?minutes=60`)).minutes])));
  const finished = (q, s) => sum((histories[q] || []).map(m => m.finished[s] || 0));
  const rows = queues.map(q => el("tr", { key: q.queue, "data-queue": q.queue,
                                          class: q.stalled || q.never_served ? "flagged" : null },
    el("td", {}, el("a", { href: "#/jobs?queue=" + encodeURIComponent(q.queue) }, q.queue)),
    el("td", { class: "state" }, q.paused ? badge("paused") : badge("active"),
       q.fair ? badge("fair", "claims go round-robin across the queue's groups") : null,
       flagsOf(q)),
    el("td", { class: "num", title: q.group_limit === null || q.group_limit === undefined
               ? null : `at most ${q.group_limit} running jobs of each group` },
       (q.limit === null ? "-" : String(q.limit)) +
       (q.group_limit === null || q.group_limit === undefined ? "" : ` (${q.group_limit} a group)`)),
    el("td", { class: "num rate", title: q.rate ? `${q.rate.started} of ${q.rate.limit} ` +
               `started in the last ${q.rate.period_seconds} s` : "no rate" },
       q.rate ? `${q.rate.started}/${q.rate.limit} per ${q.rate.period_seconds}s` : "-"),
    el("td", { class: "num" }, q.waiting),
    el("td", { class: "num depth" }, q.pending),
    el("td", { class: "num" }, q.scheduled),
    el("td", { class: "num running" }, q.running),
    el("td", { class: "num done" }, histories[q.queue] ? finished(q.queue, "succeeded") : "–"),
    el("td", { class: "num failed" }, histories[q.queue] ? finished(q.queue, "failed") : "–"),
    el("td", { class: "num" }, human(Math.round(q.oldest_ready_age_seconds))),
    el("td", { class: "row-verbs" }, q.paused
      ? button("Resume", () => post(`/queues/${encodeURIComponent(q.queue)}/resume`),
               { "data-action": "resume" })
      : button("Pause", () => post(`/queues/${encodeURIComponent(q.queue)}/pause`,
                                   { reason: "from the console" }),
               { "data-action": "pause" }),
      button("Limit", async () => {
        const ok = await confirmAction({ title: `Limit ${q.queue}`, message: "At most how " +
          "many running jobs of this queue, across every pod? Empty: no limit.",
          confirm: "Set the limit", input: { label: "Running jobs at most",
                                             value: q.limit === null ? "" : String(q.limit) } });
        if (!ok) return false;
        const limit = ok.input === "" ? null : Number(ok.input);
        if (limit !== null && !(Number.isInteger(limit) && limit >= 0)) {
          throw new Error("give a whole number, or nothing");
        }
        await post(`/queues/${encodeURIComponent(q.queue)}/limit`, { limit });
      }, { "data-action": "limit" }))));
  const warnings = queues.filter(q => q.stalled || q.never_served).map(q =>
    el("li", { key: "warn-" + q.queue }, el("strong", {}, q.queue), ": ", q.stalled
      ? "ready work has waited over 5 minutes and nothing was claimed."
      : "it has work no worker has ever claimed — is there a pool serving it?"));
  const charted = [...busiest].sort((a, b) => sum((histories[b] || []).map(m => sum(m.finished)))
                                             - sum((histories[a] || []).map(m => sum(m.finished))));
  const cards = charted.map(q => el("section", { class: "chart-card", key: "chart-" + q },
    el("h3", {}, q, el("span", { class: "muted" }, " — the last hour, a minute at a time")),
    el("div", { class: "chart", "data-queue": q, "data-morph": "skip" })));
  state.after.push(() => drawCharts(histories));
  return [el("h1", {}, "Queues"),
          warnings.length ? el("ul", { class: "warnings", id: "queue-warnings" }, warnings) : null,
          queues.length ? table(["queue", "state", "limit", "rate", "waiting", "pending", "scheduled",
                                 "running", "succeeded 1h", "failed 1h", "oldest ready", ""],
                                rows, { id: "queues" })
                        : el("p", { class: "empty" }, "No queue has jobs yet."),
          grouped.length ? el("div", { class: "groups", id: "groups" },
                              grouped.map(q => groupsCard(q.queue, groups[q.queue] || []))) : null,
          cards.length ? el("div", { class: "charts", id: "charts" }, cards) : null];
}
