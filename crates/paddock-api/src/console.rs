//! The operator console (docs/console.md): a few hand-written ES modules, a style sheet and one
//! page, embedded in the binary and served at `/console/`. It is no API: its routes are not in the
//! OpenAPI document and take no token; the page calls the documented `/v1` routes with the token
//! the user pasted, in the `Authorization` header, like any other client.
//!
//! Every answer carries a strict Content-Security-Policy (scripts, styles and connections to this
//! origin only, no inline script, no framing), `Referrer-Policy: no-referrer` and `nosniff`.
//!
//! With sign-in through the provider's OIDC issuer configured ([`Oidc`]), `config.json` tells the
//! page the issuer, client and redirect URI, and the policy's `connect-src` adds the issuer's one
//! origin (its discovery document and token endpoint); without it, `config.json` says `null`.

use std::sync::Arc;

use axum::extract::Path;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use http::{header, HeaderValue, StatusCode};
use serde::Serialize;

use crate::AppState;

/// The console's path; the page and its assets are under it.
pub const PATH: &str = "/console/";

/// The policy of every console answer: nothing but this origin's own files and API, no inline
/// script or style, no plugins, no framing, forms post nowhere else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; font-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Sign-in with the provider's OIDC issuer (authorization code with PKCE, the browser a public
/// client): what the page needs, as `config.json` gives it. Checked by the process's settings
/// (`PADDOCK_CONSOLE_OIDC_*`) before it gets here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Oidc {
    /// The issuer: the discovery URL without `/.well-known/openid-configuration`.
    pub issuer: String,
    /// The issuer's discovery document.
    pub discovery_url: String,
    /// The console's client id at the issuer.
    pub client_id: String,
    /// Where the issuer sends the browser back: the console's page.
    pub redirect_uri: String,
    /// The scopes asked for, space-separated (`openid` among them).
    pub scope: String,
    /// The issuer's origin (`scheme://host[:port]`), the one the page may connect to besides
    /// paddock: its discovery document and token endpoint are there.
    #[serde(skip)]
    pub origin: String,
}

/// The console's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// Sign-in through the provider's OIDC issuer, if configured.
    pub oidc: Option<Oidc>,
}

/// The policy of every console answer: [`CONTENT_SECURITY_POLICY`], with the issuer's origin in
/// `connect-src` when OIDC sign-in is configured (nothing else is added).
pub fn content_security_policy(config: &ConsoleConfig) -> String {
    match &config.oidc {
        None => CONTENT_SECURITY_POLICY.to_owned(),
        Some(oidc) => {
            CONTENT_SECURITY_POLICY.replace("connect-src 'self';", &format!("connect-src 'self' {};", oidc.origin))
        }
    }
}

/// `config.json`: what the page learns from paddock (not an API: not in the OpenAPI document).
fn config_json(config: &ConsoleConfig) -> String {
    serde_json::json!({ "oidc": config.oidc }).to_string()
}

/// The embedded files: name under `/console/`, media type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("index.html", "text/html; charset=utf-8", include_bytes!("../console/index.html")),
    ("console.css", "text/css; charset=utf-8", include_bytes!("../console/console.css")),
    ("app.js", JS, include_bytes!("../console/app.js")),
    ("api.js", JS, include_bytes!("../console/api.js")),
    ("oidc.js", JS, include_bytes!("../console/oidc.js")),
    ("ui.js", JS, include_bytes!("../console/ui.js")),
    ("chart.js", JS, include_bytes!("../console/chart.js")),
    ("fleet.js", JS, include_bytes!("../console/fleet.js")),
    ("machine.js", JS, include_bytes!("../console/machine.js")),
    ("tenants.js", JS, include_bytes!("../console/tenants.js")),
    ("cluster.js", JS, include_bytes!("../console/cluster.js")),
    ("usage.js", JS, include_bytes!("../console/usage.js")),
    ("audit.js", JS, include_bytes!("../console/audit.js")),
    ("favicon.svg", "image/svg+xml", include_bytes!("../console/favicon.svg")),
];

const JS: &str = "text/javascript; charset=utf-8";

/// The names of the embedded files, for tests and the docs.
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|(name, _, _)| *name)
}

/// The console's routes: `/console` redirects to `/console/`, which is the page; the files
/// beside it by name, and `config.json`; anything else under it is a 404 (with the same headers).
pub fn router(config: &ConsoleConfig) -> Router<AppState> {
    // An origin is ASCII without control characters; should it not make a header, the strict
    // policy (no issuer) is served, and the issuer's sign-in fails visibly in the page.
    let csp = HeaderValue::from_str(&content_security_policy(config))
        .unwrap_or(HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    let served = Arc::new(Served { csp, config_json: config_json(config) });
    let (page, files, moved) = (served.clone(), served.clone(), served);
    Router::new()
        .route("/console", get(move || async move { moved.with_headers(Redirect::permanent(PATH).into_response()) }))
        .route(PATH, get(move || async move { page.asset("index.html") }))
        .route("/console/{*file}", get(move |Path(file): Path<String>| async move { files.asset(&file) }))
}

/// What the routes serve besides the embedded files: the policy and `config.json`.
struct Served {
    csp: HeaderValue,
    config_json: String,
}

impl Served {
    fn asset(&self, name: &str) -> Response {
        let response = match ASSETS.iter().find(|(n, _, _)| *n == name) {
            Some((_, media_type, bytes)) => {
                let mut response = (*bytes).into_response();
                response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
                response
            }
            None if name == "config.json" => {
                ([(header::CONTENT_TYPE, "application/json")], self.config_json.clone()).into_response()
            }
            None => (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "not found\n")
                .into_response(),
        };
        self.with_headers(response)
    }

    /// The security headers of every console answer. `no-cache`: a new binary's files are fetched
    /// again (revalidated), never mixed with an older page's.
    fn with_headers(&self, mut response: Response) -> Response {
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_SECURITY_POLICY, self.csp.clone());
        for (name, value) in [
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::HeaderName::from_static("cross-origin-opener-policy"), "same-origin"),
            (header::HeaderName::from_static("cross-origin-resource-policy"), "same-origin"),
            (header::HeaderName::from_static("permissions-policy"), "camera=(), microphone=(), geolocation=()"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        response
    }
}
