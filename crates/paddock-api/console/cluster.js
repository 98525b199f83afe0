// A cluster: phase, conditions, pools, endpoints, and its operations with their step timelines,
// read again every two seconds while one of them is still running.
import { call } from "./api.js";
import { dl, empty, h, link, problem, state, table, time } from "./ui.js";

const FINISHED = ["succeeded", "failed", "superseded"];

function overview(c) {
  const ep = c.status.endpoints || {};
  return [
    dl([
      ["Phase", state(c.status.phase)], ["Kind", c.kind], ["Isolation", c.isolation],
      ["Stack", c.stack_version], ["Kubernetes", c.kubernetes_version],
      ["Kubernetes API", ep.kubernetes_api], ["Slurm REST API", ep.slurm_rest_api], ["Login (SSH)", ep.login_ssh],
      ["Created", time(c.created_at)],
    ]),
    h("h2", {}, "Conditions"),
    c.status.conditions.length
      ? table("Conditions", [
        ["Type", (x) => x.type], ["Status", (x) => x.status], ["Reason", (x) => x.reason],
        ["Message", (x) => x.message], ["Since", (x) => time(x.last_transition_time)]], c.status.conditions)
      : empty("No conditions reported yet."),
    h("h2", {}, "Node pools"),
    c.node_pools.length
      ? table("Node pools", [["Name", (p) => p.name], ["Class", (p) => p.machine_class], ["Role", (p) => p.role], ["Count", (p) => String(p.count)]], c.node_pools)
      : empty("No node pools."),
  ];
}

function steps(op) {
  if (!op.steps.length) return empty("No steps yet.");
  return h("ol", { class: "steps", "aria-label": `Steps of ${op.kind}` }, op.steps.map((s) =>
    h("li", { class: `step step-${s.state}` },
      h("span", { class: "step-name" }, s.name), " ", state(s.state),
      s.started_at ? h("span", { class: "muted" }, " started ", time(s.started_at)) : null,
      s.finished_at ? h("span", { class: "muted" }, " finished ", time(s.finished_at)) : null)));
}

function operation(op) {
  return h("article", { class: "operation", "data-operation": op.id, "data-state": op.state },
    h("h3", {}, `${op.kind} `, state(op.state)),
    dl([["Started", time(op.created_at)], ["Finished", time(op.finished_at)], ["Current step", op.current_step]]),
    op.error ? problem({ problem: op.error }) : null,
    steps(op));
}

export function clusterPage(a, tenantId, clusterId) {
  const head = h("div");
  const ops = h("div", { "aria-live": "polite" });
  const title = h("h1", {}, "Cluster");
  const status = h("p", { class: "muted", role: "status" });
  let timer;
  const refresh = async () => {
    if (!document.body.contains(view) && timer !== undefined) return; // left the page
    try {
      const [c, page] = await Promise.all([
        call(`/v1/tenants/${tenantId}/clusters/${clusterId}`),
        call(`/v1/tenants/${tenantId}/operations`, { query: { target_id: clusterId, limit: 20 } }),
      ]);
      title.textContent = `Cluster ${c.name}`;
      head.replaceChildren(...overview(c));
      ops.replaceChildren(...(page.items.length ? page.items.map(operation) : [empty("No operations.")]));
      const running = page.items.some((op) => !FINISHED.includes(op.state));
      status.textContent = running ? "Updating live while an operation runs." : `Read at ${new Date().toISOString().slice(11, 19)}Z.`;
      timer = running ? setTimeout(refresh, 2000) : null;
    } catch (e) {
      head.replaceChildren(problem(e));
      timer = null;
    }
  };
  const view = h("section", { "data-title": "Cluster" },
    h("p", {}, link(`#/tenants/${tenantId}`, "← Tenant")), title, head,
    h("h2", {}, "Operations"), status, ops);
  head.replaceChildren(h("p", { class: "loading", role: "status" }, "Loading the cluster…"));
  refresh();
  return view;
}
