//! `/metrics` stays bounded whatever clients send (issue "Edge hardening", item 2).

use paddock_testkit::TestApp;

#[tokio::test]
async fn a_thousand_made_up_methods_add_one_series() {
    let app = TestApp::new().await;
    let series = |text: &str| text.lines().filter(|l| l.starts_with("paddock_http_requests_total{")).count();
    let scrape =
        || async { String::from_utf8(app.get("/metrics").send().await.expect(200).body.to_vec()).expect("utf-8") };
    let before = series(&scrape().await);
    for i in 0..1000 {
        let method = http::Method::from_bytes(format!("M{i:04}X").as_bytes()).expect("a token");
        app.req(method, format!("/v1/tenants/{i}")).send().await;
    }
    let text = scrape().await;
    let added = series(&text) - before;
    // The made-up methods on an unmatched route share `method="other"`; the second scrape adds
    // the first scrape's own series.
    assert!(added <= 3, "{added} series added:\n{text}");
    assert!(text.contains("method=\"other\""), "{text}");
    assert!(!text.contains("M0999X"), "no method is a label value verbatim");
}
