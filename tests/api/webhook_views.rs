//! Webhook events as the API shows their resources: every event type's `data` is exactly what the
//! API returns for the resource to each audience (the provider, the tenant), fetched right after
//! the event, so a view that changes without the database's rendering fails here. And an event
//! is written only when an enabled subscription of an audience that sees it names its type.

use paddock_testkit::{admin, TestApp};
use serde_json::{json, Value};

use crate::common::{close_period, fleet, id, machine_class, set_machine_state};
use crate::webhooks::{app, sql, subscribe, tenant_with_cluster, CLUSTER_EVENTS};

/// Where nothing is delivered: these tests look at the events written, not sent.
const NOWHERE: &str = "http://127.0.0.1:9/hook";

/// The data of the last event of `type_` about `subject`: (the provider's, the tenant's).
async fn event_data(app: &TestApp, type_: &str, subject: &str) -> (Value, Option<Value>) {
    sqlx::query_as(
        "select data_provider, data_tenant from webhook_events where type = $1 and subject = $2 \
         order by seq desc limit 1",
    )
    .bind(format!("dev.paddock.{type_}"))
    .bind(subject)
    .fetch_optional(&app.db.pool)
    .await
    .expect("events")
    .unwrap_or_else(|| panic!("no {type_} event about {subject}"))
}

async fn shown(app: &TestApp, path: &str, bearer: &str) -> Value {
    app.get(path).token(bearer).send().await.expect(200).json()
}

/// Asserts the last `type_` event about `subject` carries `provider` to the provider and
/// `tenant` to the tenant (none: tenants never see it).
async fn carries(app: &TestApp, type_: &str, subject: &str, provider: &Value, tenant: Option<&Value>) {
    let (to_provider, to_tenant) = event_data(app, type_, subject).await;
    assert_eq!(&to_provider, provider, "{type_}: the provider's data is not the API's view");
    assert_eq!(to_tenant.as_ref(), tenant, "{type_}: the tenant's data is not the tenant API's view");
}

/// Asserts the last `type_` event about `path` carries what `GET path` answers the provider, and
/// what it answers the tenant (`tenant`: the tenant's path and token) or nothing.
async fn carries_view(app: &TestApp, type_: &str, path: &str, tenant: Option<(&str, &str)>) {
    let provider = shown(app, path, &admin()).await;
    let tenant_view = match tenant {
        Some((tenant_path, bearer)) => Some(shown(app, tenant_path, bearer).await),
        None => None,
    };
    carries(app, type_, path, &provider, tenant_view.as_ref()).await;
}

async fn count_events(app: &TestApp) -> i64 {
    sqlx::query_scalar("select count(*) from webhook_events").fetch_one(&app.db.pool).await.expect("count")
}

/// An open operation of `target`.
async fn open_operation(app: &TestApp, target: &str) -> String {
    sqlx::query_scalar(
        "select id::text from operations where target_id = $1::uuid and state in ('pending', 'running') \
         order by created_at desc limit 1",
    )
    .bind(target)
    .fetch_one(&app.db.pool)
    .await
    .expect("an open operation")
}

/// A tenant with a one-pool cluster, a provider subscription to every event and the tenant's to
/// every event it may have: (the tenant's id, its admin's token, the cluster, the pool).
async fn subscribed(app: &TestApp) -> (String, String, String, String) {
    machine_class(app, "cpu", 0).await;
    fleet(app, "cpu", 4).await;
    let provider_events =
        [&CLUSTER_EVENTS[..], &["machine.state_changed", "machine.quarantined", "usage.period_closed"]].concat();
    let provider_events = [&provider_events[..], &["machine.health_reported"]].concat();
    subscribe(app, "/v1/webhooks", &admin(), NOWHERE, &provider_events).await;
    let (t, bearer, cluster, pool) = tenant_with_cluster(app, "acme").await;
    subscribe(app, &format!("/v1/tenants/{t}/webhooks"), &bearer, NOWHERE, &CLUSTER_EVENTS).await;
    (t, bearer, cluster, pool)
}

