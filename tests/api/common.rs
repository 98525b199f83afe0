//! Fixtures made through the API itself.

use paddock_testkit::{admin, TestApp};
use serde_json::{json, Value};

/// Creates a tenant named `name`; returns its view.
pub async fn tenant(app: &TestApp, name: &str) -> Value {
    app.post("/v1/tenants").token(&admin()).json(&json!({ "name": name })).send().await.expect(201).json()
}

/// The id of a view.
pub fn id(view: &Value) -> String {
    view["id"].as_str().expect("view has an id").to_owned()
}

/// Creates a machine class with `gpus` GPUs.
pub async fn machine_class(app: &TestApp, name: &str, gpus: u32) -> Value {
    let model = if gpus > 0 { "NVIDIA H100" } else { "" };
    app.post("/v1/machine-classes")
        .token(&admin())
        .json(&json!({ "name": name, "cpu_cores": 64, "memory_gib": 512, "gpu_model": model, "gpu_count": gpus }))
        .send()
        .await
        .expect(201)
        .json()
}

/// An enrollment body.
pub fn enroll_body(name: &str, class: &str) -> Value {
    json!({
        "name": name,
        "machine_class": class,
        "labels": { "rack": "r1" },
        "bmc": { "url": format!("https://bmc-{name}.example:443"), "username": "admin", "password": "s3cret-pw" }
    })
}

/// Enrolls a machine; returns the machine view.
pub async fn machine(app: &TestApp, name: &str, class: &str) -> Value {
    let body = app.post("/v1/machines").token(&admin()).json(&enroll_body(name, class)).send().await.expect(202).json();
    body["machine"].clone()
}

/// Moves a machine to `state` directly in the database, as the worker would (the worker comes
/// with the job queue; until then tests set the lifecycle state themselves).
pub async fn set_machine_state(app: &TestApp, machine_id: &str, state: &str) {
    sqlx::query(
        "update machines set state = $2, \
         retired_at = case when $2 = 'retired' then now() else retired_at end where id = $1::uuid",
    )
    .bind(machine_id)
    .bind(state)
    .execute(&app.db.pool)
    .await
    .expect("setting the machine state");
}
