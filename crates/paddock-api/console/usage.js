// Usage: node and GPU hours per day by class or tenant, as the aggregate endpoint derives them
// (never summed here), the range's totals, exports streamed with the token in a header, and
// the billing periods with their signature status.
import { all, call, download } from "./api.js";
import { stackedBars } from "./chart.js";
import { dl, empty, fill, h, problem, state, table } from "./ui.js";

const DAY = 86400000;
const iso = (d) => d.toISOString().slice(0, 19) + "Z";

function monthStart(d) {
  return new Date(Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1));
}

function defaultRange() {
  const now = new Date();
  const to = new Date(Math.floor(now.getTime() / DAY) * DAY + DAY);
  return { from: monthStart(now), to };
}

function base(a) {
  return a.tenantId ? `/v1/tenants/${a.tenantId}/usage` : "/v1/usage";
}

function dateInput(id, label, value) {
  return [h("label", { for: id }, label), h("input", { id, name: id, type: "date", value: value.toISOString().slice(0, 10), required: true })];
}

async function chartOf(a, range, groupBy, metric) {
  const agg = await call(`${base(a)}/aggregate`, {
    query: { from: iso(range.from), to: iso(range.to), window: "P1D", group_by: groupBy, limit: 1000 },
  });
  const days = [];
  for (let t = range.from.getTime(); t < range.to.getTime(); t += DAY) days.push(new Date(t).toISOString().slice(0, 10));
  const names = groupBy === "tenant_id" ? new Map((await all("/v1/tenants")).map((t) => [t.id, t.name])) : new Map();
  const key = (item) => (groupBy === "tenant_id" ? names.get(item.tenant_id) || `…${String(item.tenant_id).slice(-8)}` : item.machine_class || "control plane");
  const groups = [...new Set(agg.items.map(key))];
  const series = groups.map((g) => ({
    name: g,
    values: days.map((d) => {
      const item = agg.items.find((i) => key(i) === g && i.window_start.slice(0, 10) === d);
      return item ? Number(item[metric]) : 0;
    }),
  })).filter((se) => se.values.some((v) => v > 0));
  const label = metric === "gpu_hours" ? "GPU hours" : "Node hours";
  return [
    h("p", { class: "muted" }, `As of ${agg.as_of}. Hours as the API derives them.`),
    agg.items.length ? stackedBars(`${label} per day by ${groupBy === "tenant_id" ? "tenant" : "class"}`, days.map((d) => d.slice(5)), series, " h") : empty("No usage in this range."),
    agg.items.length ? table(`${label} per day`, [
      ["Day", (i) => i.window_start.slice(0, 10)], [groupBy === "tenant_id" ? "Tenant" : "Class", key],
      ["Node hours", (i) => i.node_hours], ["GPU hours", (i) => i.gpu_hours]], agg.items) : null,
  ];
}

async function totalsOf(a, range) {
  const agg = await call(`${base(a)}/aggregate`, { query: { from: iso(range.from), to: iso(range.to), window: "none" } });
  const t = agg.totals;
  return dl([["Node hours", t.node_hours], ["GPU hours", t.gpu_hours], ["Control plane seconds", String(t.control_plane_seconds)], ["As of", agg.as_of]]);
}

function exports(a, range) {
  const out = h("div", { role: "status" });
  const over = range.to - range.from > 31 * DAY;
  const button = (format, label) => h("button", {
    type: "button",
    disabled: over,
    onclick: async (e) => {
      e.target.disabled = true;
      out.replaceChildren(`Exporting ${label}…`);
      try {
        const name = `paddock-usage-${iso(range.from).slice(0, 10)}-${iso(range.to).slice(0, 10)}.${format === "ndjson" ? "ndjson" : "csv"}`;
        await download(`${base(a)}/export`, { from: iso(range.from), to: iso(range.to), format }, format === "focus" ? name.replace("usage", "focus") : name);
        out.replaceChildren(`${label} export written.`);
      } catch (err) {
        out.replaceChildren(problem(err));
      }
      e.target.disabled = false;
    },
  }, `Export ${label}`);
  return h("div", { class: "exports" },
    button("csv", "CSV"), button("ndjson", "NDJSON"), button("focus", "FOCUS"),
    over ? h("p", { class: "help" }, "Exports cover at most 31 days: narrow the range.") : null, out);
}

async function periods(range) {
  const months = [];
  for (let m = monthStart(range.from); m < range.to; m = new Date(Date.UTC(m.getUTCFullYear(), m.getUTCMonth() + 1, 1))) {
    months.push(m.toISOString().slice(0, 7));
  }
  const prev = monthStart(new Date(monthStart(range.from).getTime() - DAY)).toISOString().slice(0, 7);
  const views = await Promise.all([prev, ...months].map((p) => call(`/v1/usage/periods/${p}`)));
  return table("Billing periods", [
    ["Period", (p) => p.period], ["State", (p) => state(p.state)],
    ["Closable at", (p) => p.closable_at],
    ["Signature", (p) => (p.closed ? `signed (key ${p.closed.key_id})` : "not closed")],
  ], views);
}

export function usagePage(a) {
  const range = defaultRange();
  const chart = h("div");
  const totals = h("div");
  const ex = h("div");
  const per = h("div");
  const groupSel = h("select", { id: "group-by", name: "group_by" },
    h("option", { value: "machine_class" }, "machine class"), a.provider ? h("option", { value: "tenant_id" }, "tenant") : null);
  const metricSel = h("select", { id: "metric", name: "metric" },
    h("option", { value: "node_hours" }, "node hours"), h("option", { value: "gpu_hours" }, "GPU hours"));
  const form = h("form", { class: "filters" },
    dateInput("usage-from", "From", range.from), dateInput("usage-to", "To (exclusive)", range.to),
    h("label", { for: "group-by" }, "By"), groupSel, h("label", { for: "metric" }, "Show"), metricSel,
    h("button", { type: "submit" }, "Show"));
  const load = () => {
    const r = {
      from: new Date(`${form.querySelector("#usage-from").value}T00:00:00Z`),
      to: new Date(`${form.querySelector("#usage-to").value}T00:00:00Z`),
    };
    fill(chart, () => chartOf(a, r, groupSel.value, metricSel.value), "Loading usage");
    fill(totals, () => totalsOf(a, r), "Loading totals");
    ex.replaceChildren(exports(a, r));
    if (a.periods) fill(per, () => periods(r), "Loading billing periods");
  };
  form.addEventListener("submit", (e) => { e.preventDefault(); load(); });
  load();
  return h("section", { "data-title": "Usage" }, h("h1", {}, "Usage"), form, chart,
    h("h2", {}, "Totals of the range"), totals, h("h2", {}, "Exports"), ex,
    a.periods ? [h("h2", {}, "Billing periods"), per] : null);
}
