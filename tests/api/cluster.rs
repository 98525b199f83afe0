//! Clusters and node pools through the API: defaults, validation, quotas (checked at the API,
//! serialized per tenant), suspended tenants, patches, deletion, events, and the reconcile job
//! enqueued with every change.

use paddock_testkit::{admin, token, TestApp};
use serde_json::{json, Value};

use crate::common::{id, machine, machine_class, tenant};

fn slurm_cluster(name: &str) -> Value {
    json!({
        "name": name, "kind": "slurm", "isolation": "private-nodes",
        "node_pools": [
            { "name": "cpu", "machine_class": "cpu", "count": 1, "role": "system" },
            { "name": "gpu", "machine_class": "gpu", "count": 2, "taints": [{ "key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule" }] }
        ]
    })
}

async fn world(app: &TestApp) -> (String, String) {
    machine_class(app, "cpu", 0).await;
    machine_class(app, "gpu", 8).await;
    crate::common::fleet(app, "cpu", 4).await;
    crate::common::fleet(app, "gpu", 4).await;
    let t = tenant(app, "acme").await;
    let tenant_id = id(&t);
    let admin_token = token(&["tenant:admin"], Some(tenant_id.parse().expect("uuid")));
    (tenant_id, admin_token)
}

async fn reconcile_jobs(app: &TestApp, cluster: &str) -> i64 {
    sqlx::query_scalar(
        "select count(*) from jobs where target_id = $1::uuid and kind = 'cluster_reconcile' and state = 'queued'",
    )
    .bind(cluster)
    .fetch_one(&app.db.pool)
    .await
    .expect("jobs")
}

#[tokio::test]
async fn cluster_create_fills_defaults_and_enqueues_its_reconcile_job() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let resp = app
        .post(format!("/v1/tenants/{tenant_id}/clusters"))
        .token(&t)
        .json(&slurm_cluster("hpc"))
        .send()
        .await
        .expect(202);
    let body = resp.json();
    let cluster = &body["cluster"];
    assert_eq!(resp.header("location"), Some(format!("/v1/tenants/{tenant_id}/clusters/{}", id(cluster)).as_str()));
    assert_eq!(cluster["kubernetes_version"], "v1.35.0");
    assert_eq!(cluster["slurm"]["version"], "26.05", "the newest stack's default release");
    assert_eq!(cluster["stack_version"], "2026.12.3", "a new cluster runs the newest base stack");
    assert_eq!(cluster["slurm"]["login"], json!({ "replicas": 1, "ssh_authorized_keys": [] }));
    let partitions = cluster["slurm"]["partitions"].as_array().expect("partitions");
    assert_eq!(partitions.len(), 1, "one partition per compute pool by default");
    assert_eq!(partitions[0], json!({ "name": "gpu", "node_pools": ["gpu"], "default": true, "max_time": null }));
    assert_eq!(cluster["status"]["phase"], "pending");
    assert_eq!(cluster["status"]["observed_generation"], 0);
    assert_eq!(cluster["node_pools"].as_array().map(Vec::len), Some(2));
    assert_eq!(body["operation"]["kind"], "cluster_create");
    assert_eq!(body["operation"]["tenant_id"], tenant_id.as_str());
    assert_eq!(reconcile_jobs(&app, &id(cluster)).await, 1);

    let ops = app.get(format!("/v1/tenants/{tenant_id}/operations")).token(&t).send().await.expect(200).json();
    assert_eq!(ops["items"][0]["id"], body["operation"]["id"]);
    let events = app
        .get(format!("/v1/tenants/{tenant_id}/clusters/{}/events", id(cluster)))
        .token(&t)
        .send()
        .await
        .expect(200)
        .json();
    assert_eq!(events["items"][0]["reason"], "ClusterCreated");
}

