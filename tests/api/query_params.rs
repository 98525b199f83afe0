//! Query parameters, one rule for every route (docs/api.md): a parameter the operation does not
//! document is 422 naming each, after authentication; a value that cannot be read as its type
//! stays 400.

use paddock_testkit::{admin, TestApp};

use crate::common::{id, tenant};

/// `(field, message)` of a 422's errors.
#[track_caller]
fn unknown(problem: &serde_json::Value) -> Vec<(String, String)> {
    let errors = problem["errors"].as_array().unwrap_or_else(|| panic!("no errors: {problem}"));
    errors
        .iter()
        .map(|e| (e["field"].as_str().expect("field").to_owned(), e["message"].as_str().expect("message").to_owned()))
        .collect()
}

#[tokio::test]
async fn unknown_query_parameters_are_422_naming_each() {
    let app = TestApp::new().await;
    let t = tenant(&app, "acme").await;
    let problem = app
        .get("/v1/tenants?limit=5&bogus=1&colour=red&bogus=2")
        .token(&admin())
        .send()
        .await
        .problem(422, "validation_failed");
    let errors = unknown(&problem);
    let fields: Vec<&str> = errors.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(fields, ["bogus", "colour"], "{problem}");
    assert!(errors[0].1.ends_with("its parameters are cursor, limit"), "{problem}");
    // A route that reads no parameter refuses them too.
    let path = format!("/v1/tenants/{}", id(&t));
    let problem =
        app.get(format!("{path}?verbose=true")).token(&admin()).send().await.problem(422, "validation_failed");
    assert_eq!(unknown(&problem)[0].0, "verbose", "{problem}");
    assert!(unknown(&problem)[0].1.contains("takes none"), "{problem}");
    // A misspelt filter is named, not ignored.
    let problem = app.get("/v1/machines?stat=available").token(&admin()).send().await.problem(422, "validation_failed");
    assert_eq!(unknown(&problem)[0].0, "stat", "{problem}");
    // Documented parameters still work; authentication still comes first.
    app.get("/v1/machines?state=available&limit=5").token(&admin()).send().await.expect(200);
    app.get(&path).token(&admin()).send().await.expect(200);
    app.get("/v1/tenants?bogus=1").send().await.problem(401, "missing_token");
    // A value that is not of its type is malformed syntax.
    app.get("/v1/machines?state=sleeping").token(&admin()).send().await.problem(400, "invalid_parameter");
}
