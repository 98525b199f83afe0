//! `kind: ray` through the API: its `ray` section validated against the cluster's pools and its
//! base stack's Ray catalogue (422 otherwise, nothing written), defaults, quotas, the head pool
//! kept, and, with the SIMULATED drivers (`lifecycle::Lab`), the cluster made ready with its Ray
//! endpoints, scaled and deleted back to clean machines, metered like any cluster. The real
//! KubeRay operator's part is `paddock-kube`'s `ray_operator` test and `kubernetes::ray`.

use paddock_testkit::{admin, eventually, token, TestApp};
use serde_json::{json, Value};

use crate::common::{id, machine_class, tenant};
use crate::lifecycle::{pool_named, Lab};

/// A Ray cluster with a `cpu` pool of `cpu` machines (the head's) and a `gpu` pool of `gpu`
/// machines.
pub(crate) fn ray_cluster(name: &str, cpu: u32, gpu: u32) -> Value {
    json!({
        "name": name, "kind": "ray", "isolation": "private-nodes",
        "ray": { "head": { "node_pool": "cpu" } },
        "node_pools": [
            { "name": "cpu", "machine_class": "cpu", "count": cpu },
            { "name": "gpu", "machine_class": "gpu", "count": gpu,
              "taints": [{ "key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule" }] }
        ]
    })
}

async fn world(app: &TestApp) -> (String, String) {
    machine_class(app, "cpu", 0).await;
    machine_class(app, "gpu", 8).await;
    crate::common::fleet(app, "cpu", 3).await;
    crate::common::fleet(app, "gpu", 3).await;
    let t = tenant(app, "acme").await;
    let tenant_id = id(&t);
    let admin_token = token(&["tenant:admin"], Some(tenant_id.parse().expect("uuid")));
    (tenant_id, admin_token)
}

/// `body` with the field at `pointer` set to `value` (added if absent).
fn with(mut body: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    match body.pointer_mut(parent).expect("the parent") {
        Value::Array(list) => list[key.parse::<usize>().expect("an index")] = value,
        object => object[key] = value,
    }
    body
}