#[tokio::test]
async fn invalid_clusters_are_422_and_write_nothing() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let cases = [
        (json!({ "name": "a", "kind": "slurm", "isolation": "shared" }), "isolation"),
        (json!({ "name": "a", "kind": "kubernetes", "isolation": "private-nodes", "slurm": {} }), "slurm"),
        (
            json!({ "name": "a", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": [{ "name": "p", "machine_class": "nope", "count": 1 }] }),
            "node_pools[0].machine_class",
        ),
        (
            json!({ "name": "a", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": [{ "name": "p", "machine_class": "cpu", "count": 1 }, { "name": "p", "machine_class": "cpu", "count": 1 }] }),
            "node_pools[1].name",
        ),
        (
            json!({ "name": "a", "kind": "kubernetes", "isolation": "private-nodes", "kubernetes_version": "latest" }),
            "kubernetes_version",
        ),
        (
            json!({ "name": "a", "kind": "slurm", "isolation": "private-nodes", "node_pools": [{ "name": "p", "machine_class": "cpu", "count": 1, "role": "system" }],
                 "slurm": { "partitions": [{ "name": "x", "node_pools": ["q"] }] } }),
            "slurm.partitions[0].node_pools",
        ),
        (
            json!({ "name": "a", "kind": "slurm", "isolation": "private-nodes", "node_pools": [{ "name": "p", "machine_class": "cpu", "count": 1, "role": "system" }],
                 "slurm": { "login": { "ssh_authorized_keys": ["not a key"] } } }),
            "slurm.login.ssh_authorized_keys[0]",
        ),
    ];
    for (body, field) in cases {
        let problem = app.post(&path).token(&t).json(&body).send().await.problem(422, "validation_failed");
        let fields: Vec<&str> =
            problem["errors"].as_array().expect("errors").iter().filter_map(|e| e["field"].as_str()).collect();
        assert!(fields.contains(&field), "{body}: expected an error on {field}, got {problem}");
    }
    // A count past the document's maximum is past the fleet too: its 409 comes first (docs/api.md).
    let huge = json!({ "name": "a", "kind": "kubernetes", "isolation": "private-nodes",
                       "node_pools": [{ "name": "p", "machine_class": "cpu", "count": 10001 }] });
    app.post(&path).token(&t).json(&huge).send().await.problem(409, "insufficient_capacity");
    assert_eq!(app.count("clusters").await, 0);
    assert_eq!(app.count("node_pools").await, 0);
    let cluster_jobs: i64 = sqlx::query_scalar("select count(*) from jobs where target_type <> 'machine'")
        .fetch_one(&app.db.pool)
        .await
        .expect("count");
    assert_eq!(cluster_jobs, 0, "no job but the fleet's enrollments");
}

#[tokio::test]
async fn quotas_are_checked_against_desired_counts() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    app.patch(format!("/v1/tenants/{tenant_id}"))
        .token(&admin())
        .json(&json!({ "quotas": { "max_clusters": 2, "max_nodes": 4, "max_gpus": 16 } }))
        .send()
        .await
        .expect(200);
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    // 3 nodes, 16 GPUs: within every quota.
    let first = app.post(&path).token(&t).json(&slurm_cluster("one")).send().await.expect(202).json();
    // One more GPU node would make 24 GPUs.
    let more_gpus = json!({ "name": "two", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": [{ "name": "g", "machine_class": "gpu", "count": 1 }] });
    let problem = app.post(&path).token(&t).json(&more_gpus).send().await.problem(409, "quota_exceeded");
    assert!(problem["detail"].as_str().expect("detail").contains("GPUs"), "{problem}");
    // Two CPU nodes would make 5 nodes.
    let more_nodes = json!({ "name": "two", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": [{ "name": "c", "machine_class": "cpu", "count": 2 }] });
    app.post(&path).token(&t).json(&more_nodes).send().await.problem(409, "quota_exceeded");
    let empty = json!({ "name": "two", "kind": "kubernetes", "isolation": "private-nodes" });
    app.post(&path).token(&t).json(&empty).send().await.expect(202);
    let third = json!({ "name": "three", "kind": "kubernetes", "isolation": "private-nodes" });
    app.post(&path).token(&t).json(&third).send().await.problem(409, "quota_exceeded");
    assert_eq!(app.count("clusters").await, 2);

    // Scaling up past the quota is refused, scaling down always works.
    let cluster = id(&first["cluster"]);
    let cpu_pool = id(&first["cluster"]["node_pools"][0]);
    let pool_path = format!("{path}/{cluster}/node-pools/{cpu_pool}");
    app.patch(&pool_path).token(&t).json(&json!({ "count": 3 })).send().await.problem(409, "quota_exceeded");
    app.patch(&pool_path).token(&t).json(&json!({ "count": 2 })).send().await.expect(202);
}

/// The order of checks (docs/api.md): a 409 comes before any 422. A tenant at `max_clusters`
/// that names an unknown class, or asks for more nodes than its quota with an invalid value
/// elsewhere, hears of the quota; a pool of an unknown class over the nodes quota too.
#[tokio::test]
async fn a_quota_409_comes_before_the_values_422() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let quotas = json!({ "quotas": { "max_clusters": 1, "max_nodes": 3 } });
    app.patch(format!("/v1/tenants/{tenant_id}")).token(&admin()).json(&quotas).send().await.expect(200);
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let unknown_class = |name: &str, count: u32| {
        json!({ "name": name, "kind": "kubernetes", "isolation": "private-nodes",
                "node_pools": [{ "name": "x", "machine_class": "no-such-class", "count": count }] })
    };
    // Within the quotas, the unknown class is the answer.
    app.post(&path).token(&t).json(&unknown_class("one", 1)).send().await.problem(422, "validation_failed");
    // Over the nodes quota, whatever the class.
    app.post(&path).token(&t).json(&unknown_class("one", 4)).send().await.problem(409, "quota_exceeded");
    let created = app.post(&path).token(&t).json(&slurm_cluster("one")).send().await.expect(202).json();
    // At `max_clusters`: the quota, before the unknown class and the invalid name.
    app.post(&path).token(&t).json(&unknown_class("Not_A_Label", 1)).send().await.problem(409, "quota_exceeded");
    // A pool of an unknown class past the nodes quota.
    let pools = format!("{path}/{}/node-pools", id(&created["cluster"]));
    let pool = json!({ "name": "more", "machine_class": "no-such-class", "count": 5 });
    app.post(&pools).token(&t).json(&pool).send().await.problem(409, "quota_exceeded");
    assert_eq!(app.count("clusters").await, 1);
}

/// Allocation (docs/architecture.md): a cluster asking for more machines of a class than the fleet holds
/// could never be served and would only hold up the class's line: 409 `insufficient_capacity`,
/// whether in one pool, across pools or by a scale, with nothing written and nothing said of the
/// fleet's size.
#[tokio::test]
async fn demand_beyond_the_fleet_is_refused_without_saying_its_size() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let pools = |counts: &[u32]| {
        let pools: Vec<Value> = counts
            .iter()
            .enumerate()
            .map(|(i, n)| json!({ "name": format!("p{i}"), "machine_class": "cpu", "count": n }))
            .collect();
        json!({ "name": "big", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": pools })
    };
    for counts in [&[5][..], &[3, 2]] {
        let problem = app.post(&path).token(&t).json(&pools(counts)).send().await.problem(409, "insufficient_capacity");
        let detail = problem["detail"].as_str().expect("detail");
        assert!(!detail.chars().any(|c| c.is_ascii_digit()), "{problem}");
    }
    assert_eq!(app.count("clusters").await, 0);
    assert_eq!(app.count("node_pools").await, 0);
    // The whole fleet is a fine request; one more by a scale is not.
    let created = app.post(&path).token(&t).json(&pools(&[4])).send().await.expect(202).json();
    let pool = id(&created["cluster"]["node_pools"][0]);
    let pool_path = format!("{path}/{}/node-pools/{pool}", id(&created["cluster"]));
    app.patch(&pool_path).token(&t).json(&json!({ "count": 5 })).send().await.problem(409, "insufficient_capacity");
    let after: Value = app.get(&pool_path).token(&t).send().await.expect(200).json();
    assert_eq!(after["count"], 4, "{after}");
    // The provider, who owns the fleet, is told the bound and what is free.
    let problem = app
        .patch(&pool_path)
        .token(&admin())
        .json(&json!({ "count": 5 }))
        .send()
        .await
        .problem(409, "insufficient_capacity");
    let detail = problem["detail"].as_str().expect("detail");
    assert!(detail.contains("holds 4 machines of class cpu") && detail.contains("0 of them available"), "{problem}");
    assert!(detail.contains("would want 5"), "{problem}");
}

#[tokio::test]
async fn concurrent_creates_never_exceed_the_cluster_quota() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    app.patch(format!("/v1/tenants/{tenant_id}"))
        .token(&admin())
        .json(&json!({ "quotas": { "max_clusters": 1 } }))
        .send()
        .await
        .expect(200);
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let bodies: Vec<Value> = (0..6)
        .map(|i| json!({ "name": format!("c{i}"), "kind": "kubernetes", "isolation": "private-nodes" }))
        .collect();
    let sends = bodies.iter().map(|b| app.post(&path).token(&t).json(b).send());
    let statuses: Vec<u16> = futures::future::join_all(sends).await.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 5, "{statuses:?}");
    assert_eq!(app.count("clusters").await, 1);
}

#[tokio::test]
async fn a_suspended_tenant_cannot_change_its_clusters_but_the_provider_can() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let created = app.post(&path).token(&t).json(&slurm_cluster("hpc")).send().await.expect(202).json();
    app.post(format!("/v1/tenants/{tenant_id}/suspend")).token(&admin()).send().await.expect(200);
    let other = json!({ "name": "other", "kind": "kubernetes", "isolation": "private-nodes" });
    app.post(&path).token(&t).json(&other).send().await.problem(409, "tenant_suspended");
    let cluster_path = format!("{path}/{}", id(&created["cluster"]));
    app.delete(&cluster_path).token(&t).send().await.problem(409, "tenant_suspended");
    app.get(&cluster_path).token(&t).send().await.expect(200);
    app.post(&path).token(&admin()).json(&other).send().await.expect(202);
}

#[tokio::test]
async fn slurm_versions_follow_the_clusters_base_stack() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let clusters = format!("/v1/tenants/{tenant_id}/clusters");

    // The newest stack's operator (slurm-operator 1.2.1) runs Slurm 25.11 and newer only, and
    // the stack has images of 25.11 and 26.05: a release without images is refused, naming them.
    for version in ["25.05", "24.11", "26.11"] {
        let mut older = slurm_cluster("old-slurm");
        older["slurm"] = json!({ "version": version });
        let problem = app.post(&clusters).token(&t).json(&older).send().await.expect(422).json();
        assert_eq!(problem["code"], "validation_failed", "{problem}");
        assert_eq!(problem["errors"][0]["field"], "slurm.version", "{problem}");
        let says =
            format!("Slurm {version} is not supported by the cluster's base stack 2026.12.3 (supported: 25.11, 26.05)");
        assert!(problem["errors"].to_string().contains(&says), "{problem}");
    }
    let count: i64 = sqlx::query_scalar("select count(*) from clusters").fetch_one(&app.db.pool).await.expect("count");
    assert_eq!(count, 0, "nothing written");
    for version in ["25.11", "26.05"] {
        let mut chosen = slurm_cluster(&format!("slurm-{}", version.replace('.', "-")));
        chosen["slurm"] = json!({ "version": version });
        let created = app.post(&clusters).token(&t).json(&chosen).send().await.expect(202).json();
        assert_eq!(created["cluster"]["slurm"]["version"], version);
        assert_eq!(created["cluster"]["stack_version"], "2026.12.3");
    }

    // A cluster created on 2026.12.0 keeps that stack and its 25.11: the new stack's 26.05 is not
    // its to take without moving its stack.
    let created = app.post(&clusters).token(&t).json(&slurm_cluster("before")).send().await.expect(202).json();
    let before = id(&created["cluster"]);
    sqlx::query(
        "update clusters set stack_version = '2026.12.0', slurm = slurm || '{\"version\": \"25.11\"}' \
         where id = $1::uuid",
    )
    .bind(&before)
    .execute(&app.db.pool)
    .await
    .expect("put the cluster on 2026.12.0");
    let path = format!("{clusters}/{before}");
    let patch = json!({ "slurm": { "login": { "replicas": 2 } } });
    let body = app.patch(&path).token(&t).header("if-match", "\"1\"").json(&patch).send().await.expect(202).json();
    assert_eq!(
        (body["cluster"]["stack_version"].as_str(), body["cluster"]["slurm"]["version"].as_str()),
        (Some("2026.12.0"), Some("25.11"))
    );
    let patch = json!({ "slurm": { "version": "26.05" } });
    let problem = app.patch(&path).token(&t).header("if-match", "\"2\"").json(&patch).send().await.expect(422).json();
    assert!(problem["errors"].to_string().contains("base stack 2026.12.0 (supported: 25.11)"), "{problem}");
    let kept = app.get(&path).token(&t).send().await.expect(200).json();
    assert_eq!((kept["stack_version"].as_str(), kept["slurm"]["version"].as_str()), (Some("2026.12.0"), Some("25.11")));

    // A cluster created on the older stack keeps it, and with it that stack's Slurm releases.
    let created = app.post(&clusters).token(&t).json(&slurm_cluster("hpc")).send().await.expect(202).json();
    let cluster = id(&created["cluster"]);
    sqlx::query("update clusters set stack_version = '2026.11.0' where id = $1::uuid")
        .bind(&cluster)
        .execute(&app.db.pool)
        .await
        .expect("put the cluster on the older stack");
    let path = format!("{clusters}/{cluster}");
    let patch = json!({ "slurm": { "version": "25.05" } });
    let body = app.patch(&path).token(&t).header("if-match", "\"1\"").json(&patch).send().await.expect(202).json();
    assert_eq!(body["cluster"]["stack_version"], "2026.11.0");
    assert_eq!(body["cluster"]["slurm"]["version"], "25.05");
    let patch = json!({ "slurm": { "version": "24.05" } });
    let problem = app.patch(&path).token(&t).header("if-match", "\"2\"").json(&patch).send().await.expect(422).json();
    assert!(problem["errors"].to_string().contains("supported: 24.11, 25.05, 25.11"), "{problem}");
}

#[tokio::test]
async fn a_cluster_moves_to_a_newer_base_stack_only_with_a_slurm_that_stack_runs() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let clusters = format!("/v1/tenants/{tenant_id}/clusters");
    let created = app.post(&clusters).token(&t).json(&slurm_cluster("hpc")).send().await.expect(202).json();
    let cluster = id(&created["cluster"]);
    // A cluster of the older stack, on a Slurm the newer one does not run.
    sqlx::query("update clusters set stack_version = '2026.11.0', slurm = slurm || '{\"version\": \"25.05\"}' where id = $1::uuid")
        .bind(&cluster)
        .execute(&app.db.pool)
        .await
        .expect("put the cluster on the older stack");
    let path = format!("{clusters}/{cluster}");
    let patch =
        |etag: &str, body: Value| app.patch(&path).token(&t).header("if-match", &format!("\"{etag}\"")).json(&body);

    // Refused, and nothing written: the new stack's operator does not run 25.05.
    let problem = patch("1", json!({ "stack_version": "2026.12.0" })).send().await.expect(422).json();
    assert!(problem["errors"].to_string().contains("base stack 2026.12.0 (supported: 25.11)"), "{problem}");
    for (body, says) in [
        (
            json!({ "stack_version": "2099.1.0" }),
            "no stack definition has version 2099.1.0 (known: 2026.11.0, 2026.12.0, 2026.12.1, 2026.12.2, 2026.12.3)",
        ),
        (json!({ "stack_version": null }), "cannot be removed"),
        (json!({ "stack_version": 3 }), "such as 2026.12.0"),
    ] {
        let problem = patch("1", body).send().await.expect(422).json();
        assert_eq!(problem["errors"][0]["field"], "stack_version", "{problem}");
        assert!(problem["errors"].to_string().contains(says), "{says}: {problem}");
    }
    let unchanged = app.get(&path).token(&t).send().await.expect(200).json();
    assert_eq!((unchanged["stack_version"].as_str(), unchanged["generation"].as_i64()), (Some("2026.11.0"), Some(1)));

    // With the Slurm release in the same patch it moves, as a spec change the worker reconciles.
    let body = json!({ "stack_version": "2026.12.0", "slurm": { "version": "25.11" } });
    let moved = patch("1", body).send().await.expect(202).json();
    assert_eq!(moved["cluster"]["stack_version"], "2026.12.0");
    assert_eq!(moved["cluster"]["slurm"]["version"], "25.11");
    assert_eq!(moved["cluster"]["generation"], 2);
    assert_eq!(moved["operation"]["kind"], "cluster_update");
    let events = app.get(format!("{path}/events")).token(&t).send().await.expect(200).json();
    assert!(events.to_string().contains("the cluster's base stack moves from 2026.11.0 to 2026.12.0"), "{events}");

    // Never back.
    let problem = patch("2", json!({ "stack_version": "2026.11.0" })).send().await.expect(422).json();
    assert!(problem["errors"].to_string().contains("can only go up (it runs 2026.12.0)"), "{problem}");
    // The same version again changes nothing.
    let same = patch("2", json!({ "stack_version": "2026.12.0" })).send().await.expect(202).json();
    assert_eq!(same["cluster"]["generation"], 2);
}

#[tokio::test]
async fn cluster_patch_upgrades_and_refuses_immutable_fields_and_downgrades() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let created = app
        .post(format!("/v1/tenants/{tenant_id}/clusters"))
        .token(&t)
        .json(&slurm_cluster("hpc"))
        .send()
        .await
        .expect(202)
        .json();
    let path = format!("/v1/tenants/{tenant_id}/clusters/{}", id(&created["cluster"]));
    let body = app
        .patch(&path)
        .token(&t)
        .header("if-match", "\"1\"")
        .json(&json!({ "kubernetes_version": "v1.35.2", "slurm": { "login": { "replicas": 2 } } }))
        .send()
        .await
        .expect(202)
        .json();
    assert_eq!(body["cluster"]["generation"], 2);
    assert_eq!(body["cluster"]["slurm"]["login"]["replicas"], 2);
    assert_eq!(body["operation"]["kind"], "cluster_update");
    let changed = app
        .patch(&path)
        .token(&t)
        .header("if-match", "\"1\"")
        .json(&json!({ "kubernetes_version": "v1.35.3" }))
        .send()
        .await
        .problem(412, "precondition_failed");
    assert!(changed["detail"].as_str().expect("detail").contains("changed: its etag is now \"2\""), "{changed}");
    // The current etag, but weak or unquoted: still refused (strong comparison), saying how to
    // write it rather than that the object changed.
    for misquoted in ["2", "W/\"2\""] {
        let problem = app
            .patch(&path)
            .token(&t)
            .header("if-match", misquoted)
            .json(&json!({ "kubernetes_version": "v1.35.3" }))
            .send()
            .await
            .problem(412, "precondition_failed");
        let detail = problem["detail"].as_str().expect("detail");
        assert!(detail.contains("has not changed") && detail.contains("\"2\""), "{misquoted}: {problem}");
    }
    app.patch(&path)
        .token(&t)
        .json(&json!({ "kubernetes_version": "v1.34.0" }))
        .send()
        .await
        .problem(422, "validation_failed");
    app.patch(&path).token(&t).json(&json!({ "kind": "kubernetes" })).send().await.problem(422, "validation_failed");
    app.patch(&path).token(&t).json(&json!({ "node_pools": [] })).send().await.problem(422, "validation_failed");
    // A merge patch's null would remove a slurm cluster's Slurm settings (found by the fuzzer: a 500).
    let problem = app
        .patch(&path)
        .token(&t)
        .json(&json!({ "kubernetes_version": "v1.35.3", "slurm": null }))
        .send()
        .await
        .problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "slurm", "{problem}");
    let unchanged = app.get(&path).token(&t).send().await.expect(200).json();
    assert_eq!(
        (unchanged["generation"].clone(), unchanged["slurm"]["login"]["replicas"].clone()),
        (json!(2), json!(2))
    );
    // The first operation was superseded by the newer change.
    let first =
        app.get(format!("/v1/operations/{}", id(&created["operation"]))).token(&t).send().await.expect(200).json();
    assert_eq!(first["state"], "superseded");
    assert_eq!(reconcile_jobs(&app, &id(&created["cluster"])).await, 1, "queued requests merge into one job");
}

