// The fleet: machines by class and state (chart and counts), the machines that need an
// operator (maintenance, failed cleaning or provisioning, with their reasons), and the inventory
// table with filters.
import { all, call } from "./api.js";
import { stackedBars } from "./chart.js";
import { dl, empty, fill, h, link, paged, short, state, table, time } from "./ui.js";

export const STATES = [
  "available", "allocated", "provisioning", "active", "releasing", "cleaning", "enrolling",
  "inspecting", "maintenance", "clean_failed", "provision_failed", "retired",
];

const machineColumns = [
  ["Name", (m) => link(`#/machines/${m.id}`, m.name)],
  ["Class", (m) => m.machine_class],
  ["State", (m) => state(m.state)],
  ["Health", (m) => (m.health ? `${m.health.status} (${m.health.source})` : "—")],
  ["Tenant", (m) => short(m.tenant_id)],
  ["Reason", (m) => m.maintenance_reason || (m.last_error ? `${m.last_error.code}: ${m.last_error.message}` : "")],
  ["Updated", (m) => time(m.updated_at)],
];

async function summary() {
  const [classes, machines] = await Promise.all([all("/v1/machine-classes"), all("/v1/machines")]);
  if (!machines.length) return empty("No machines are enrolled yet.");
  const names = [...new Set([...classes.map((c) => c.name), ...machines.map((m) => m.machine_class)])];
  const count = (cls, st) => machines.filter((m) => m.machine_class === cls && m.state === st).length;
  const states = STATES.filter((st) => machines.some((m) => m.state === st));
  const series = states.map((st) => ({ name: st.replace(/_/g, " "), values: names.map((n) => count(n, st)) }));
  const chart = stackedBars("Machines by class and state", names, series);
  const counts = table(
    "Machines by class and state",
    [["Class", (r) => r.name], ...states.map((st) => [st.replace(/_/g, " "), (r) => String(count(r.name, st))]),
      ["Total", (r) => String(machines.filter((m) => m.machine_class === r.name).length)]],
    names.map((name) => ({ name })),
  );
  const attention = machines.filter((m) => ["maintenance", "clean_failed", "provision_failed"].includes(m.state) || m.last_error);
  return [
    dl([["Machines", String(machines.length)], ["Available", String(machines.filter((m) => m.state === "available").length)]]),
    chart,
    counts,
    h("h2", {}, "Needs attention"),
    attention.length
      ? table("Machines in maintenance or failed, with their reasons", machineColumns, attention)
      : empty("No machine is in maintenance or failed."),
  ];
}

function inventory() {
  const box = h("div");
  const stateSel = h("select", { id: "filter-state", name: "state" },
    h("option", { value: "" }, "any"), STATES.map((st) => h("option", { value: st }, st.replace(/_/g, " "))));
  const classIn = h("input", { id: "filter-class", name: "machine_class", type: "text", placeholder: "e.g. gpu-h100x8" });
  const list = h("div");
  const load = () =>
    list.replaceChildren(paged("Machines", machineColumns, (cursor) =>
      call("/v1/machines", { query: { state: stateSel.value, machine_class: classIn.value.trim(), limit: 25, cursor } }),
    "No machine matches these filters."));
  const form = h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); load(); } },
    h("label", { for: "filter-state" }, "State"), stateSel,
    h("label", { for: "filter-class" }, "Class"), classIn,
    h("button", { type: "submit" }, "Filter"));
  load();
  box.append(form, list);
  return box;
}

export function fleetPage() {
  const top = h("div");
  fill(top, summary, "Loading the fleet");
  const view = h("section", { "data-title": "Fleet" }, h("h1", {}, "Fleet"), top, h("h2", {}, "Machines"), inventory());
  return view;
}
