// Sign-in through the provider's OIDC issuer (docs/console.md): the authorization code flow with
// PKCE (S256), the browser a public client. The verifier, state and nonce live in this tab's
// session storage for the round trip only; the code and state leave the address bar as soon as
// the page loads; the code is exchanged at the token endpoint from here (the console's policy lets
// it connect to the issuer's one origin), and the access token becomes the bearer token.
import { ApiError } from "./api.js";

const FLOW = "paddock.console.oidc";

// What paddock says of the issuer (config.json): null when sign-in through it is not configured.
export async function oidcConfig() {
  try {
    const resp = await fetch("config.json", { credentials: "omit", cache: "no-store" });
    return resp.ok ? (await resp.json()).oidc || null : null;
  } catch {
    return null;
  }
}

function refused(title, detail) {
  return new ApiError(0, { title, detail });
}

function base64url(bytes) {
  return btoa(String.fromCharCode(...new Uint8Array(bytes))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function random() {
  return base64url(crypto.getRandomValues(new Uint8Array(32)));
}

async function challenge(verifier) {
  return base64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
}

function payload(jwt) {
  try {
    const part = jwt.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4)));
  } catch {
    return null;
  }
}

const bare = (s) => String(s || "").replace(/\/+$/, "");

// The issuer's discovery document, checked: its issuer is the configured one, and its token
// endpoint is on the origin the console's policy allows.
async function discover(oidc) {
  let doc;
  try {
    const resp = await fetch(oidc.discovery_url, { credentials: "omit", referrerPolicy: "no-referrer", cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    doc = await resp.json();
  } catch (e) {
    throw refused("The issuer cannot be reached", `Reading ${oidc.discovery_url} failed: ${e.message}.`);
  }
  if (bare(doc.issuer) !== bare(oidc.issuer)) {
    throw refused("Wrong issuer", `The discovery document names ${doc.issuer}, not ${oidc.issuer}.`);
  }
  const origin = new URL(oidc.discovery_url).origin;
  let token;
  try {
    token = new URL(doc.token_endpoint);
    new URL(doc.authorization_endpoint);
  } catch {
    throw refused("Unusable issuer", "The discovery document lacks an authorization or token endpoint.");
  }
  if (token.origin !== origin) {
    throw refused("Unusable issuer", `Its token endpoint ${token.origin} is not on ${origin}, the one origin the console may call.`);
  }
  return doc;
}

// Sends the browser to the issuer, with a fresh state, nonce and PKCE verifier kept for the
// way back.
export async function beginSignIn(oidc) {
  const doc = await discover(oidc);
  const flow = { state: random(), nonce: random(), verifier: random() };
  sessionStorage.setItem(FLOW, JSON.stringify(flow));
  const url = new URL(doc.authorization_endpoint);
  const params = {
    response_type: "code",
    client_id: oidc.client_id,
    redirect_uri: oidc.redirect_uri,
    scope: oidc.scope,
    state: flow.state,
    nonce: flow.nonce,
    code_challenge: await challenge(flow.verifier),
    code_challenge_method: "S256",
  };
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  location.assign(url.href);
}

// The issuer's answer in the address bar, taken out of it at once (and the round trip's secrets
// out of session storage); null when the page was not loaded by the issuer.
export function takeCallback() {
  const params = new URLSearchParams(location.search);
  if (!params.has("code") && !params.has("error")) return null;
  history.replaceState(null, "", location.pathname + location.hash);
  let flow = null;
  try {
    flow = JSON.parse(sessionStorage.getItem(FLOW));
  } catch {
    /* no flow */
  }
  sessionStorage.removeItem(FLOW);
  return { params, flow };
}

// The access token of the issuer's answer: the state must be this tab's, then the code is
// exchanged with the verifier, and the ID token must carry this tab's nonce.
export async function finishSignIn(oidc, { params, flow }) {
  if (!flow || !flow.state || params.get("state") !== flow.state) {
    throw refused("Sign-in refused", "The issuer's answer does not match a sign-in started in this tab (state mismatch). Sign in again.");
  }
  if (params.has("error")) {
    throw refused("The issuer refused the sign-in", `${params.get("error")}${params.has("error_description") ? `: ${params.get("error_description")}` : ""}`);
  }
  const doc = await discover(oidc);
  const body = new URLSearchParams({
    grant_type: "authorization_code",
    code: params.get("code"),
    redirect_uri: oidc.redirect_uri,
    client_id: oidc.client_id,
    code_verifier: flow.verifier,
  });
  let resp;
  let answer = {};
  try {
    resp = await fetch(doc.token_endpoint, {
      method: "POST",
      headers: { "Content-Type": "application/x-www-form-urlencoded", Accept: "application/json" },
      body,
      credentials: "omit",
      referrerPolicy: "no-referrer",
      cache: "no-store",
    });
    answer = await resp.json().catch(() => ({}));
  } catch (e) {
    throw refused("The issuer cannot be reached", `The token endpoint failed: ${e.message}.`);
  }
  if (!resp.ok) {
    const why = [answer.error, answer.error_description].filter(Boolean).join(": ") || `HTTP ${resp.status}`;
    throw refused("The issuer refused the code", `${why} (HTTP ${resp.status}).`);
  }
  if (!answer.access_token || String(answer.token_type).toLowerCase() !== "bearer") {
    throw refused("The issuer gave no access token", "The token endpoint's answer has no bearer access_token.");
  }
  const id = payload(answer.id_token);
  if (!id || id.nonce !== flow.nonce) {
    throw refused("Sign-in refused", "The issuer's ID token does not carry this sign-in's nonce.");
  }
  return answer.access_token;
}