#[tokio::test]
async fn cluster_delete_marks_it_deleting_and_refuses_further_changes() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let created = app
        .post(format!("/v1/tenants/{tenant_id}/clusters"))
        .token(&t)
        .json(&slurm_cluster("hpc"))
        .send()
        .await
        .expect(202)
        .json();
    let path = format!("/v1/tenants/{tenant_id}/clusters/{}", id(&created["cluster"]));
    let body = app.delete(&path).token(&t).send().await.expect(202).json();
    assert_eq!(body["cluster"]["status"]["phase"], "deleting");
    assert_eq!(body["operation"]["kind"], "cluster_delete");
    app.patch(&path)
        .token(&t)
        .json(&json!({ "kubernetes_version": "v1.36.0" }))
        .send()
        .await
        .problem(409, "cluster_deleting");
    app.delete(&path).token(&t).send().await.problem(409, "cluster_deleting");
    // Until the worker confirms every object gone, the cluster is still there and holds the tenant.
    app.get(&path).token(&t).send().await.expect(200);
    app.delete(format!("/v1/tenants/{tenant_id}")).token(&admin()).send().await.problem(409, "tenant_not_empty");
    // A deleting cluster no longer counts against the cluster quota.
    app.patch(format!("/v1/tenants/{tenant_id}"))
        .token(&admin())
        .json(&json!({ "quotas": { "max_clusters": 1 } }))
        .send()
        .await
        .expect(200);
    app.post(format!("/v1/tenants/{tenant_id}/clusters"))
        .token(&t)
        .json(&slurm_cluster("next"))
        .send()
        .await
        .expect(202);
}

