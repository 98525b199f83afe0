//! Operations: provider and tenant views, scoping.

use paddock_testkit::{admin, token, TestApp};

use crate::common::{id, machine, machine_class, tenant};

async fn tenant_operation(app: &TestApp, tenant_id: &str) -> String {
    let op = uuid::Uuid::now_v7();
    sqlx::query(
        "insert into operations (id, kind, target_type, target_id, tenant_id, target_generation) \
         values ($1, 'cluster_create', 'cluster', $2, $3::uuid, 1)",
    )
    .bind(op)
    .bind(uuid::Uuid::now_v7())
    .bind(tenant_id)
    .execute(&app.db.pool)
    .await
    .expect("operation");
    op.to_string()
}

#[tokio::test]
async fn tenants_see_only_their_own_operations() {
    let app = TestApp::new().await;
    let a = tenant(&app, "a").await;
    let b = tenant(&app, "b").await;
    let op_a = tenant_operation(&app, &id(&a)).await;
    let op_b = tenant_operation(&app, &id(&b)).await;
    let member_a = token(&["tenant:member"], Some(id(&a).parse().expect("uuid")));

    let list = app.get(format!("/v1/tenants/{}/operations", id(&a))).token(&member_a).send().await.expect(200).json();
    let ids: Vec<&str> = list["items"].as_array().expect("items").iter().filter_map(|o| o["id"].as_str()).collect();
    assert_eq!(ids, [op_a.as_str()]);
    app.get(format!("/v1/tenants/{}/operations/{op_a}", id(&a))).token(&member_a).send().await.expect(200);
    app.get(format!("/v1/tenants/{}/operations/{op_b}", id(&a)))
        .token(&member_a)
        .send()
        .await
        .problem(404, "not_found");
    app.get(format!("/v1/tenants/{}/operations", id(&b))).token(&member_a).send().await.problem(404, "not_found");
    app.get(format!("/v1/operations/{op_b}")).token(&member_a).send().await.problem(404, "not_found");
    let list = app.get("/v1/operations").token(&member_a).send().await.expect(200).json();
    assert_eq!(list["items"].as_array().expect("items").len(), 1, "a tenant token lists its own operations only");

    let all = app.get("/v1/operations").token(&admin()).send().await.expect(200).json();
    assert_eq!(all["items"].as_array().expect("items").len(), 2);
    let only_b =
        app.get(format!("/v1/operations?tenant_id={}", id(&b))).token(&admin()).send().await.expect(200).json();
    assert_eq!(only_b["items"][0]["id"], op_b.as_str());
}

#[tokio::test]
async fn operations_filter_by_target_and_state() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m1 = machine(&app, "m1", "gpu").await;
    machine(&app, "m2", "gpu").await;
    let list = app.get(format!("/v1/operations?target_id={}", id(&m1))).token(&admin()).send().await.expect(200).json();
    assert_eq!(list["items"].as_array().expect("items").len(), 1);
    let pending = app.get("/v1/operations?state=pending").token(&admin()).send().await.expect(200).json();
    assert_eq!(pending["items"].as_array().expect("items").len(), 2);
    let done = app.get("/v1/operations?state=succeeded").token(&admin()).send().await.expect(200).json();
    assert_eq!(done["items"].as_array().expect("items").len(), 0);
}
