// Audit events with the API's filters, page by page.
import { call } from "./api.js";
import { h, paged, short, state, time } from "./ui.js";

const columns = [
  ["When", (e) => time(e.at)],
  ["Actor", (e) => (e.actor.roles.length ? `${e.actor.sub} (${e.actor.roles.join(", ")})` : e.actor.sub)],
  ["Action", (e) => e.action],
  ["Target", (e) => [`${e.target.type} `, short(e.target.id)]],
  ["Tenant", (e) => short(e.tenant_id)],
  ["Outcome", (e) => [state(e.outcome), e.code ? ` ${e.code}` : ""]],
  ["Request", (e) => short(e.request_id)],
];

export function auditPage(a) {
  const path = a.tenantId ? `/v1/tenants/${a.tenantId}/audit-events` : "/v1/audit-events";
  const field = (id, label, attrs = {}) => [h("label", { for: id }, label), h("input", { id, name: id, type: "text", ...attrs })];
  const outcome = h("select", { id: "audit-outcome", name: "outcome" },
    h("option", { value: "" }, "any"), h("option", { value: "success" }, "success"), h("option", { value: "failure" }, "failure"));
  const list = h("div");
  const form = h("form", { class: "filters" },
    field("audit-action", "Action", { placeholder: "e.g. tenant.suspend" }),
    field("audit-actor", "Actor"),
    field("audit-target", "Target id"),
    h("label", { for: "audit-outcome" }, "Outcome"), outcome,
    h("button", { type: "submit" }, "Filter"));
  const value = (id) => form.querySelector(`#${id}`).value.trim();
  const load = () => list.replaceChildren(paged("Audit events", columns, (cursor) => call(path, {
    query: { action: value("audit-action"), actor: value("audit-actor"), target_id: value("audit-target"), outcome: outcome.value, limit: 50, cursor },
  }), "No audit events match."));
  form.addEventListener("submit", (e) => { e.preventDefault(); load(); });
  load();
  return h("section", { "data-title": "Audit" }, h("h1", {}, "Audit events"), form, list);
}
