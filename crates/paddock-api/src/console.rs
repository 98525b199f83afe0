//! The operator console (docs/console.md): a few hand-written ES modules, a style sheet and one
//! page, embedded in the binary and served at `/console/`. It is no API: its routes are not in the
//! OpenAPI document and take no token; the page calls the documented `/v1` routes with the token
//! the user pasted, in the `Authorization` header, like any other client.
//!
//! Every answer carries a strict Content-Security-Policy (scripts, styles and connections to this
//! origin only, no inline script, no framing), `Referrer-Policy: no-referrer` and `nosniff`.

use axum::extract::Path;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use http::{header, HeaderValue, StatusCode};

use crate::AppState;

/// The console's path; the page and its assets are under it.
pub const PATH: &str = "/console/";

/// The policy of every console answer: nothing but this origin's own files and API, no inline
/// script or style, no plugins, no framing, forms post nowhere else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data: blob:; font-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The embedded files: name under `/console/`, media type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    ("index.html", "text/html; charset=utf-8", include_bytes!("../console/index.html")),
    ("console.css", "text/css; charset=utf-8", include_bytes!("../console/console.css")),
    ("app.js", JS, include_bytes!("../console/app.js")),
    ("api.js", JS, include_bytes!("../console/api.js")),
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
/// beside it by name; anything else under it is a 404 (with the same headers).
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(|| async { with_headers(Redirect::permanent(PATH).into_response()) }))
        .route(PATH, get(|| async { asset("index.html") }))
        .route("/console/{*file}", get(|Path(file): Path<String>| async move { asset(&file) }))
}

fn asset(name: &str) -> Response {
    let response = match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, media_type, bytes)) => {
            let mut response = (*bytes).into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
            response
        }
        None => (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "not found\n")
            .into_response(),
    };
    with_headers(response)
}

/// The security headers of every console answer. `no-cache`: a new binary's files are fetched
/// again (revalidated), never mixed with an older page's.
fn with_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
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
