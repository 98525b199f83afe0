// The operator console in a real browser (Debian's chromium, driven by playwright-core) against
// `paddock dev`: scripts/console-browser runs it with B, TOKEN, TENANT_TOKEN and TID set.
// Each page's screenshot goes to PADDOCK_CONSOLE_SCREENSHOTS. Waits are conditions with
// deadlines (Playwright's auto-waiting), never sleeps.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { join } from "node:path";
import { readFile } from "node:fs/promises";

const require = createRequire(join(process.env.PADDOCK_CONSOLE_MODULES, "package.json"));
const { chromium } = require("playwright-core");

const { B, TOKEN, TENANT_TOKEN, TID } = process.env;
const SHOTS = process.env.PADDOCK_CONSOLE_SCREENSHOTS;
const CONSOLE = `${B}/console/`;

let browser;
const problems = [];

async function api(path, token, init = {}) {
  const resp = await fetch(`${B}${path}`, {
    ...init,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json", ...(init.headers || {}) },
  });
  const text = await resp.text();
  return { status: resp.status, body: text ? JSON.parse(text) : null };
}

// A page of its own context (its own session storage), failing the run on any script error or
// CSP violation it reports.
async function newPage() {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
  const page = await context.newPage();
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && !/status of 40[13]/.test(m.text())) problems.push(`console error: ${m.text()}`);
  });
  return page;
}

async function signIn(page, token) {
  await page.goto(CONSOLE);
  await page.getByLabel("Bearer token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
}

async function shot(page, name) {
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

// Every form control has a label; every page is reachable from the keyboard (checked per page).
async function assertLabelled(page) {
  const unlabelled = await page.evaluate(() =>
    [...document.querySelectorAll("input, select, textarea")]
      .filter((el) => !el.labels?.length && !el.getAttribute("aria-label"))
      .map((el) => el.id || el.name || el.outerHTML.slice(0, 60)));
  assert.deepEqual(unlabelled, [], "every form control has a label");
}

before(async () => {
  for (const name of ["B", "TOKEN", "TENANT_TOKEN", "TID", "PADDOCK_CONSOLE_SCREENSHOTS"]) {
    assert.ok(process.env[name], `${name} is set`);
  }
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
});

test("the console is served with its security headers", async () => {
  const resp = await fetch(CONSOLE);
  assert.equal(resp.status, 200);
  const csp = resp.headers.get("content-security-policy");
  assert.match(csp, /script-src 'self'/);
  assert.match(csp, /frame-ancestors 'none'/);
  assert.equal(resp.headers.get("referrer-policy"), "no-referrer");
});

test("a bad token shows the sign-in error", async () => {
  const page = await newPage();
  const [head, body] = TOKEN.split(".");
  await signIn(page, `${head}.${body}.c2lnbmF0dXJlLW5vdC12YWxpZA`);
  const error = page.locator("#sign-in-error");
  await error.waitFor({ state: "visible" });
  assert.match(await error.innerText(), /401/);
  assert.equal(await page.locator("#nav").isVisible(), false, "no page is offered");
  assert.equal(await page.evaluate(() => sessionStorage.length), 0, "a refused token is not kept");
  await shot(page, "sign-in-error");
  await page.context().close();
});

test("the provider sees the fleet, a machine's ledger, a cluster's operation and usage", async () => {
  const page = await newPage();
  await signIn(page, TOKEN);
  await page.waitForURL(/#\/fleet$/);
  // The fleet: the chart of machines by class and state, and the inventory table.
  await page.locator("svg.chart rect.bar").first().waitFor();
  await page.getByRole("table", { name: "Machines", exact: true }).waitFor();
  assert.equal(await page.evaluate(() => localStorage.length), 0, "nothing in local storage");
  assert.ok(!page.url().includes(TOKEN), "the token is in no URL");
  await assertLabelled(page);
  await shot(page, "fleet");

  // A machine and its custody ledger.
  await page.getByRole("table", { name: "Machines", exact: true }).getByRole("link", { name: "node-101" }).click();
  await page.getByRole("heading", { name: "Machine node-101" }).waitFor();
  await page.locator("ol.timeline li.entry").first().waitFor();
  await page.getByText(/^Ledger verified/).waitFor();
  await shot(page, "machine");

  // A cluster created through the API, followed on its page until its operation succeeds.
  const created = await api(`/v1/tenants/${TID}/clusters`, TENANT_TOKEN, {
    method: "POST",
    body: JSON.stringify({
      name: "console-test", kind: "slurm", isolation: "private-nodes",
      node_pools: [{ name: "gpu", machine_class: "gpu-h100x8", count: 1, role: "system" }],
    }),
  });
  assert.equal(created.status, 202, JSON.stringify(created.body));
  const clusterId = created.body.cluster?.id ?? created.body.id;
  assert.ok(clusterId, `a cluster id in ${JSON.stringify(created.body)}`);
  await page.goto(`${CONSOLE}#/tenants/${TID}/clusters/${clusterId}`);
  await page.getByRole("heading", { name: "Cluster console-test" }).waitFor();
  await page.locator('article.operation[data-state="succeeded"]').first().waitFor({ timeout: 150_000 });
  await page.getByRole("heading", { name: "Cluster console-test" }).waitFor();
  await shot(page, "cluster");

  // Tenants and audit events.
  await page.getByRole("link", { name: "Tenants", exact: true }).click();
  await page.getByRole("table", { name: "Tenants" }).getByRole("link", { name: "acme" }).waitFor();
  await shot(page, "tenants");
  await page.getByRole("link", { name: "Audit", exact: true }).click();
  await page.getByRole("table", { name: "Audit events" }).getByText("cluster.create").first().waitFor();
  await assertLabelled(page);
  await shot(page, "audit");

  // Usage: the chart from the aggregate endpoint, and a CSV export downloaded.
  await page.getByRole("link", { name: "Usage", exact: true }).click();
  await page.getByRole("heading", { name: "Totals of the range" }).waitFor();
  await page.locator(".facts dt", { hasText: "Node hours" }).waitFor();
  await page.getByRole("table", { name: "Billing periods" }).waitFor();
  await assertLabelled(page);
  const [download] = await Promise.all([
    page.waitForEvent("download"),
    page.getByRole("button", { name: "Export CSV" }).click(),
  ]);
  assert.match(download.suggestedFilename(), /^paddock-usage-.*\.csv$/);
  const path = join(SHOTS, download.suggestedFilename());
  await download.saveAs(path);
  const csv = await readFile(path, "utf8");
  assert.match(csv.split("\n")[0], /,/, `a CSV header line: ${csv.slice(0, 200)}`);
  await page.getByText("CSV export written.").waitFor();
  await shot(page, "usage");

  // Keyboard: from a fresh load, Tab reaches the skip link first, then the navigation.
  await page.reload();
  await page.getByRole("heading", { name: "Usage" }).waitFor();
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), "Skip to content");
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), "Fleet");
  await page.context().close();
});

