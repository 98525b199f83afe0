//! The operator console (docs/console.md) as the API serves it: the page and its files embedded in
//! the binary, with a strict Content-Security-Policy and no referrer; not in the OpenAPI document;
//! and the API's own authentication untouched by it.

use paddock_testkit::TestApp;
use serde_json::Value;

const CSP: &str = paddock_api::console::CONTENT_SECURITY_POLICY;

fn assert_console_headers(resp: &paddock_testkit::Resp, what: &str) {
    assert_eq!(resp.header("content-security-policy"), Some(CSP), "{what}: CSP");
    assert_eq!(resp.header("referrer-policy"), Some("no-referrer"), "{what}: referrer policy");
    assert_eq!(resp.header("x-content-type-options"), Some("nosniff"), "{what}: nosniff");
    assert_eq!(resp.header("x-frame-options"), Some("DENY"), "{what}: frame options");
}

#[tokio::test]
async fn the_console_page_is_served_with_a_strict_content_security_policy() {
    let app = TestApp::new().await;
    let page = app.get("/console/").send().await.expect(200);
    assert_console_headers(&page, "/console/");
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let html = String::from_utf8(page.body.to_vec()).expect("utf-8");
    assert!(html.contains(r#"<script type="module" src="app.js"></script>"#), "the page loads its module:\n{html}");
    // No inline script, no inline style, nothing from another origin.
    assert_eq!(html.matches("<script").count(), 1, "one script element, with a src");
    assert!(!html.contains("style="), "no inline style");
    assert!(!html.contains("http://") && !html.contains("https://"), "no third-party asset:\n{html}");
    for directive in ["script-src 'self'", "frame-ancestors 'none'", "default-src 'none'", "connect-src 'self'"] {
        assert!(CSP.contains(directive), "the policy has {directive}");
    }
    assert!(!CSP.contains("unsafe-inline") && !CSP.contains("unsafe-eval"), "no unsafe source: {CSP}");
    let moved = app.get("/console").send().await.expect(308);
    assert_eq!(moved.header("location"), Some("/console/"));
    assert_console_headers(&moved, "/console");
}

#[tokio::test]
async fn every_embedded_file_is_served_and_an_unknown_one_is_a_404() {
    let app = TestApp::new().await;
    for name in paddock_api::console::asset_names() {
        let resp = app.get(format!("/console/{name}")).send().await.expect(200);
        assert_console_headers(&resp, name);
        let expected = match name.rsplit('.').next() {
            Some("js") => "text/javascript; charset=utf-8",
            Some("css") => "text/css; charset=utf-8",
            Some("html") => "text/html; charset=utf-8",
            Some("svg") => "image/svg+xml",
            other => panic!("an asset of an unexpected kind: {other:?}"),
        };
        assert_eq!(resp.header("content-type"), Some(expected), "{name}");
        let text = String::from_utf8(resp.body.to_vec()).expect("utf-8");
        assert!(!text.contains("innerHTML") && !text.contains("eval("), "{name} builds no markup from strings");
        assert!(!text.contains("localStorage"), "{name} keeps nothing in local storage");
    }
    for missing in ["/console/nope.js", "/console/../openapi.json", "/console/app.js/x", "/console/sub/app.js"] {
        let resp = app.get(missing).send().await;
        assert_eq!(resp.status, 404, "{missing}");
        if missing.starts_with("/console/") && !missing.contains("..") {
            assert_console_headers(&resp, missing);
        }
    }
}

#[tokio::test]
async fn every_module_the_page_imports_is_embedded() {
    let app = TestApp::new().await;
    let names: Vec<&str> = paddock_api::console::asset_names().collect();
    for name in names.iter().filter(|n| n.ends_with(".js")) {
        let text = String::from_utf8(app.get(format!("/console/{name}")).send().await.expect(200).body.to_vec())
            .expect("utf-8");
        for line in text.lines().filter(|l| l.starts_with("import ")) {
            let target = line.rsplit_once("\"./").and_then(|(_, rest)| rest.split_once('"')).map(|(t, _)| t);
            let target = target.unwrap_or_else(|| panic!("{name}: an import not of a sibling file: {line}"));
            assert!(names.contains(&target), "{name} imports {target}, which is not embedded");
        }
    }
}

#[tokio::test]
async fn the_console_is_not_in_the_openapi_document_and_does_not_open_the_api() {
    let doc: Value = serde_json::from_str(&paddock_api::openapi_json()).expect("json");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.keys().all(|p| !p.starts_with("/console")), "the console is no API operation");
    let app = TestApp::new().await;
    // The page is public; the API it calls is not, with or without the console's path around.
    app.get("/console/").send().await.expect(200);
    app.get("/v1/tenants").send().await.problem(401, "missing_token");
    app.get("/v1/tenants").header("referer", "http://localhost/console/").send().await.problem(401, "missing_token");
}

fn oidc() -> paddock_api::console::Oidc {
    paddock_api::console::Oidc {
        issuer: "https://id.example/realms/cloud".into(),
        discovery_url: "https://id.example/realms/cloud/.well-known/openid-configuration".into(),
        client_id: "paddock-console".into(),
        redirect_uri: "https://paddock.example/console/".into(),
        scope: "openid".into(),
        origin: "https://id.example".into(),
    }
}

#[tokio::test]
async fn without_oidc_the_pages_configuration_says_so_and_the_policy_allows_this_origin_only() {
    let app = TestApp::new().await;
    let resp = app.get("/console/config.json").send().await.expect(200);
    assert_console_headers(&resp, "config.json");
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&resp.body).expect("json");
    assert_eq!(body, serde_json::json!({ "oidc": null }));
}

#[tokio::test]
async fn with_oidc_the_page_learns_the_issuer_and_may_connect_to_its_origin_alone() {
    let console = paddock_api::console::ConsoleConfig { oidc: Some(oidc()) };
    let app = TestApp::with_config(paddock_api::ApiConfig { console, ..Default::default() }).await;
    let body: Value =
        serde_json::from_slice(&app.get("/console/config.json").send().await.expect(200).body).expect("json");
    assert_eq!(
        body,
        serde_json::json!({ "oidc": {
            "issuer": "https://id.example/realms/cloud",
            "discovery_url": "https://id.example/realms/cloud/.well-known/openid-configuration",
            "client_id": "paddock-console",
            "redirect_uri": "https://paddock.example/console/",
            "scope": "openid",
        }})
    );
    // The strict policy with one more source in connect-src, the issuer's origin; nothing else.
    let expected = CSP.replace("connect-src 'self';", "connect-src 'self' https://id.example;");
    assert_ne!(expected, CSP);
    for path in ["/console/", "/console/app.js", "/console/config.json", "/console/nope.js", "/console"] {
        let resp = app.get(path).send().await;
        assert_eq!(resp.header("content-security-policy"), Some(expected.as_str()), "{path}");
        assert_eq!(resp.header("referrer-policy"), Some("no-referrer"), "{path}");
    }
    // The issuer's page comes back to the console with a code and state in the query: the page.
    let back = app.get("/console/?code=abc&state=xyz").send().await.expect(200);
    assert_eq!(back.header("content-type"), Some("text/html; charset=utf-8"));
    let doc: Value = serde_json::from_str(&paddock_api::openapi_json()).expect("json");
    assert!(doc["paths"].as_object().expect("paths").keys().all(|p| !p.contains("config.json")));
}