fn role_pool(name: &str, count: u32, role: &str) -> Value {
    json!({ "name": name, "machine_class": "cpu", "count": count, "role": role })
}

fn slurm_of(pools: Value) -> Value {
    json!({ "name": "hpc", "kind": "slurm", "isolation": "private-nodes", "node_pools": pools })
}

#[tokio::test]
async fn a_slurm_cluster_needs_exactly_one_system_pool_with_a_node_and_a_kubernetes_one_none() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let (pool, slurm) = (role_pool, slurm_of);
    // Each broken rule of the system pool at creation: 422 with its own code, nothing written.
    let refused = [
        (slurm(json!([pool("cpu", 1, "compute")])), "system_pool_required", "node_pools"),
        (slurm(json!([])), "system_pool_required", "node_pools"),
        (
            slurm(json!([pool("sys", 0, "system"), pool("cpu", 1, "compute")])),
            "system_pool_empty",
            "node_pools[0].count",
        ),
        (slurm(json!([pool("a", 1, "system"), pool("b", 1, "system")])), "system_pool_duplicate", "node_pools[1].role"),
        (
            json!({ "name": "k", "kind": "kubernetes", "isolation": "private-nodes", "node_pools": [pool("sys", 1, "system")] }),
            "system_pool_unsupported",
            "node_pools[0].role",
        ),
    ];
    for (body, code, field) in refused {
        let problem = app.post(&path).token(&t).json(&body).send().await.problem(422, code);
        assert_eq!(problem["errors"][0]["field"], field, "{body}: {problem}");
    }
    // No partition may name the system pool: it runs no jobs.
    let mut named = slurm(json!([pool("sys", 1, "system"), pool("cpu", 1, "compute")]));
    named["slurm"] = json!({ "partitions": [{ "name": "all", "node_pools": ["sys", "cpu"] }] });
    app.post(&path).token(&t).json(&named).send().await.problem(422, "validation_failed");
    assert_eq!(app.count("clusters").await, 0);

    // A kubernetes cluster's pools are all compute pools: none may become a system pool.
    let kube = json!({ "name": "k", "kind": "kubernetes", "isolation": "private-nodes" });
    let kube = app.post(&path).token(&t).json(&kube).send().await.expect(202).json();
    let kube_pools = format!("{path}/{}/node-pools", id(&kube["cluster"]));
    let problem = app
        .post(&kube_pools)
        .token(&t)
        .json(&pool("sys", 1, "system"))
        .send()
        .await
        .problem(422, "system_pool_unsupported");
    assert_eq!(problem["errors"][0]["field"], "role", "{problem}");
}

