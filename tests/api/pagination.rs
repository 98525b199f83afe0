//! Cursor pagination: complete and duplicate-free while rows are added, with `Link` headers.

use std::collections::HashSet;

use paddock_testkit::{admin, TestApp};
use serde_json::json;

#[tokio::test]
async fn a_walk_stays_complete_and_duplicate_free_while_rows_are_inserted() {
    let app = TestApp::new().await;
    let token = admin();
    for i in 0..25 {
        app.post("/v1/tenants").token(&token).json(&json!({ "name": format!("t{i:02}") })).send().await.expect(201);
    }
    let mut seen = Vec::new();
    let mut next = Some("/v1/tenants?limit=7".to_owned());
    let mut added = 0;
    while let Some(url) = next {
        let resp = app.get(&url).token(&token).send().await.expect(200);
        let body = resp.json();
        for item in body["items"].as_array().expect("items") {
            seen.push(item["name"].as_str().expect("name").to_owned());
        }
        next = match body["next_cursor"].as_str() {
            Some(cursor) => {
                let link = resp.header("link").expect("a Link header with every next_cursor");
                assert!(link.ends_with("; rel=\"next\""), "{link}");
                assert!(link.contains("limit=7"), "the link keeps the other parameters: {link}");
                let target = link.trim_start_matches('<').split('>').next().expect("link target").to_owned();
                assert!(target.contains(&format!("cursor={cursor}")));
                Some(target)
            }
            None => {
                assert!(resp.header("link").is_none());
                None
            }
        };
        // Rows added between pages.
        app.post("/v1/tenants").token(&token).json(&json!({ "name": format!("late{added}") })).send().await.expect(201);
        added += 1;
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "duplicates in the walk: {seen:?}");
    for i in 0..25 {
        assert!(seen.contains(&format!("t{i:02}")), "t{i:02} missing from the walk");
    }
}

#[tokio::test]
async fn limits_default_to_100_and_the_last_page_has_no_cursor() {
    let app = TestApp::new().await;
    for i in 0..3 {
        crate::common::tenant(&app, &format!("t{i}")).await;
    }
    let body = app.get("/v1/tenants").token(&admin()).send().await.expect(200).json();
    assert_eq!(body["items"].as_array().expect("items").len(), 3);
    assert_eq!(body["next_cursor"], json!(null));
    let body = app.get("/v1/tenants?limit=3").token(&admin()).send().await.expect(200).json();
    let cursor = body["next_cursor"].as_str().expect("a full page has a cursor");
    let body = app.get(format!("/v1/tenants?limit=3&cursor={cursor}")).token(&admin()).send().await.expect(200).json();
    assert_eq!(body["items"], json!([]));
    assert_eq!(body["next_cursor"], json!(null));
    app.get("/v1/tenants?limit=1000").token(&admin()).send().await.expect(200);
    app.get("/v1/tenants?limit=1001").token(&admin()).send().await.problem(422, "validation_failed");
}
