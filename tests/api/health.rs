//! Machine health reports: an operator records them, the provider reads every one, the tenant
//! holding the machine reads those of its own tenancy (without who reported), bad reports are
//! refused naming the field, and the table is append-only for the runtime role.

use paddock_testkit::{admin, token, TestApp};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::common::{id, machine_class};
use crate::lifecycle::Lab;

const FAILED: &str = r#"{"status": "failed", "checks": [{"name": "gpu.ecc", "status": "failed", "detail": "GPU 3: 41 uncorrectable ECC errors"}]}"#;

async fn report(app: &TestApp, machine: &str, body: &str) -> (u16, Value) {
    let body: Value = serde_json::from_str(body).expect("json");
    let resp = app.post(format!("/v1/machines/{machine}/health-reports")).token(&admin()).json(&body).send().await;
    let status = resp.status.as_u16();
    (status, resp.json())
}

#[tokio::test]
async fn a_report_is_recorded_as_said_and_read_newest_first_by_the_provider() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let ids = lab.available("gpu", &["h1"]).await;
    let (status, first) =
        report(&lab.app, &ids[0], r#"{"status": "healthy", "observed_at": "2026-01-01T00:00:00Z"}"#).await;
    assert_eq!(status, 201, "{first}");
    assert_eq!((first["status"].as_str(), first["source"].as_str()), (Some("healthy"), Some("operator")));
    assert_eq!(first["observed_at"], "2026-01-01T00:00:00Z");
    assert_eq!(first["reporter"], "test-user", "the token's subject: {first}");
    let (status, second) = report(&lab.app, &ids[0], FAILED).await;
    assert_eq!(status, 201, "{second}");
    assert_eq!(second["checks"][0]["detail"], "GPU 3: 41 uncorrectable ECC errors");

    let path = format!("/v1/machines/{}/health-reports", ids[0]);
    let page = lab.app.get(format!("{path}?limit=1")).token(&admin()).send().await.expect(200).json();
    assert_eq!(page["items"][0], second, "newest first");
    let next = page["next_cursor"].as_str().expect("a second page");
    let rest = lab.app.get(format!("{path}?limit=1&cursor={next}")).token(&admin()).send().await.expect(200).json();
    assert_eq!(rest["items"][0], first);
    let audit = lab.app.get("/v1/audit-events?action=machine.health_report").token(&admin()).send().await;
    assert_eq!(audit.expect(200).json()["items"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn bad_reports_are_refused_naming_the_field_and_nothing_is_recorded() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let ids = lab.available("gpu", &["h1"]).await;
    let long = "x".repeat(1001);
    let too_many: Vec<Value> = (0..65).map(|i| json!({ "name": format!("c{i}"), "status": "healthy" })).collect();
    for (body, field) in [
        (json!({ "status": "sick" }), "status"),
        (json!({ "status": "failed", "checks": [{ "name": "GPU ECC", "status": "failed" }] }), "checks[0].name"),
        (
            json!({ "status": "failed", "checks": [{ "name": "gpu", "status": "failed", "detail": long }] }),
            "checks[0].detail",
        ),
        (json!({ "status": "failed", "checks": too_many }), "checks"),
        (json!({ "status": "failed", "observed_at": "2999-01-01T00:00:00Z" }), "observed_at"),
        (json!({ "status": "failed", "colour": "red" }), "colour"),
    ] {
        let (status, problem) = report(&lab.app, &ids[0], &body.to_string()).await;
        assert_eq!(status, 422, "{body}: {problem}");
        assert!(problem.to_string().contains(field), "{field} is not named: {problem}");
    }
    let (status, problem) = report(&lab.app, &Uuid::now_v7().to_string(), FAILED).await;
    assert_eq!(status, 404, "{problem}");
    let tenant = token(&["tenant:admin"], Some(lab.tenant.parse().expect("uuid")));
    let path = format!("/v1/machines/{}/health-reports", ids[0]);
    let failed: Value = serde_json::from_str(FAILED).expect("json");
    assert_eq!(lab.app.post(&path).token(&tenant).json(&failed).send().await.status.as_u16(), 403);
    let count: i64 = sqlx::query_scalar("select count(*) from machine_health_reports")
        .fetch_one(&lab.app.db.pool)
        .await
        .expect("count");
    assert_eq!(count, 0);
    // A retired machine takes no more reports.
    lab.app.delete(format!("/v1/machines/{}", ids[0])).token(&admin()).send().await.expect(202);
    lab.machine_in(&ids[0], "retired").await;
    let (status, problem) = report(&lab.app, &ids[0], FAILED).await;
    assert_eq!((status, problem["code"].as_str()), (409, Some("machine_retired")), "{problem}");
}

#[tokio::test]
async fn the_tenant_holding_a_machine_reads_the_reports_of_its_tenancy_only() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let ids = lab.available("gpu", &["h1"]).await;
    let (_, before) = report(&lab.app, &ids[0], r#"{"status": "degraded"}"#).await;
    // No automatic remediation: the failed machine stays the tenant's until it is scaled away.
    let pools = json!([{ "name": "gpu", "machine_class": "gpu", "count": 1, "remediation": { "automatic": false } }]);
    let body = json!({ "name": "k", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": pools });
    let created = lab.create(body).await;
    let cluster = id(&created["cluster"]);
    let pool = id(&created["cluster"]["node_pools"][0]);
    lab.ready(&cluster).await;
    let machines = format!("{}/machines", lab.cluster_path(&cluster));
    let held = lab.app.get(&machines).token(&lab.tenant_token).send().await.expect(200).json();
    assert_eq!(held["items"][0]["id"].as_str(), Some(ids[0].as_str()));
    assert_eq!(held["items"][0]["health"], Value::Null, "a report from before the tenancy is not the tenant's");

    let (_, during) = report(&lab.app, &ids[0], FAILED).await;
    let reports = format!("{machines}/{}/health-reports", ids[0]);
    let seen = lab.app.get(&reports).token(&lab.tenant_token).send().await.expect(200).json();
    let items = seen["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{seen}");
    assert_eq!(items[0]["id"], during["id"]);
    assert!(items[0].get("reporter").is_none(), "the operator is not named to the tenant: {seen}");
    assert!(!seen.to_string().contains(before["id"].as_str().expect("id")));
    let held = lab.app.get(&machines).token(&lab.tenant_token).send().await.expect(200).json();
    assert_eq!(held["items"][0]["health"], "failed");

    let other = lab.seat("other").await;
    let foreign = reports.replace(&lab.tenant, &other.tenant);
    assert_eq!(lab.app.get(&foreign).token(&other.token).send().await.status.as_u16(), 404);
    // Released: the machine and its reports are no longer the tenant's to read.
    lab.scale(&cluster, &pool, 0).await;
    lab.machine_in(&ids[0], "available").await;
    assert_eq!(lab.app.get(&reports).token(&lab.tenant_token).send().await.status.as_u16(), 404);
}

#[tokio::test]
async fn the_runtime_role_reads_and_appends_health_reports_and_nothing_more() {
    let app = crate::common::served_as_runtime_role().await;
    machine_class(&app, "gpu", 8).await;
    let body = json!({ "name": "m1", "machine_class": "gpu",
        "bmc": { "url": "https://bmc.example", "username": "u", "password": "p" } });
    let machine = app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json();
    let (status, recorded) = report(&app, &id(&machine["machine"]), FAILED).await;
    assert_eq!(status, 201, "{recorded}");
    for statement in [
        "update machine_health_reports set status = 'healthy'",
        "delete from machine_health_reports",
        "truncate machine_health_reports",
        "alter table machine_health_reports disable trigger machine_health_reports_append_only",
    ] {
        let refused = sqlx::query(statement).execute(&app.db.pool).await.expect_err(statement);
        let code = refused.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{statement}: {refused}");
    }
    assert_eq!(app.count("machine_health_reports").await, 1);
}

#[tokio::test]
async fn the_providers_machine_view_shows_what_the_newest_report_says_and_null_before_any() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let mut ids = Vec::new();
    for name in ["v1", "v2", "v3"] {
        let body = json!({ "name": name, "machine_class": "gpu",
            "bmc": { "url": format!("https://bmc-{name}.example"), "username": "u", "password": "p" } });
        ids.push(id(&app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json()["machine"]));
    }
    let view = |m: &str| app.get(format!("/v1/machines/{m}")).token(&admin()).send();
    assert_eq!(view(&ids[0]).await.expect(200).json()["health"], Value::Null, "never reported");

    report(&app, &ids[0], r#"{"status": "healthy", "observed_at": "2026-01-02T00:00:00Z"}"#).await;
    // Recorded later, observed earlier: the newest report is the one recorded last.
    let mut failed: Value = serde_json::from_str(FAILED).expect("json");
    failed["observed_at"] = json!("2026-01-01T00:00:00Z");
    let (_, newest) = report(&app, &ids[0], &failed.to_string()).await;
    let (_, other) = report(&app, &ids[1], r#"{"status": "degraded"}"#).await;
    let health = view(&ids[0]).await.expect(200).json()["health"].clone();
    let expected = json!({ "status": "failed", "source": "operator", "observed_at": "2026-01-01T00:00:00Z",
        "report_id": newest["id"], "checks": newest["checks"] });
    assert_eq!(health, expected);

    // A page of the fleet carries each machine's own, in the same read.
    let page = app.get("/v1/machines?limit=10").token(&admin()).send().await.expect(200).json();
    let by_id =
        |m: &str| page["items"].as_array().expect("items").iter().find(|i| i["id"] == m).expect("listed").clone();
    assert_eq!(by_id(&ids[0])["health"], expected);
    assert_eq!(by_id(&ids[1])["health"]["report_id"], other["id"]);
    assert_eq!(by_id(&ids[1])["health"]["status"], "degraded");
    assert_eq!(by_id(&ids[2])["health"], Value::Null);
}
