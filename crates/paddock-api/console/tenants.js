// Tenants: their quotas and use, their clusters, and suspend/resume (after a confirmation).
import { call } from "./api.js";
import { confirm, dl, fill, h, link, paged, problem, state, time } from "./ui.js";

const quota = (t, k) => `${t.quota_use?.[k] ?? 0} / ${t.quotas?.[`max_${k}`] ?? "∞"}`;

function suspendButton(a, t, after) {
  if (!a.manageTenants) return null;
  const suspended = t.state === "suspended";
  const verb = suspended ? "resume" : "suspend";
  const out = h("span", { class: "inline-error" });
  const btn = h("button", {
    type: "button",
    class: suspended ? "" : "danger",
    onclick: async () => {
      const ok = await confirm(
        suspended ? `Resume tenant ${t.name}?` : `Suspend tenant ${t.name}? Its clusters stop being served.`,
        suspended ? "Resume" : "Suspend");
      if (!ok) return;
      btn.disabled = true;
      try {
        await call(`/v1/tenants/${t.id}/${verb}`, { method: "POST" });
        after();
      } catch (e) {
        out.replaceChildren(problem(e));
        btn.disabled = false;
      }
    },
  }, suspended ? `Resume ${t.name}` : `Suspend ${t.name}`);
  return h("span", {}, btn, out);
}

export function tenantsPage(a) {
  const list = h("div");
  const load = () => list.replaceChildren(paged("Tenants", [
    ["Name", (t) => link(`#/tenants/${t.id}`, t.name)],
    ["Display name", (t) => t.display_name],
    ["State", (t) => state(t.state)],
    ["Clusters", (t) => quota(t, "clusters")],
    ["Nodes", (t) => quota(t, "nodes")],
    ["GPUs", (t) => quota(t, "gpus")],
    ["Actions", (t) => suspendButton(a, t, load)],
  ], (cursor) => call("/v1/tenants", { query: { limit: 25, cursor } }), "No tenants yet."));
  load();
  return h("section", { "data-title": "Tenants" }, h("h1", {}, "Tenants"), list);
}

export function tenantPage(a, id) {
  const head = h("div");
  const title = h("h1", {}, "Tenant");
  const load = () => fill(head, async () => {
    const t = await call(`/v1/tenants/${id}`);
    title.textContent = `Tenant ${t.display_name || t.name}`;
    return [
      dl([
        ["Name", t.name], ["Id", t.id], ["State", state(t.state)],
        ["Clusters (used / quota)", quota(t, "clusters")], ["Nodes (used / quota)", quota(t, "nodes")],
        ["GPUs (used / quota)", quota(t, "gpus")], ["Created", time(t.created_at)],
      ]),
      suspendButton(a, t, load),
    ];
  }, "Loading the tenant");
  load();
  const clusters = paged("Clusters", [
    ["Name", (c) => link(`#/tenants/${id}/clusters/${c.id}`, c.name)],
    ["Kind", (c) => c.kind],
    ["Phase", (c) => state(c.status.phase)],
    ["Pools", (c) => c.node_pools.map((p) => `${p.name}: ${p.count}× ${p.machine_class}`).join(", ")],
    ["Created", (c) => time(c.created_at)],
  ], (cursor) => call(`/v1/tenants/${id}/clusters`, { query: { limit: 25, cursor } }), "This tenant has no clusters.");
  return h("section", { "data-title": "Tenant" },
    a.tenants ? h("p", {}, link("#/tenants", "← Tenants")) : null,
    title, head, h("h2", {}, "Clusters"), clusters, null);
}