/// [`carries_view`] of a tenant's resource at `path`, which the tenant reads at the same path.
async fn tenant_view(app: &TestApp, type_: &str, path: &str, bearer: &str) {
    carries_view(app, type_, path, Some((path, bearer))).await;
}

/// [`carries_view`] of an operation, which the tenant reads under its own path.
async fn operation_view(app: &TestApp, type_: &str, tenant: &str, operation: &str, bearer: &str) {
    let tenant_path = format!("/v1/tenants/{tenant}/operations/{operation}");
    carries_view(app, type_, &format!("/v1/operations/{operation}"), Some((&tenant_path, bearer))).await;
}

#[tokio::test]
async fn every_cluster_events_data_is_the_apis_view_for_the_provider_and_the_tenant() {
    let app = app().await;
    let (t, bearer, cluster, pool) = subscribed(&app).await;
    let cluster_path = format!("/v1/tenants/{t}/clusters/{cluster}");
    let pool_path = format!("{cluster_path}/node-pools/{pool}");

    sql(&app, "update clusters set phase = 'ready' where id = $1::uuid", &cluster).await;
    tenant_view(&app, "cluster.ready", &cluster_path, &bearer).await;
    let created = open_operation(&app, &cluster).await;
    sql(&app, "update operations set state = 'succeeded', finished_at = now() where id = $1::uuid", &created).await;
    operation_view(&app, "operation.succeeded", &t, &created, &bearer).await;
    let scaled = app.patch(&pool_path).token(&bearer).json(&json!({ "count": 2 })).send().await.expect(202).json();
    tenant_view(&app, "node_pool.scaled", &pool_path, &bearer).await;

    let failed = id(&scaled["operation"]);
    let problem = json!({
        "type": "https://paddock.dev/problems/internal", "title": "Internal error", "status": 500,
        "detail": "the pool could not be scaled", "instance": format!("/v1/operations/{failed}"),
        "code": "internal", "request_id": "r-1"
    });
    // As the store fails an operation: its running step ends with SQL's `now()` in the JSON.
    sqlx::query(
        "update operations set state = 'failed', finished_at = now(), error = $2, steps = (select \
         jsonb_agg(s || jsonb_build_object('state', 'failed', 'started_at', now(), 'finished_at', now()) \
         order by n) from jsonb_array_elements(steps) with ordinality e(s, n)) where id = $1::uuid",
    )
    .bind(&failed)
    .bind(&problem)
    .execute(&app.db.pool)
    .await
    .expect("failing the operation");
    operation_view(&app, "operation.failed", &t, &failed, &bearer).await;

    // Conditions and endpoints as the worker writes them.
    sqlx::query(
        "update clusters set phase = 'degraded', endpoints = $2, conditions = $3, updated_at = \
         date_trunc('milliseconds', now()) where id = $1::uuid",
    )
    .bind(&cluster)
    .bind(json!({ "kubernetes_api": "https://10.0.0.1:6443" }))
    .bind(json!([{ "type": "ControlPlaneReady", "status": "False", "reason": "Down", "message": "down",
        "last_transition_time": "2026-12-06T10:00:00.120000+00:00" }]))
    .execute(&app.db.pool)
    .await
    .expect("degrading");
    tenant_view(&app, "cluster.degraded", &cluster_path, &bearer).await;

    // A deleted cluster is not shown any more: its event carries the view of its last moment.
    app.delete(&cluster_path).token(&bearer).send().await.expect(202);
    let last = shown(&app, &cluster_path, &admin()).await;
    let last_to_tenant = shown(&app, &cluster_path, &bearer).await;
    sql(&app, "update clusters set deleted_at = now() where id = $1::uuid", &cluster).await;
    carries(&app, "cluster.deleted", &cluster_path, &last, Some(&last_to_tenant)).await;
}

