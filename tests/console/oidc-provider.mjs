// A small OpenID Connect provider for the console's browser tests: discovery, JWKS, an /authorize
// page with one link per user (each a code for that user), and a /token endpoint that checks the
// client, the redirect URI and the PKCE verifier (S256) and answers RS256 tokens with CORS for the
// console's origin. Each code is good once. Node's own http and crypto only.
import { createHash, generateKeyPairSync, randomBytes, sign } from "node:crypto";
import { createServer } from "node:http";

const b64url = (buf) => Buffer.from(buf).toString("base64url");

// `users`: name -> the access token's claims (roles, tenant_id, ...), and `idTokenNonce` to give
// the ID token another nonce than the request's (a replayed answer). Resolves once it listens on
// `port`.
export async function startProvider({ port, clientId, redirectUri, audience, users, lifetime = 300 }) {
  const issuer = `http://127.0.0.1:${port}`;
  const consoleOrigin = new URL(redirectUri).origin;
  const { privateKey, publicKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  const kid = b64url(randomBytes(8));
  const jwk = { ...publicKey.export({ format: "jwk" }), kid, alg: "RS256", use: "sig" };
  const codes = new Map();
  const seen = { token: [] };

  const jwt = (claims) => {
    const head = b64url(JSON.stringify({ alg: "RS256", typ: "JWT", kid }));
    const body = b64url(JSON.stringify(claims));
    const signature = sign("sha256", Buffer.from(`${head}.${body}`), privateKey);
    return `${head}.${body}.${b64url(signature)}`;
  };

  const json = (res, status, body) => {
    res.writeHead(status, {
      "Content-Type": "application/json",
      "Cache-Control": "no-store",
      "Access-Control-Allow-Origin": consoleOrigin,
    });
    res.end(JSON.stringify(body));
  };

  const authorize = (url, res) => {
    const q = url.searchParams;
    const bad =
      (q.get("response_type") !== "code" && "response_type must be code") ||
      (q.get("client_id") !== clientId && "unknown client") ||
      (q.get("redirect_uri") !== redirectUri && "unregistered redirect_uri") ||
      (q.get("code_challenge_method") !== "S256" && "PKCE S256 is required") ||
      (!q.get("code_challenge") && "PKCE S256 is required") ||
      (!q.get("state") && "state is required") ||
      (!q.get("nonce") && "nonce is required") ||
      (!q.get("scope")?.split(" ").includes("openid") && "scope must include openid");
    if (bad) {
      res.writeHead(400, { "Content-Type": "text/plain" });
      return res.end(bad);
    }
    const links = Object.keys(users).map((user) => {
      const code = b64url(randomBytes(24));
      codes.set(code, { user, challenge: q.get("code_challenge"), nonce: q.get("nonce"), scope: q.get("scope") });
      const back = new URL(redirectUri);
      back.searchParams.set("code", code);
      back.searchParams.set("state", q.get("state"));
      return `<li><a href="${back.href.replace(/&/g, "&amp;")}">Sign in as ${user}</a></li>`;
    });
    res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
    res.end(`<!doctype html><title>Test IdP</title><h1>Test IdP</h1><ul>${links.join("")}</ul>`);
  };

  const token = (form, res) => {
    seen.token.push(Object.fromEntries(form));
    const grant = codes.get(form.get("code"));
    codes.delete(form.get("code"));
    const fail = (error, description) => json(res, 400, { error, error_description: description });
    if (form.get("grant_type") !== "authorization_code") return fail("unsupported_grant_type", "authorization_code only");
    if (!grant) return fail("invalid_grant", "unknown or used code");
    if (form.get("client_id") !== clientId) return fail("invalid_client", "unknown client");
    if (form.get("redirect_uri") !== redirectUri) return fail("invalid_grant", "redirect_uri differs");
    const verifier = form.get("code_verifier") || "";
    if (b64url(createHash("sha256").update(verifier).digest()) !== grant.challenge) {
      return fail("invalid_grant", "PKCE verification failed");
    }
    const now = Math.floor(Date.now() / 1000);
    const sub = `idp-${grant.user}`;
    const base = { iss: issuer, sub, iat: now, exp: now + lifetime };
    const { idTokenNonce, ...claims } = users[grant.user];
    json(res, 200, {
      token_type: "Bearer",
      expires_in: lifetime,
      access_token: jwt({ ...base, aud: audience, scope: grant.scope, ...claims }),
      id_token: jwt({ ...base, aud: clientId, nonce: idTokenNonce ?? grant.nonce }),
    });
  };

  const server = createServer((req, res) => {
    const url = new URL(req.url, issuer);
    if (req.method === "OPTIONS") {
      res.writeHead(204, {
        "Access-Control-Allow-Origin": consoleOrigin,
        "Access-Control-Allow-Methods": "GET, POST",
        "Access-Control-Allow-Headers": "Content-Type, Accept",
      });
      return res.end();
    }
    if (req.method === "GET" && url.pathname === "/.well-known/openid-configuration") {
      return json(res, 200, {
        issuer,
        authorization_endpoint: `${issuer}/authorize`,
        token_endpoint: `${issuer}/token`,
        jwks_uri: `${issuer}/jwks`,
        response_types_supported: ["code"],
        grant_types_supported: ["authorization_code"],
        code_challenge_methods_supported: ["S256"],
        id_token_signing_alg_values_supported: ["RS256"],
        subject_types_supported: ["public"],
        token_endpoint_auth_methods_supported: ["none"],
      });
    }
    if (req.method === "GET" && url.pathname === "/jwks") return json(res, 200, { keys: [jwk] });
    // Its page's icon: none (a 404 would be logged by the browser as an error).
    if (req.method === "GET" && url.pathname === "/favicon.ico") return res.writeHead(204).end();
    if (req.method === "GET" && url.pathname === "/authorize") return authorize(url, res);
    if (req.method === "POST" && url.pathname === "/token") {
      let body = "";
      req.on("data", (chunk) => (body += chunk));
      req.on("end", () => token(new URLSearchParams(body), res));
      return;
    }
    res.writeHead(404, { "Content-Type": "text/plain" });
    res.end("not found");
  });
  await new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, "127.0.0.1", resolve);
  });
  return { issuer, seen, close: () => new Promise((resolve) => server.close(resolve)), sign: jwt };
}