#[tokio::test]
async fn ray_clusters_need_a_head_pool_of_theirs_and_a_ray_version_of_their_stack() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let base = ray_cluster("lab", 1, 1);
    let cases = [
        (with(base.clone(), "/ray/head/node_pool", json!("nope")), "ray.head.node_pool"),
        (with(base.clone(), "/node_pools/0/count", json!(0)), "ray.head.node_pool"),
        (with(base.clone(), "/ray/version", json!("2.9.0")), "ray.version"),
        (with(base.clone(), "/ray/version", json!("latest")), "ray.version"),
        (with(base.clone(), "/ray", Value::Null), "ray"),
        (with(base.clone(), "/kind", json!("kubernetes")), "ray"),
        (with(base.clone(), "/slurm", json!({})), "slurm"),
    ];
    for (body, field) in cases {
        let problem = app.post(&path).token(&t).json(&body).send().await.problem(422, "validation_failed");
        let fields: Vec<&str> =
            problem["errors"].as_array().expect("errors").iter().filter_map(|e| e["field"].as_str()).collect();
        assert!(fields.contains(&field), "{body}: expected an error on {field}, got {problem}");
    }
    let unsupported = with(base.clone(), "/ray/version", json!("2.9.0"));
    let problem = app.post(&path).token(&t).json(&unsupported).send().await.problem(422, "validation_failed");
    let says =
        "Ray 2.9.0 is not in the Ray catalogue of the cluster's base stack 2026.12.3 (supported: 2.46.0, 2.52.0)";
    assert!(problem["errors"].to_string().contains(says), "{problem}");
    // An unknown field of the `ray` object is refused like any other.
    let unknown = with(base.clone(), "/ray/autoscaling", json!(true));
    app.post(&path).token(&t).json(&unknown).send().await.problem(422, "validation_failed");
    assert_eq!(app.count("clusters").await, 0, "nothing written");

    // The defaults: the stack's default Ray release, the dashboard on.
    let created = app.post(&path).token(&t).json(&base).send().await.expect(202).json();
    let cluster = &created["cluster"];
    assert_eq!(cluster["kind"], "ray");
    assert_eq!(cluster["stack_version"], "2026.12.3");
    assert_eq!(cluster["ray"], json!({ "version": "2.46.0", "head": { "node_pool": "cpu" }, "dashboard": true }));
    assert_eq!(cluster["slurm"], Value::Null);
    let op = app.get(format!("/v1/operations/{}", id(&created["operation"]))).token(&admin()).send().await;
    let steps: Vec<String> = op.expect(200).json()["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["name"].as_str().expect("name").to_owned())
        .collect();
    assert_eq!(steps, ["namespace", "control_plane", "machines", "nodes", "stack", "ray"]);

    // A patch moves to another release of the catalogue, never out of it.
    let cluster_path = format!("{path}/{}", id(cluster));
    let patch = |etag: &str, body: Value| {
        app.patch(&cluster_path).token(&t).header("if-match", &format!("\"{etag}\"")).json(&body)
    };
    let problem = patch("1", json!({ "ray": { "version": "2.40.0" } })).send().await.expect(422).json();
    assert_eq!(problem["errors"][0]["field"], "ray.version", "{problem}");
    patch("1", json!({ "ray": null })).send().await.problem(422, "validation_failed");
    let moved = patch("1", json!({ "ray": { "version": "2.52.0", "dashboard": false } })).send().await.expect(202);
    let moved = moved.json();
    assert_eq!(
        moved["cluster"]["ray"],
        json!({ "version": "2.52.0", "head": { "node_pool": "cpu" }, "dashboard": false })
    );
    assert_eq!(moved["cluster"]["generation"], 2);

    // The head pool keeps a machine for the head while the cluster lives.
    let head = format!("{cluster_path}/node-pools/{}", pool_named(cluster, "cpu"));
    app.patch(&head).token(&t).json(&json!({ "count": 0 })).send().await.problem(422, "ray_head_pool_empty");
    app.delete(&head).token(&t).send().await.problem(422, "ray_head_pool_undeletable");
    let gpu = format!("{cluster_path}/node-pools/{}", pool_named(cluster, "gpu"));
    app.patch(&gpu).token(&t).json(&json!({ "count": 0 })).send().await.expect(202);
    app.patch(&head).token(&t).json(&json!({ "count": 2 })).send().await.expect(202);
}

/// A Ray worker group keeps its size: its demand (Ray's own autoscaler) is not read, and its pods
/// are never unschedulable, so an autoscaled group would only shrink. 422 at creation, on a new
/// pool and on a patch, nothing written.
#[tokio::test]
async fn ray_pools_are_not_autoscaled() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let autoscaling = json!({ "min": 0, "max": 2 });
    let body = with(ray_cluster("lab", 1, 1), "/node_pools/1/autoscaling", autoscaling.clone());
    let problem = app.post(&path).token(&t).json(&body).send().await.problem(422, "autoscaling_unsupported");
    assert!(problem.to_string().contains("node_pools[1].autoscaling"), "{problem}");
    assert_eq!(app.count("clusters").await, 0, "nothing written");

    let created = app.post(&path).token(&t).json(&ray_cluster("lab", 1, 1)).send().await.expect(202).json();
    let cluster_path = format!("{path}/{}", id(&created["cluster"]));
    let pool = json!({ "name": "more", "machine_class": "gpu", "count": 1, "autoscaling": autoscaling });
    app.post(format!("{cluster_path}/node-pools"))
        .token(&t)
        .json(&pool)
        .send()
        .await
        .problem(422, "autoscaling_unsupported");
    let gpu = format!("{cluster_path}/node-pools/{}", pool_named(&created["cluster"], "gpu"));
    app.patch(&gpu)
        .token(&t)
        .json(&json!({ "autoscaling": autoscaling }))
        .send()
        .await
        .problem(422, "autoscaling_unsupported");
    let pools = app.get(format!("{cluster_path}/node-pools")).token(&t).send().await.expect(200).json();
    assert!(!pools.to_string().contains("\"autoscaling\":{"), "no pool autoscaled: {pools}");
}

