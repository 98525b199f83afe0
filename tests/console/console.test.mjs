// The operator console in a real browser (Debian's chromium, driven by playwright-core) against
// `paddock dev`: scripts/console-browser runs it with B, TOKEN, TENANT_TOKEN and TID set, and
// PADDOCK_CONSOLE_IDP_PORT: the port of the test's OIDC provider (oidc-provider.mjs, started here),
// which `paddock dev` was given as its JWT issuer and the console's (PADDOCK_CONSOLE_OIDC_*).
// Each page's screenshot goes to PADDOCK_CONSOLE_SCREENSHOTS. Waits are conditions with
// deadlines (Playwright's auto-waiting), never sleeps.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { join } from "node:path";
import { readFile } from "node:fs/promises";
import { startProvider } from "./oidc-provider.mjs";

const require = createRequire(join(process.env.PADDOCK_CONSOLE_MODULES, "package.json"));
const { chromium } = require("playwright-core");

const { B, TOKEN, TENANT_TOKEN, TID } = process.env;
const SHOTS = process.env.PADDOCK_CONSOLE_SCREENSHOTS;
const CONSOLE = `${B}/console/`;
const IDP_PORT = Number(process.env.PADDOCK_CONSOLE_IDP_PORT);

let browser;
let idp;
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
    // A refused token (401, 403) or code (400, the issuer's) is logged by the browser; expected.
    if (m.type() === "error" && !/status of 40[013]/.test(m.text())) problems.push(`console error: ${m.text()}`);
  });
  return page;
}

async function signIn(page, token) {
  await page.goto(CONSOLE);
  await page.getByLabel("Bearer token").fill(token);
  await page.getByRole("button", { name: "Sign in", exact: true }).click();
}

// paddock fetched the provider's keys at its start, before the provider listened, and fetches
// them again for an unknown key id at most every 10 s: poll (with a deadline) until it accepts a
// token the provider signed. By the first sign-in through it that is long past; it is checked
// rather than assumed.
let accepted;
function issuerAccepted() {
  accepted ??= (async () => {
    const now = Math.floor(Date.now() / 1000);
    const probe = idp.sign({ iss: idp.issuer, sub: "probe", aud: "paddock", iat: now, exp: now + 120, roles: ["provider:admin"] });
    const deadline = Date.now() + 60_000;
    for (;;) {
      const { status } = await api("/v1/machine-classes?limit=1", probe);
      if (status === 200) return;
      assert.ok(Date.now() < deadline, `paddock still refuses the provider's tokens (${status})`);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  })();
  return accepted;
}

// Through the test's OIDC provider: the console's button, the provider's page, `user`'s link.
async function signInWithIssuer(page, user) {
  await issuerAccepted();
  await page.goto(CONSOLE);
  await page.getByRole("button", { name: `Sign in with ${idp.issuer}` }).click();
  await page.waitForURL(`${idp.issuer}/authorize?**`);
  await page.getByRole("link", { name: `Sign in as ${user}` }).click();
}

// What the console keeps of a sign-in once it is over: the token only, no round-trip secret.
async function kept(page) {
  return page.evaluate(() => ({
    token: sessionStorage.getItem("paddock.console.token"),
    flow: sessionStorage.getItem("paddock.console.oidc"),
    local: localStorage.length,
  }));
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
  for (const name of ["B", "TOKEN", "TENANT_TOKEN", "TID", "PADDOCK_CONSOLE_SCREENSHOTS", "PADDOCK_CONSOLE_IDP_PORT"]) {
    assert.ok(process.env[name], `${name} is set`);
  }
  idp = await startProvider({
    port: IDP_PORT,
    clientId: "paddock-console",
    redirectUri: CONSOLE,
    audience: "paddock",
    users: {
      provider: { roles: ["provider:admin"] },
      tenant: { roles: ["tenant:member"], tenant_id: TID },
      replayed: { roles: ["provider:admin"], idTokenNonce: "the-nonce-of-another-sign-in" },
    },
  });
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  await idp?.close();
});

