// The workflows pages: every workflow newest first (its status, where it failed, its steps
// done), and one workflow's graph — each step a box coloured by its state, in columns by
// how deep it is, an arrow from each step to those after it — with its steps' table and its
// verbs: cancel (every unfinished step) and retry (the failed and never-run ones).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const BOX = { w: 150, h: 34, dx: 200, dy: 50 };
const FILL = { succeeded: "#dcfce7", failed: "#fee2e2", cancelled: "#f3f4f6", running: "#dbeafe",
               pending: "#fef3c7", waiting: "#fef3c7" };

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const c of children) node.append(c);  // text is set as text, never parsed
  return node;
}

function stateOf(w) {
  return w.status === "failed" && w.failed_step ? `failed at ${w.failed_step}` : w.status;
}

async function workflowsPage() {
  const { workflows } = await api("/workflows?limit=100");
  const rows = workflows.map(w => el("tr", { key: w.workflow_id, "data-workflow": w.workflow_id },
    el("td", { class: "mono" }, el("a", { href: "#/workflows/" + w.workflow_id },
                                   w.workflow_id.slice(0, 8) + "…")),
    el("td", {}, w.workflow),
    el("td", { class: "state" }, badge(w.status), w.failed_step
      ? el("span", { class: "muted" }, " at " + w.failed_step) : null),
    el("td", { class: "num" }, `${w.steps_succeeded}/${w.steps_total}`),
    el("td", {}, when(w.created_at)), el("td", {}, when(w.finished_at))));
  return [el("h1", {}, "Workflows"),
          workflows.length ? table(["workflow", "name", "status", "steps done", "created",
                                    "finished"], rows, { id: "workflows" })
                           : el("p", { class: "empty" }, "No workflow has been submitted yet.")];
}

function graph(steps) {
  const names = Object.keys(steps);  // already in the order they may run
  const depth = {};
  for (const n of names) {
    depth[n] = Math.max(-1, ...steps[n].after.filter(a => a in depth).map(a => depth[a])) + 1;
  }
  const column = {};
  const at = {};
  for (const n of names) {
    const d = depth[n];
    column[d] = (column[d] || 0) + 1;
    at[n] = { x: 10 + d * BOX.dx, y: 10 + (column[d] - 1) * BOX.dy };
  }
  const width = 20 + (Math.max(...names.map(n => depth[n])) + 1) * BOX.dx;
  const height = 20 + Math.max(...Object.values(column)) * BOX.dy;
  const edges = names.flatMap(n => steps[n].after.filter(a => a in at).map(a => svg("line", {
    x1: at[a].x + BOX.w, y1: at[a].y + BOX.h / 2, x2: at[n].x, y2: at[n].y + BOX.h / 2,
    stroke: "#94a3b8", "marker-end": "url(#arrow)" })));
  const boxes = names.map(n => {
    const s = steps[n];
    const link = svg("a", { href: "#/jobs/" + s.job_id, "data-step": n, class: "step s-" + s.status },
      svg("title", {}, `${n}: ${s.status}${s.error ? " — " + s.error : ""}`),
      svg("rect", { x: at[n].x, y: at[n].y, width: BOX.w, height: BOX.h, rx: 5,
                    fill: FILL[s.status] || "#fff", stroke: "#64748b" }),
      svg("text", { x: at[n].x + 8, y: at[n].y + 15, "font-size": 12, "font-weight": 600 },
          n + (s.fan_out ? " ⋔" : "")),
      svg("text", { x: at[n].x + 8, y: at[n].y + 28, "font-size": 11, fill: "#475569" },
          s.status));
    return link;
  });
  const arrow = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
                                markerWidth: 7, markerHeight: 7, orient: "auto" },
                    svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#94a3b8" }));
  return el("div", { class: "graph", id: "workflow-graph" },
            svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img" },
                svg("defs", {}, arrow), ...edges, ...boxes));
}

async function workflowPage(id) {
  const w = await api("/workflows/" + id);
  const active = Object.values(w.steps).some(s => ["waiting", "pending", "running"].includes(s.status));
  const verbs = el("div", { class: "verbs" },
    active ? button("Cancel", async () => {
      const ok = await confirmAction({ title: "Cancel this workflow?", message: "Every unfinished " +
        "step is cancelled; a running step's command is stopped within a second.",
        confirm: "Cancel the workflow", danger: true, reason: true });
      if (!ok) return false;
      await post(`/workflows/${id}/cancel`, { reason: ok.reason || undefined });
    }, { id: "cancel-workflow", class: "danger" }) : null,
    ["failed", "cancelled"].includes(w.status) ? button("Retry", async () => {
      const ok = await confirmAction({ title: "Retry this workflow?", message: "Its failed " +
        "and never-run steps run again; the succeeded ones are kept.", confirm: "Retry",
        reason: true });
      if (!ok) return false;
      await post(`/workflows/${id}/retry`, { reason: ok.reason || undefined });
    }, { id: "retry-workflow" }) : null);
  const facts = [["status", el("span", {}, badge(w.status), w.failed_step
                   ? " at step " + w.failed_step : "")],
                 ["steps", `${w.steps_succeeded} of ${w.steps_total} succeeded`],
                 ["key", w.idempotency_key], ["by", w.created_by],
                 ["created", when(w.created_at)], ["started", when(w.started_at)],
                 ["finished", when(w.finished_at)], ["cancelled", when(w.cancelled_at)]]
    .filter(([, v]) => v);
  const rows = Object.entries(w.steps).map(([n, s]) => el("tr", { key: n, "data-step": n },
    el("td", {}, n, s.fan_out ? el("span", { class: "muted" }, " (fan-out)") : null),
    el("td", { class: "state" }, badge(s.status)),
    el("td", { class: "mono" }, el("a", { href: "#/jobs/" + s.job_id }, s.job_id.slice(0, 8) + "…")),
    el("td", {}, [...s.after, ...s.after_jobs].join(", ") || "-"),
    el("td", { "data-inputs": n }, s.inputs_from.length === 0 ? "-"
      : s.inputs_from.join(", ") + (s.inputs_handed === null ? ""
        : ` (${s.inputs_handed} file${s.inputs_handed === 1 ? "" : "s"})`)),
    el("td", { class: "muted" }, s.error || "")));
  return [el("h1", {}, "Workflow ", el("span", { id: "workflow-name" }, w.workflow)),
          verbs,
          el("dl", { class: "facts", id: "workflow-facts" }, facts.flatMap(([k, v]) =>
            [el("dt", {}, k), el("dd", { "data-fact": k }, v)])),
          el("h2", {}, "Steps"), graph(w.steps),
          table(["step", "status", "job", "after", "files from", "error"], rows, { id: "steps" })];
}