#[tokio::test]
async fn ray_clusters_count_against_the_quotas_like_any_cluster() {
    let app = TestApp::new().await;
    let (tenant_id, t) = world(&app).await;
    let quotas = json!({ "quotas": { "max_nodes": 3, "max_gpus": 8 } });
    app.patch(format!("/v1/tenants/{tenant_id}")).token(&admin()).json(&quotas).send().await.expect(200);
    let path = format!("/v1/tenants/{tenant_id}/clusters");
    let problem = app.post(&path).token(&t).json(&ray_cluster("big", 1, 2)).send().await.problem(409, "quota_exceeded");
    assert!(problem["detail"].as_str().expect("detail").contains("GPUs"), "{problem}");
    app.post(&path).token(&t).json(&ray_cluster("lab", 1, 1)).send().await.expect(202);
    assert_eq!(app.count("clusters").await, 1);
}

#[tokio::test]
async fn a_ray_cluster_goes_ready_with_its_endpoints_scales_and_is_deleted_back_to_clean_machines() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "cpu", 0).await;
    machine_class(&lab.app, "gpu", 8).await;
    lab.available("cpu", &["c1", "c2"]).await;
    lab.available("gpu", &["g1", "g2"]).await;

    let created = lab.create(ray_cluster("lab", 1, 1)).await;
    let cluster = id(&created["cluster"]);
    let ready = lab.ready(&cluster).await;
    let conditions = ready["status"]["conditions"].as_array().expect("conditions");
    let ray_ready = conditions.iter().find(|c| c["type"] == "RayReady").expect("a RayReady condition");
    assert_eq!(ray_ready["status"], "True", "{ready}");
    let endpoints = &ready["status"]["endpoints"];
    assert!(
        endpoints["ray_client"].as_str().is_some_and(|e| e.starts_with("ray://") && e.ends_with(":10001")),
        "{endpoints}"
    );
    assert!(endpoints["dashboard"].as_str().is_some_and(|e| e.ends_with(":8265")), "{endpoints}");
    assert_eq!(endpoints["slurm_rest_api"], Value::Null);
    assert_eq!(lab.scalar("select count(*) from machines where state = 'active'").await, 2);

    // Scaling the gpu pool's worker group up and back down.
    let gpu = pool_named(&created["cluster"], "gpu");
    lab.scale(&cluster, &gpu, 2).await;
    lab.ready(&cluster).await;
    assert_eq!(lab.scalar("select count(*) from machines where state = 'active'").await, 3);
    lab.scale(&cluster, &gpu, 1).await;
    lab.ready(&cluster).await;

    // The dashboard off: its endpoint goes.
    let path = lab.cluster_path(&cluster);
    let off = json!({ "ray": { "dashboard": false } });
    lab.app.patch(&path).token(&lab.tenant_token).json(&off).send().await.expect(202);
    let without = lab.ready(&cluster).await;
    assert_eq!(without["status"]["endpoints"]["dashboard"], Value::Null, "{without}");

    // Metered like any cluster: machine segments of its pools and its control plane's.
    let metered = lab
        .scalar(&format!("select count(*) from usage_segments where cluster_id = '{cluster}' and kind = 'machine'"))
        .await;
    assert!(metered >= 2, "machine segments of the ray cluster: {metered}");
    let control_plane =
        format!("select count(*) from usage_segments where cluster_id = '{cluster}' and kind = 'control_plane'");
    assert_eq!(lab.scalar(&control_plane).await, 1, "the control plane's segment");

    // Delete: Ray removed first (its step), every machine back through cleaning, then 404.
    let deleted = lab.app.delete(&path).token(&lab.tenant_token).send().await.expect(202).json();
    let op = deleted["operation"].clone();
    eventually(std::time::Duration::from_secs(60), || async {
        let status = lab.app.get(&path).token(&lab.tenant_token).send().await.status.as_u16();
        (status == 404).then_some(())
    })
    .await;
    let op = lab.app.get(format!("/v1/operations/{}", id(&op))).token(&admin()).send().await.expect(200).json();
    let steps: Vec<&str> = op["steps"].as_array().expect("steps").iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(steps, ["remove_ray", "release_machines", "delete_control_plane", "delete_namespace"], "{op}");
    assert_eq!(op["state"], "succeeded", "{op}");
    eventually(std::time::Duration::from_secs(60), || async {
        (lab.scalar("select count(*) from machines where state = 'available'").await == 4).then_some(())
    })
    .await;
}