test("the console is served with its security headers", async () => {
  const resp = await fetch(CONSOLE);
  assert.equal(resp.status, 200);
  const csp = resp.headers.get("content-security-policy");
  assert.match(csp, /script-src 'self'/);
  assert.match(csp, /frame-ancestors 'none'/);
  assert.equal(resp.headers.get("referrer-policy"), "no-referrer");
  // The issuer's origin, and nothing broader, besides paddock's own.
  assert.match(csp, new RegExp(`connect-src 'self' http://127\\.0\\.0\\.1:${IDP_PORT};`));
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

  // A machine, its health reports and its custody ledger.
  await page.getByRole("table", { name: "Machines", exact: true }).getByRole("link", { name: "node-101" }).click();
  await page.getByRole("heading", { name: "Machine node-101" }).waitFor();
  await page.locator("ol.timeline li.entry").first().waitFor();
  await page.getByText(/^Ledger verified/).waitFor();
  await page.getByText("No health reports recorded.").waitFor();
  const machine = page.url().split("#/machines/")[1];
  const report = { status: "degraded", checks: [{ name: "fan.3", status: "degraded", detail: "2,100 rpm" }] };
  const recorded = await api(`/v1/machines/${machine}/health-reports`, TOKEN, { method: "POST", body: JSON.stringify(report) });
  assert.equal(recorded.status, 201, JSON.stringify(recorded.body));
  await page.reload();
  await page.getByRole("table", { name: "Health reports" }).getByText("fan.3: degraded (2,100 rpm)").waitFor();
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

test("the provider signs in through the OIDC issuer, sees the fleet, and is signed out by a 401", async () => {
  const page = await newPage();
  await signInWithIssuer(page, "provider");
  await page.waitForURL(/\/console\/#\/fleet$/);
  await page.locator("svg.chart rect.bar").first().waitFor();
  assert.ok(!/[?&](code|state)=/.test(page.url()), `no code or state in the address bar: ${page.url()}`);
  const { token, flow, local } = await kept(page);
  assert.equal(JSON.parse(Buffer.from(token.split(".")[0], "base64url")).alg, "RS256", "the issuer's token is the bearer");
  assert.equal(flow, null, "the verifier, state and nonce are gone after the round trip");
  assert.equal(local, 0, "nothing in local storage");
  const exchange = idp.seen.token.at(-1);
  assert.ok(exchange.code_verifier && exchange.grant_type === "authorization_code", JSON.stringify(exchange));
  await assertLabelled(page);
  await shot(page, "oidc-fleet");

  // The token stops being accepted (as when it expires): the next call's 401 signs the user out.
  await page.evaluate(() => {
    const [head, body] = sessionStorage.getItem("paddock.console.token").split(".");
    sessionStorage.setItem("paddock.console.token", `${head}.${body}.c2lnbmF0dXJlLW5vdC12YWxpZA`);
  });
  await page.getByRole("link", { name: "Tenants", exact: true }).click();
  const error = page.locator("#sign-in-error");
  await error.waitFor({ state: "visible" });
  assert.match(await error.innerText(), /Signed out[\s\S]*401/);
  assert.equal(await page.locator("#nav").isVisible(), false, "no page is offered");
  assert.equal(await page.locator("#who").isVisible(), false, "no user or sign-out is shown");
  assert.equal((await kept(page)).token, null, "the refused token is forgotten");
  await shot(page, "oidc-signed-out");
  await page.context().close();
});

test("a tenant member signs in through the OIDC issuer and sees its tenant, read-only, no fleet", async () => {
  const page = await newPage();
  await signInWithIssuer(page, "tenant");
  await page.waitForURL(new RegExp(`/console/#/tenants/${TID}$`));
  await page.getByRole("heading", { name: "Tenant ACME Research" }).waitFor();
  const nav = await page.locator("#nav").innerText();
  assert.ok(!/Fleet|Tenants|Audit/.test(nav), `no fleet, tenant list or audit for a member: ${nav}`);
  assert.match(await page.locator("#who-text").innerText(), /idp-tenant · tenant:member/);
  await page.goto(`${CONSOLE}#/fleet`);
  await page.getByRole("heading", { name: "Not available" }).waitFor();
  await page.context().close();
});

test("an answer with another state is refused without exchanging the code", async () => {
  const page = await newPage();
  const exchanges = idp.seen.token.length;
  await issuerAccepted();
  await page.goto(CONSOLE);
  await page.getByRole("button", { name: `Sign in with ${idp.issuer}` }).click();
  await page.waitForURL(`${idp.issuer}/authorize?**`);
  const href = await page.getByRole("link", { name: "Sign in as provider" }).getAttribute("href");
  const forged = new URL(href);
  forged.searchParams.set("state", "forged-state");
  await page.goto(forged.href);
  const error = page.locator("#sign-in-error");
  await error.waitFor({ state: "visible" });
  assert.match(await error.innerText(), /state mismatch/);
  assert.equal(idp.seen.token.length, exchanges, "the code was not sent to the token endpoint");
  assert.ok(!page.url().includes("code="), `no code in the address bar: ${page.url()}`);
  assert.deepEqual(await kept(page), { token: null, flow: null, local: 0 });
  await shot(page, "oidc-state-error");
  await page.context().close();
});

test("a wrong PKCE verifier is refused by the issuer and shown as the sign-in error", async () => {
  const page = await newPage();
  // The exchange goes out with another verifier than the one the challenge was made of.
  await page.route(`${idp.issuer}/token`, (route) => {
    const form = new URLSearchParams(route.request().postData());
    form.set("code_verifier", "a-verifier-that-is-not-the-one-the-challenge-was-made-from");
    return route.continue({ postData: form.toString() });
  });
  await signInWithIssuer(page, "provider");
  const error = page.locator("#sign-in-error");
  await error.waitFor({ state: "visible" });
  assert.match(await error.innerText(), /refused the code[\s\S]*PKCE verification failed/);
  assert.equal(await page.locator("#nav").isVisible(), false, "no page is offered");
  assert.deepEqual(await kept(page), { token: null, flow: null, local: 0 });
  await page.context().close();
});

test("an ID token without this sign-in's nonce is refused", async () => {
  const page = await newPage();
  await signInWithIssuer(page, "replayed");
  const error = page.locator("#sign-in-error");
  await error.waitFor({ state: "visible" });
  assert.match(await error.innerText(), /nonce/);
  assert.deepEqual(await kept(page), { token: null, flow: null, local: 0 });
  await page.context().close();
});

test("no page reported a script error or a CSP violation", () => {
  assert.deepEqual(problems, []);
});