#[tokio::test]
async fn other_cluster_and_pool_shapes_are_the_apis_view_too() {
    let app = app().await;
    let (t, bearer, _, _) = subscribed(&app).await;
    // A Kubernetes cluster (no Slurm) whose pool has labels and taints; a Slurm cluster with
    // partitions of its own; a Ray cluster.
    let kube = json!({
        "name": "k1", "kind": "kubernetes", "isolation": "private-nodes",
        "node_pools": [{ "name": "gpu", "machine_class": "cpu", "count": 1, "labels": { "team": "a" },
            "taints": [{ "key": "gpu", "value": "yes", "effect": "NoSchedule" }] }]
    });
    let slurm = json!({
        "name": "s2", "kind": "slurm", "isolation": "private-nodes",
        "slurm": { "partitions": [{ "name": "all", "node_pools": ["cpu"], "default": true, "max_time": "1-00:00:00" }] },
        "node_pools": [{ "name": "cpu", "machine_class": "cpu", "count": 1 },
            { "name": "sys", "machine_class": "cpu", "count": 1, "role": "system" }]
    });
    // A Ray cluster, with its Ray settings and endpoints.
    let ray = json!({
        "name": "r3", "kind": "ray", "isolation": "private-nodes", "ray": { "head": { "node_pool": "cpu" } },
        "node_pools": [{ "name": "cpu", "machine_class": "cpu", "count": 1 }]
    });
    for (body, count) in [(kube, 0), (slurm, 2), (ray, 2)] {
        let made =
            app.post(format!("/v1/tenants/{t}/clusters")).token(&bearer).json(&body).send().await.expect(202).json();
        let cluster = id(&made["cluster"]);
        let cluster_path = format!("/v1/tenants/{t}/clusters/{cluster}");
        let endpoints =
            r#"{"ray_client": "ray://ray-head-svc.ray.svc:10001", "dashboard": "http://ray-head-svc.ray.svc:8265"}"#;
        let ray_endpoints =
            format!("update clusters set endpoints = '{endpoints}' where id = $1::uuid and kind = 'ray'");
        sql(&app, &ray_endpoints, &cluster).await;
        sql(&app, "update clusters set phase = 'ready' where id = $1::uuid", &cluster).await;
        tenant_view(&app, "cluster.ready", &cluster_path, &bearer).await;
        let pool_path = format!("{cluster_path}/node-pools/{}", id(&made["cluster"]["node_pools"][0]));
        app.patch(&pool_path).token(&bearer).json(&json!({ "count": count })).send().await.expect(202);
        tenant_view(&app, "node_pool.scaled", &pool_path, &bearer).await;
    }
}

#[tokio::test]
async fn fleet_and_billing_events_carry_the_providers_view_and_nothing_for_tenants() {
    let app = app().await;
    subscribed(&app).await;
    let machine: String = sqlx::query_scalar("select id::text from machines where allocation_id is null limit 1")
        .fetch_one(&app.db.pool)
        .await
        .expect("a free machine");
    let machine_path = format!("/v1/machines/{machine}");
    set_machine_state(&app, &machine, "maintenance").await;
    carries_view(&app, "machine.state_changed", &machine_path, None).await;
    let never = shown(&app, &machine_path, &admin()).await;
    assert_eq!(never["health"], Value::Null, "no report yet: {never}");
    // An operator's report: its event carries the report as listed, and the machine's view its
    // health from then on.
    let report = json!({ "status": "failed", "observed_at": "2026-12-01T10:00:00.5Z",
        "checks": [{ "name": "gpu.ecc", "status": "failed", "detail": "GPU 3: 41 uncorrectable ECC errors" }] });
    let reports = format!("{machine_path}/health-reports");
    let recorded = app.post(&reports).token(&admin()).json(&report).send().await.expect(201).json();
    let listed = shown(&app, &reports, &admin()).await;
    carries(&app, "machine.health_reported", &reports, &listed["items"][0], None).await;
    assert_eq!(listed["items"][0], recorded);
    set_machine_state(&app, &machine, "clean_failed").await;
    carries_view(&app, "machine.state_changed", &machine_path, None).await;
    carries_view(&app, "machine.quarantined", &machine_path, None).await;
    let health = shown(&app, &machine_path, &admin()).await["health"].clone();
    assert_eq!(health["report_id"], recorded["id"], "{health}");
    // As the worker records an error: SQL's `now()` in the JSON.
    sqlx::query(
        "update machines set labels = '{\"rack\": \"r1\"}', last_error = jsonb_build_object('code', \
         'bmc_unreachable', 'message', 'no answer', 'at', now()) where id = $1::uuid",
    )
    .bind(&machine)
    .execute(&app.db.pool)
    .await
    .expect("a last error");
    set_machine_state(&app, &machine, "maintenance").await;
    carries_view(&app, "machine.state_changed", &machine_path, None).await;

    close_period(&app, "2026-01", "webhook-views").await;
    carries_view(&app, "usage.period_closed", "/v1/usage/periods/2026-01", None).await;
}

