//! Machine classes.

use paddock_testkit::{admin, token, TestApp};
use serde_json::json;

use crate::common::{machine, machine_class, set_machine_state};

#[tokio::test]
async fn machine_class_crud() {
    let app = TestApp::new().await;
    let class = machine_class(&app, "gpu-h100", 8).await;
    assert_eq!(class["gpu_count"], 8);
    assert_eq!(class["description"], "");
    let resp =
        app.get("/v1/machine-classes/gpu-h100").token(&token(&["billing:reader"], None)).send().await.expect(200);
    assert_eq!(resp.header("etag"), Some("\"1\""));
    let patched = app
        .patch("/v1/machine-classes/gpu-h100")
        .token(&admin())
        .json(&json!({ "description": "HGX" }))
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(patched["description"], "HGX");
    assert_eq!(patched["generation"], 2);
    app.delete("/v1/machine-classes/gpu-h100").token(&admin()).send().await.expect(204);
    app.get("/v1/machine-classes/gpu-h100").token(&admin()).send().await.problem(404, "not_found");
}

#[tokio::test]
async fn machine_class_in_use_cannot_be_deleted_or_change_hardware() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = machine(&app, "node-1", "gpu").await;
    app.delete("/v1/machine-classes/gpu").token(&admin()).send().await.problem(409, "machine_class_in_use");
    app.patch("/v1/machine-classes/gpu")
        .token(&admin())
        .json(&json!({ "gpu_count": 4 }))
        .send()
        .await
        .problem(409, "machine_class_in_use");
    // Descriptive fields may still change.
    app.patch("/v1/machine-classes/gpu")
        .token(&admin())
        .json(&json!({ "description": "rack 4" }))
        .send()
        .await
        .expect(200);
    // Even a retired machine keeps the class in use: its custody history names it.
    set_machine_state(&app, m["id"].as_str().expect("id"), "retired").await;
    app.delete("/v1/machine-classes/gpu").token(&admin()).send().await.problem(409, "machine_class_in_use");
    assert_eq!(app.count("machine_classes").await, 1);
}

#[tokio::test]
async fn machine_class_with_gpus_needs_a_model_and_taken_names_conflict() {
    let app = TestApp::new().await;
    let problem = app
        .post("/v1/machine-classes")
        .token(&admin())
        .json(&json!({ "name": "gpu", "cpu_cores": 8, "memory_gib": 64, "gpu_count": 2 }))
        .send()
        .await
        .problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "gpu_model");
    machine_class(&app, "cpu", 0).await;
    app.post("/v1/machine-classes")
        .token(&admin())
        .json(&json!({ "name": "cpu", "cpu_cores": 8, "memory_gib": 64, "gpu_count": 0 }))
        .send()
        .await
        .problem(409, "machine_class_name_taken");
}
