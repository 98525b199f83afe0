// One machine: its state and inventory, its health reports, and its custody ledger as a timeline,
// each wipe with its evidence and its verification.
import { call } from "./api.js";
import { dl, empty, fill, h, json, link, paged, short, state, time } from "./ui.js";

function facts(m) {
  return dl([
    ["State", state(m.state)],
    ["Class", m.machine_class],
    ["Tenant", m.tenant_id ? link(`#/tenants/${m.tenant_id}`, short(m.tenant_id)) : "—"],
    m.cluster_id && ["Cluster", link(`#/tenants/${m.tenant_id}/clusters/${m.cluster_id}`, short(m.cluster_id))],
    ["Node name", m.node_name],
    ["Health", m.health ? `${m.health.status} (${m.health.source}, observed ${m.health.observed_at})` : "no report"],
    ["Maintenance reason", m.maintenance_reason],
    ["Last error", m.last_error ? `${m.last_error.code}: ${m.last_error.message} (${m.last_error.at})` : null],
    ["BMC", m.bmc ? m.bmc.url : null],
    ["System UUID", m.system_uuid],
    ["Created", time(m.created_at)],
    ["Updated", time(m.updated_at)],
  ]);
}

// Per drive of a wipe report: what was wiped, how, its result and its read-back verification.
function verification(evidence) {
  const drives = Array.isArray(evidence.drives) ? evidence.drives : [];
  if (!drives.length) return null;
  return h("ul", { class: "drives", "aria-label": "Drives wiped" }, drives.map((d) => {
    const v = d.verification;
    const who = d.identity ? [d.identity.model, d.identity.serial].filter(Boolean).join(" ") : "";
    return h("li", {},
      h("strong", {}, who || d.id || "drive"), " ",
      d.method ? `${d.method}: ` : "", d.result ? state(d.result) : "", " ",
      v ? h("span", { class: "verified" }, `verified read-back: ${v.ranges} ranges, ${v.bytes_read} bytes, sha256 ${String(v.sha256).slice(0, 16)}…`)
        : h("span", { class: "unverified" }, "no read-back verification"),
      d.detail ? h("span", { class: "muted" }, ` ${d.detail}`) : null);
  }));
}

function entry(e) {
  const ev = e.evidence || {};
  const hasEvidence = Object.keys(ev).length > 0;
  return h("li", { class: "entry" },
    h("div", { class: "entry-head" },
      h("span", { class: "seq" }, `#${e.seq}`), " ", time(e.at), " ",
      e.from ? state(e.from) : "", e.from ? " → " : "", state(e.to)),
    h("p", {}, e.reason, h("span", { class: "muted" }, ` by ${e.actor}`)),
    verification(ev),
    hasEvidence ? h("details", {}, h("summary", {}, "Evidence"), json(ev)) : null);
}

async function ledger(id) {
  const c = await call(`/v1/machines/${id}/custody`);
  const status = c.verified
    ? h("p", { class: "ok" }, `Ledger verified: ${c.items.length} entries, MAC chain intact${c.unsealed ? `, ${c.unsealed} not sealed yet` : ""}.`)
    : h("p", { class: "error", role: "alert" }, `Ledger NOT verified: ${c.finding || "unknown finding"}${c.first_bad_entry ? ` (first bad entry ${c.first_bad_entry})` : ""}.`);
  if (!c.items.length) return [status, empty("No custody entries yet.")];
  return [status, h("ol", { class: "timeline", "aria-label": "Custody ledger" }, [...c.items].reverse().map(entry))];
}

// What operators, the BMC and the tenant's cluster said about the machine's health, newest first.
function healthReports(id) {
  const checks = (r) => r.checks.map((c) => `${c.name}: ${c.status}${c.detail ? ` (${c.detail})` : ""}`).join("; ");
  return paged("Health reports", [
    ["Observed", (r) => time(r.observed_at)],
    ["Status", (r) => state(r.status)],
    ["Source", (r) => (r.reporter ? `${r.source} (${r.reporter})` : r.source)],
    ["Checks", (r) => checks(r) || "—"],
  ], (cursor) => call(`/v1/machines/${id}/health-reports`, { query: { limit: 20, cursor } }), "No health reports recorded.");
}

export function machinePage(a, id) {
  const head = h("div");
  const inv = h("div");
  const led = h("div");
  const title = h("h1", {}, "Machine");
  fill(head, async () => {
    const m = await call(`/v1/machines/${id}`);
    title.textContent = `Machine ${m.name}`;
    inv.replaceChildren(
      Object.keys(m.inventory || {}).length ? json(m.inventory) : empty("No inventory reported yet."));
    return facts(m);
  }, "Loading the machine");
  fill(led, () => ledger(id), "Loading the custody ledger");
  return h("section", { "data-title": "Machine" },
    h("p", {}, link("#/fleet", "← Fleet")), title, head,
    h("h2", {}, "Inventory"), inv,
    h("h2", {}, "Health reports"), healthReports(id),
    h("h2", {}, "Custody ledger"), led);
}
