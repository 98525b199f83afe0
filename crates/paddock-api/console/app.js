// The console's shell: sign-in, the pages a role can use, hash routes (#/fleet, ...).
import { call, claims, clearToken, setToken, token, ApiError, SIGNED_OUT } from "./api.js";
import { beginSignIn, finishSignIn, oidcConfig, takeCallback } from "./oidc.js";
import { h, problem } from "./ui.js";
import { fleetPage } from "./fleet.js";
import { machinePage } from "./machine.js";
import { tenantsPage, tenantPage } from "./tenants.js";
import { clusterPage } from "./cluster.js";
import { usagePage } from "./usage.js";
import { auditPage } from "./audit.js";

const $ = (id) => document.getElementById(id);

// What each role may use, as the API authorizes it (docs/console.md); a page no role of the
// token can use is not offered.
export function abilities(c) {
  const has = (...roles) => c.roles.some((r) => roles.includes(r));
  const provider = has("provider:admin", "provider:operator", "billing:reader");
  return {
    provider,
    tenantId: provider ? null : c.tenantId,
    fleet: has("provider:admin", "provider:operator"),
    tenants: provider,
    usage: has("provider:admin", "provider:operator", "billing:reader", "tenant:admin", "tenant:member"),
    audit: has("provider:admin", "provider:operator", "tenant:admin"),
    clusters: has("provider:admin", "provider:operator", "tenant:admin", "tenant:member"),
    manageTenants: has("provider:admin"),
    periods: has("provider:admin", "provider:operator", "billing:reader"),
    writeClusters: has("tenant:admin"),
  };
}

const routes = [
  [/^#\/fleet$/, (a) => a.fleet && fleetPage(a)],
  [/^#\/machines\/([^/]+)$/, (a, id) => a.fleet && machinePage(a, id)],
  [/^#\/tenants$/, (a) => a.tenants && tenantsPage(a)],
  [/^#\/tenants\/([^/]+)$/, (a, id) => (a.tenants || a.tenantId === id) && tenantPage(a, id)],
  [/^#\/tenants\/([^/]+)\/clusters\/([^/]+)$/, (a, t, c) => a.clusters && clusterPage(a, t, c)],
  [/^#\/usage$/, (a) => a.usage && usagePage(a)],
  [/^#\/audit$/, (a) => a.audit && auditPage(a)],
];

function home(a) {
  if (a.fleet) return "#/fleet";
  if (a.tenants) return "#/tenants";
  if (a.tenantId) return `#/tenants/${a.tenantId}`;
  return "#/usage";
}

function nav(a) {
  const items = [
    a.fleet && ["#/fleet", "Fleet"],
    a.tenants && ["#/tenants", "Tenants"],
    !a.tenants && a.tenantId && [`#/tenants/${a.tenantId}`, "Tenant"],
    a.usage && ["#/usage", "Usage"],
    a.audit && ["#/audit", "Audit"],
  ].filter(Boolean);
  const here = location.hash;
  $("nav").replaceChildren(
    h("ul", {}, items.map(([href, label]) =>
      h("li", {}, h("a", { href, "aria-current": here.startsWith(href) ? "page" : null }, label)))),
  );
}

function route() {
  const c = claims();
  if (!token() || !c) return showSignIn();
  const a = abilities(c);
  $("sign-in").hidden = true;
  $("nav").hidden = false;
  $("who").hidden = false;
  $("who-text").textContent = `${c.sub || "?"} · ${c.roles.join(", ")}`;
  if (!location.hash || location.hash === "#" || location.hash === "#/") {
    location.replace(home(a));
    return;
  }
  nav(a);
  const page = $("page");
  for (const [re, make] of routes) {
    const m = location.hash.match(re);
    if (!m) continue;
    const view = make(a, ...m.slice(1).map(decodeURIComponent));
    if (view) {
      page.replaceChildren(view);
      document.title = `${view.dataset.title || "paddock"} · paddock console`;
      return;
    }
    break;
  }
  page.replaceChildren(h("h1", {}, "Not available"), h("p", {}, "This page does not exist or your role cannot use it."));
}

function showSignIn(message) {
  $("nav").hidden = true;
  $("who").hidden = true;
  $("page").replaceChildren();
  $("sign-in").hidden = false;
  if (message) {
    const err = $("sign-in-error");
    err.hidden = false;
    err.replaceChildren(message);
  }
  $("token").focus();
}

// A token is accepted once the API accepts it: one read its role allows. A refused one is dropped
// and the API's problem shown.
async function accept(value) {
  const err = $("sign-in-error");
  err.hidden = true;
  setToken(value);
  const c = claims();
  try {
    if (!c) throw new ApiError(401, { title: "Not a token", detail: "That is not a JWT (three base64url parts)." });
    const a = abilities(c);
    if (a.provider) await call("/v1/machine-classes", { query: { limit: 1 } });
    else if (a.tenantId) await call(`/v1/tenants/${a.tenantId}`);
    else throw new ApiError(403, { title: "No console role", detail: `The token's roles (${c.roles.join(", ") || "none"}) give no page here.` });
  } catch (e) {
    clearToken();
    showSignIn(problem(e));
    return;
  }
  $("token").value = "";
  location.hash = "";
  route();
  $("main").focus();
}

async function signIn(event) {
  event.preventDefault();
  await accept($("token").value.trim());
}

// The issuer's answer (if this load is one) leaves the address bar before anything else runs.
const callback = takeCallback();

// Sign-in through the provider's OIDC issuer, when paddock has one configured.
async function offerIssuer() {
  const oidc = await oidcConfig();
  if (oidc) {
    const button = $("oidc-sign-in");
    button.textContent = `Sign in with ${oidc.issuer}`;
    button.addEventListener("click", () =>
      beginSignIn(oidc).catch((e) => showSignIn(problem(e))));
    $("oidc").hidden = false;
  }
  if (!callback) return;
  try {
    if (!oidc) throw new ApiError(0, { title: "Sign-in refused", detail: "This paddock has no OIDC issuer configured." });
    await accept(await finishSignIn(oidc, callback));
  } catch (e) {
    clearToken();
    showSignIn(problem(e));
  }
}

$("sign-in-form").addEventListener("submit", signIn);
$("sign-out").addEventListener("click", () => {
  clearToken();
  location.hash = "";
  showSignIn();
});
// A 401 to a signed-in call: back to sign-in, saying why.
window.addEventListener(SIGNED_OUT, (event) => {
  showSignIn(h("div", { class: "error", role: "alert" },
    h("strong", {}, "Signed out"),
    h("p", {}, "The API no longer accepts your token (401): it has expired or been revoked. Sign in again."),
    event.detail?.problem?.detail ? h("p", {}, event.detail.problem.detail) : null));
});
window.addEventListener("hashchange", route);
if (callback) showSignIn();
else route();
offerIssuer();
