// The documented API, called with the signed-in token in the Authorization header. The token
// lives in this tab's session storage (never a URL, never local storage).
const KEY = "paddock.console.token";

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

export function token() {
  return sessionStorage.getItem(KEY);
}

export function setToken(value) {
  sessionStorage.setItem(KEY, value);
}

export function clearToken() {
  sessionStorage.removeItem(KEY);
}

// The token's claims, for what to show (the API decides what is allowed).
export function claims() {
  const t = token();
  if (!t) return null;
  try {
    const part = t.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const json = JSON.parse(atob(part + "=".repeat((4 - (part.length % 4)) % 4)));
    const roles = Array.isArray(json.roles) ? json.roles : [];
    return { sub: json.sub, roles, tenantId: json.tenant_id || null, exp: json.exp };
  } catch {
    return null;
  }
}

function url(path, query) {
  const u = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") u.searchParams.set(k, v);
  }
  return u;
}

// A signed-in call answered 401: the token has expired (or was revoked, or its key rotated away).
// It is forgotten, and the shell (app.js) returns to sign-in saying so.
export const SIGNED_OUT = "paddock:signed-out";

function refusedToken(status, problem) {
  if (status !== 401 || !token()) return;
  clearToken();
  window.dispatchEvent(new CustomEvent(SIGNED_OUT, { detail: new ApiError(status, problem) }));
}

async function problemOf(resp) {
  const type = resp.headers.get("content-type") || "";
  if (type.includes("json")) {
    try {
      return await resp.json();
    } catch {
      /* fall through */
    }
  }
  return { title: resp.statusText || "Request failed", status: resp.status, detail: `HTTP ${resp.status}` };
}

export async function call(path, { method = "GET", query, body, headers = {}, signal } = {}) {
  const h = { Accept: "application/json", ...headers };
  const t = token();
  if (t) h.Authorization = `Bearer ${t}`;
  if (body !== undefined) h["Content-Type"] = "application/json";
  if (method !== "GET") h["Idempotency-Key"] = crypto.randomUUID();
  const resp = await fetch(url(path, query), {
    method,
    headers: h,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    credentials: "omit",
    referrerPolicy: "no-referrer",
    cache: "no-store",
  });
  if (!resp.ok) {
    const problem = await problemOf(resp);
    refusedToken(resp.status, problem);
    throw new ApiError(resp.status, problem);
  }
  if (resp.status === 204) return null;
  return resp.json();
}

// Every item of a list, following the cursors (bounded: `max` items).
export async function all(path, query = {}, max = 5000) {
  const items = [];
  let cursor;
  do {
    const page = await call(path, { query: { ...query, limit: 1000, cursor } });
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < max);
  return items;
}

// An export written out as it streams: to a file the user picks where the browser offers it,
// else gathered into a Blob (which the browser may keep on disk) and saved by a download.
export async function download(path, query, filename) {
  const t = token();
  const resp = await fetch(url(path, query), {
    headers: { Authorization: `Bearer ${t}` },
    credentials: "omit",
    referrerPolicy: "no-referrer",
    cache: "no-store",
  });
  if (!resp.ok) {
    const problem = await problemOf(resp);
    refusedToken(resp.status, problem);
    throw new ApiError(resp.status, problem);
  }
  if (window.showSaveFilePicker && !navigator.webdriver) {
    const handle = await window.showSaveFilePicker({ suggestedName: filename });
    await resp.body.pipeTo(await handle.createWritable());
    return;
  }
  const blob = await resp.blob();
  const href = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = href;
  a.download = filename;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(href), 60000);
}