test("a tenant sees its own tenant only, and no fleet", async () => {
  const other = await api("/v1/tenants", TOKEN, {
    method: "POST",
    body: JSON.stringify({ name: "console-other", display_name: "Other Co", quotas: {} }),
  });
  assert.ok([201, 409].includes(other.status), JSON.stringify(other.body));
  const page = await newPage();
  await signIn(page, TENANT_TOKEN);
  await page.waitForURL(new RegExp(`#/tenants/${TID}$`));
  await page.getByRole("heading", { name: "Tenant ACME Research" }).waitFor();
  const nav = await page.locator("#nav").innerText();
  assert.ok(!/Fleet|Tenants/.test(nav), `no fleet or tenant list in the navigation: ${nav}`);
  assert.ok(!(await page.content()).includes("console-other"), "no other tenant on the page");
  // The pages a tenant cannot use are not offered, and the API refuses them too.
  await page.goto(`${CONSOLE}#/fleet`);
  await page.getByRole("heading", { name: "Not available" }).waitFor();
  const status = await page.evaluate(async () => {
    const token = sessionStorage.getItem("paddock.console.token");
    return (await fetch("/v1/machines", { headers: { Authorization: `Bearer ${token}` } })).status;
  });
  assert.equal(status, 403, "a tenant token gets 403 on the fleet");
  await page.goto(`${CONSOLE}#/tenants/${TID}`);
  await page.getByRole("heading", { name: "Tenant ACME Research" }).waitFor();
  await shot(page, "tenant");
  await page.goto(`${CONSOLE}#/usage`);
  await page.locator(".facts dt", { hasText: "Node hours" }).waitFor();
  assert.equal(await page.locator('#group-by option[value="tenant_id"]').count(), 0, "no by-tenant view");
  await shot(page, "tenant-usage");
  await page.context().close();
});

test("no page reported a script error or a CSP violation", () => {
  assert.deepEqual(problems, []);
});
