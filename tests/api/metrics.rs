//! `/metrics` stays bounded whatever clients send.

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

/// The gauges' reads so far, as the scrape reports them.
fn gauge_reads(text: &str) -> u64 {
    let line = text.lines().find(|l| l.starts_with("paddock_gauge_reads_total ")).expect("the reads counter");
    line.rsplit(' ').next().and_then(|n| n.parse().ok()).expect("a count")
}

#[tokio::test]
async fn a_flood_of_scrapes_shares_a_few_gauge_reads_and_other_requests_are_served() {
    let app = TestApp::new().await;
    let admin = paddock_testkit::admin();
    let scrapes = (0..200).map(|_| async { app.get("/metrics").send().await.expect(200) });
    let others = (0..50).map(|_| async { app.get("/v1/tenants").token(&admin).send().await.status.as_u16() });
    let (scrapes, others) = tokio::join!(futures::future::join_all(scrapes), futures::future::join_all(others));
    assert!(others.iter().all(|s| *s == 200), "other requests during the flood: {others:?}");
    let last = String::from_utf8(app.get("/metrics").send().await.expect(200).body.to_vec()).expect("utf-8");
    // One read for the flood; a second only if the flood outlived the cache's age.
    let reads = gauge_reads(&last);
    assert!((1..=2).contains(&reads), "{reads} reads for {} scrapes", scrapes.len() + 1);
    assert!(last.contains("paddock_database_up 1"), "{last}");
}