#[tokio::test]
async fn node_pools_scale_and_a_slurm_cluster_keeps_its_system_pool() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let (pool, slurm) = (role_pool, slurm_of);

    let created = app
        .post(&path)
        .token(&t)
        .json(&slurm(json!([pool("sys", 1, "system"), pool("cpu", 1, "compute")])))
        .send()
        .await
        .expect(202)
        .json();
    let cluster = id(&created["cluster"]);
    let roles: Vec<(&str, &str)> = created["cluster"]["node_pools"]
        .as_array()
        .expect("pools")
        .iter()
        .map(|p| (p["name"].as_str().unwrap_or_default(), p["role"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(roles, [("sys", "system"), ("cpu", "compute")]);
    assert_eq!(
        created["cluster"]["slurm"]["partitions"],
        json!([{ "name": "cpu", "node_pools": ["cpu"], "default": true, "max_time": null }]),
        "the system pool has no partition"
    );
    let pools = format!("{path}/{cluster}/node-pools");
    let sys = format!("{pools}/{}", id(&created["cluster"]["node_pools"][0]));
    let cpu = format!("{pools}/{}", id(&created["cluster"]["node_pools"][1]));
    // The system pool is never scaled down (to zero or not) nor deleted, never changes its role,
    // and no second one joins; it may grow.
    let problem =
        app.patch(&sys).token(&t).json(&json!({ "count": 0 })).send().await.problem(422, "system_pool_shrink");
    assert_eq!(problem["errors"][0]["field"], "count", "{problem}");
    app.patch(&sys).token(&t).json(&json!({ "count": 2 })).send().await.expect(202);
    app.patch(&sys).token(&t).json(&json!({ "count": 1 })).send().await.problem(422, "system_pool_shrink");
    app.delete(&sys).token(&t).send().await.problem(422, "system_pool_undeletable");
    app.patch(&sys).token(&t).json(&json!({ "role": "compute" })).send().await.problem(422, "validation_failed");
    app.post(&pools).token(&t).json(&pool("sys2", 1, "system")).send().await.problem(422, "system_pool_duplicate");
    let view = app.get(&sys).token(&t).send().await.expect(200).json();
    assert_eq!((view["role"].as_str(), view["count"].as_u64()), (Some("system"), Some(2)));
    // A compute pool of a Slurm cluster may go to zero, and go.
    app.patch(&cpu).token(&t).json(&json!({ "count": 0 })).send().await.expect(202);

    let added = app
        .post(&pools)
        .token(&t)
        .json(&json!({ "name": "gpu", "machine_class": "gpu", "count": 2 }))
        .send()
        .await
        .expect(202)
        .json();
    assert_eq!(
        added["node_pool"]["status"],
        json!({ "ready": 0, "allocated": 0, "desired_count": 2, "conditions": [] })
    );
    assert_eq!(added["node_pool"]["role"], "compute", "the default role");
    app.post(&pools)
        .token(&t)
        .json(&json!({ "name": "gpu", "machine_class": "gpu", "count": 1 }))
        .send()
        .await
        .problem(409, "node_pool_name_taken");
    let gpu = format!("{pools}/{}", id(&added["node_pool"]));
    let scaled =
        app.patch(&gpu).token(&t).json(&json!({ "count": 4, "machine_class": "gpu" })).send().await.expect(202).json();
    assert_eq!(scaled["node_pool"]["count"], 4);
    app.patch(&gpu).token(&t).json(&json!({ "machine_class": "cpu" })).send().await.problem(422, "validation_failed");
    app.delete(&cpu).token(&t).send().await.expect(202);
    app.patch(&cpu).token(&t).json(&json!({ "count": 2 })).send().await.problem(409, "node_pool_deleting");
    let view = app.get(format!("{path}/{cluster}")).token(&t).send().await.expect(200).json();
    let names: Vec<&str> =
        view["node_pools"].as_array().expect("pools").iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["sys", "gpu"], "a deleting pool leaves the cluster's view");
    assert_eq!(view["slurm"]["partitions"][0]["name"], "gpu");
}

#[tokio::test]
async fn pool_machines_show_no_bmc_details() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let created = app
        .post(format!("/v1/tenants/{tenant_id}/clusters"))
        .token(&t)
        .json(&slurm_cluster("hpc"))
        .send()
        .await
        .expect(202)
        .json();
    let cluster = id(&created["cluster"]);
    let pool = id(&created["cluster"]["node_pools"][1]);
    let m = machine(&app, "node-7", "gpu").await;
    crate::common::hold_machine(&app, &id(&m), Some((&tenant_id, Some((&cluster, &pool)))), "active").await;
    sqlx::query("update machines set node_name = 'node-7' where id = $1::uuid")
        .bind(id(&m))
        .execute(&app.db.pool)
        .await
        .expect("node name");
    let resp = app
        .get(format!("/v1/tenants/{tenant_id}/clusters/{cluster}/node-pools/{pool}/machines"))
        .token(&t)
        .send()
        .await
        .expect(200);
    let body = resp.json();
    assert_eq!(
        body["items"],
        json!([{ "id": id(&m), "node_pool_id": pool, "name": "node-7", "machine_class": "gpu", "state": "active",
            "node_name": "node-7", "health": null }])
    );
    assert!(!String::from_utf8_lossy(&resp.body).contains("bmc"), "BMC details leak to the tenant");
}

#[tokio::test]
async fn a_machine_class_used_by_a_node_pool_cannot_be_deleted_or_change_hardware() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    app.post(format!("/v1/tenants/{tenant_id}/clusters"))
        .token(&t)
        .json(&slurm_cluster("hpc"))
        .send()
        .await
        .expect(202);
    app.delete("/v1/machine-classes/gpu").token(&admin()).send().await.problem(409, "machine_class_in_use");
    app.patch("/v1/machine-classes/gpu")
        .token(&admin())
        .json(&json!({ "gpu_count": 4 }))
        .send()
        .await
        .problem(409, "machine_class_in_use");
    assert_eq!(app.count("machine_classes").await, 2);
}