#[tokio::test]
async fn an_event_is_written_only_when_a_subscription_of_its_audience_wants_it() {
    let app = app().await;
    machine_class(&app, "cpu", 0).await;
    fleet(&app, "cpu", 3).await;
    let (a, a_bearer, a_cluster, _) = tenant_with_cluster(&app, "acme").await;
    let (_, _, b_cluster, _) = tenant_with_cluster(&app, "globex").await;
    let machine: String = sqlx::query_scalar("select id::text from machines where allocation_id is null limit 1")
        .fetch_one(&app.db.pool)
        .await
        .expect("a free machine");
    let flip = async |cluster: &str| {
        sql(&app, "update clusters set phase = 'pending' where id = $1::uuid", cluster).await;
        sql(&app, "update clusters set phase = 'ready' where id = $1::uuid", cluster).await;
    };

    // Nobody listens: changes write nothing.
    set_machine_state(&app, &machine, "maintenance").await;
    flip(&a_cluster).await;
    close_period(&app, "2026-01", "nobody").await;
    assert_eq!(count_events(&app).await, 0, "events written for nobody");

    // Tenant A wants its clusters' readiness: not B's, not its degradation, not the fleet's.
    let hook = subscribe(&app, &format!("/v1/tenants/{a}/webhooks"), &a_bearer, NOWHERE, &["cluster.ready"]).await;
    flip(&b_cluster).await;
    sql(&app, "update clusters set phase = 'degraded' where id = $1::uuid", &a_cluster).await;
    set_machine_state(&app, &machine, "available").await;
    assert_eq!(count_events(&app).await, 0, "events written that only others could want");
    flip(&a_cluster).await;
    assert_eq!(count_events(&app).await, 1, "tenant A's subscription wants its cluster's readiness");

    // A disabled subscription wants nothing.
    app.patch(format!("/v1/tenants/{a}/webhooks/{}", id(&hook)))
        .token(&a_bearer)
        .json(&json!({ "enabled": false }))
        .send()
        .await
        .expect(200);
    flip(&a_cluster).await;
    assert_eq!(count_events(&app).await, 1, "an event written for a disabled subscription");

    // The provider's subscription wants the fleet's transitions.
    let fleet_hook = subscribe(&app, "/v1/webhooks", &admin(), NOWHERE, &["machine.state_changed"]).await;
    set_machine_state(&app, &machine, "maintenance").await;
    assert_eq!(count_events(&app).await, 2, "the provider's subscription wants the machine's transition");
    // A deleted one wants nothing either.
    app.delete(format!("/v1/webhooks/{}", id(&fleet_hook))).token(&admin()).send().await.expect(204);
    set_machine_state(&app, &machine, "available").await;
    assert_eq!(count_events(&app).await, 2, "an event written for a deleted subscription");
}
