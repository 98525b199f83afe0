//! The custody ledger and the isolation report (SPEC section 5; issue #7): every transition of a
//! machine's whole lifecycle is recorded and its HMAC chain verifies; an edit made directly in
//! the database (a changed reason, a deleted entry, two entries swapped) is found at the right
//! entry; a tenant's isolation report lists only its own machines, each with the verified wipe
//! that preceded its allocation, and says so when a wipe record is missing; who may read what.
//!
//! The lifecycle runs with the worker in-process and the SIMULATED drivers, like `lifecycle`.

use std::sync::Arc;
use std::time::Duration;

use paddock_sim::{SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_worker::reconcile::{ClusterReconciler, Drivers, MachineReconciler, Settings};
use paddock_worker::{JobHandler, Worker, WorkerConfig};
use serde_json::{json, Value};
use tokio::sync::watch;
use uuid::Uuid;

use crate::common::{id, machine_class, tenant};

const WAIT: Duration = Duration::from_secs(60);

/// The API on a port, a worker and the simulated machines' agent, over one database (a small
/// copy of `lifecycle`'s lab).
struct Lab {
    app: TestApp,
    stop: watch::Sender<bool>,
}

impl Lab {
    async fn new() -> Lab {
        let app = TestApp::served().await;
        let store = Store::from_pool(app.db.pool.clone());
        let world = SimWorld::new(store.clone(), SimConfig::zero());
        let drivers = Drivers { bmc: Some(world.bmc()), kube: Some(world.kube()) };
        let settings = Settings {
            wipe_image_url: Some("http://images.invalid/wipe.iso".into()),
            os_image_url: Some("http://images.invalid/os.iso".into()),
            poll: Duration::from_millis(50),
            report_wait: Duration::from_secs(2),
            ..Settings::default()
        };
        let handlers: Vec<Arc<dyn JobHandler>> = vec![
            Arc::new(MachineReconciler::new(app.services.clone(), drivers.clone(), settings.clone())),
            Arc::new(ClusterReconciler::new(app.services.clone(), drivers, settings)),
        ];
        let config = WorkerConfig {
            concurrency: 8,
            poll_interval: Duration::from_millis(50),
            backoff_base: Duration::from_millis(10),
            backoff_cap: Duration::from_millis(200),
            max_attempts: 100,
            ..WorkerConfig::default()
        };
        let worker = Worker::new(store, "custody-worker", handlers, config).expect("worker");
        let (stop, stopped) = watch::channel(false);
        let mut worker_stop = stopped.clone();
        tokio::spawn(async move {
            worker
                .run(async move {
                    let _ = worker_stop.changed().await;
                })
                .await
        });
        let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
        tokio::spawn(world.agent(client).run(stopped));
        Lab { app, stop }
    }

    /// Enrolls `sim://<name>` machines of `class`; returns their ids.
    async fn enroll(&self, class: &str, names: &[&str]) -> Vec<String> {
        let mut ids = Vec::new();
        for name in names {
            let body = json!({
                "name": name, "machine_class": class,
                "bmc": { "url": format!("sim://{name}"), "username": "admin", "password": "simulated" }
            });
            let created = self.app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202).json();
            ids.push(id(&created["machine"]));
        }
        ids
    }

    async fn machine_in(&self, id: &str, state: &str) -> Value {
        eventually(WAIT, || async {
            let m = self.app.get(format!("/v1/machines/{id}")).token(&admin()).send().await.expect(200).json();
            (m["state"] == state).then_some(m)
        })
        .await
    }

    /// Creates a one-machine Slurm cluster in `tenant` and waits until it is ready.
    async fn ready_cluster(&self, tenant: &str, token: &str, name: &str, class: &str) -> String {
        let body = json!({ "name": name, "kind": "slurm", "isolation": "private-nodes",
            "node_pools": [{ "name": "gpu", "machine_class": class, "count": 1 }] });
        let path = format!("/v1/tenants/{tenant}/clusters");
        let created = self.app.post(path.as_str()).token(token).json(&body).send().await.expect(202).json();
        let cluster = id(&created["cluster"]);
        eventually(WAIT, || async {
            let c = self.app.get(format!("{path}/{cluster}")).token(token).send().await.expect(200).json();
            (c["status"]["phase"] == "ready" && c["status"]["observed_generation"] == c["generation"]).then_some(())
        })
        .await;
        cluster
    }

    async fn custody(&self, machine: &str) -> Value {
        custody(&self.app, machine).await
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn custody(app: &TestApp, machine: &str) -> Value {
    let resp = app.get(format!("/v1/machines/{machine}/custody")).token(&admin()).send().await.expect(200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    resp.json()
}

/// `(from, to)` of every entry, oldest first.
fn transitions(custody: &Value) -> Vec<(String, String)> {
    custody["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| (e["from"].as_str().unwrap_or("-").to_owned(), e["to"].as_str().expect("to").to_owned()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

/// The entry `to` a state (the last one).
fn entry_to<'a>(custody: &'a Value, to: &str) -> &'a Value {
    custody["items"].as_array().expect("items").iter().rev().find(|e| e["to"] == to).expect("entry")
}

const FIRST_CLEAN: [(&str, &str); 4] =
    [("-", "enrolling"), ("enrolling", "inspecting"), ("inspecting", "cleaning"), ("cleaning", "available")];

/// Runs `sql` with the ledger's append-only trigger off: what someone with database access can do.
async fn tamper(app: &TestApp, sql: &str) {
    let mut conn = app.db.pool.acquire().await.expect("conn");
    for statement in [
        "alter table custody_entries disable trigger custody_entries_append_only",
        sql,
        "alter table custody_entries enable trigger custody_entries_append_only",
    ] {
        sqlx::query(statement).execute(&mut *conn).await.unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
}

#[tokio::test]
async fn enrollment_is_the_first_entry_sealed_in_its_own_transaction() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = id(&crate::common::machine(&app, "n1", "gpu").await);
    let c = custody(&app, &m).await;
    assert_eq!(transitions(&c), pairs(&[("-", "enrolling")]), "{c}");
    assert_eq!(
        (c["verified"].as_bool(), c["unsealed"].as_u64(), &c["first_bad_entry"]),
        (Some(true), Some(0), &Value::Null)
    );
    let e = &c["items"][0];
    assert_eq!((e["seq"].as_i64(), e["actor"].as_str(), &e["prev_mac"]), (Some(1), Some("test-user"), &Value::Null));
    assert_eq!(e["evidence"]["name"], "n1");
    assert!(e["mac"].as_str().is_some_and(|mac| mac.len() == 64), "{e}");
    // The ledger is append-only for everyone short of the table owner disabling the trigger.
    let refused = sqlx::query("update custody_entries set reason = 'edited'").execute(&app.db.pool).await;
    assert!(refused.is_err(), "an update of a sealed entry went through");
    let refused = sqlx::query("delete from custody_entries").execute(&app.db.pool).await;
    assert!(refused.is_err(), "a delete went through");
}

#[tokio::test]
async fn a_whole_lifecycle_is_recorded_with_evidence_and_verifies() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let m = lab.enroll("gpu", &["n1"]).await.remove(0);
    lab.machine_in(&m, "available").await;
    let c = lab.custody(&m).await;
    assert_eq!(transitions(&c), pairs(&FIRST_CLEAN), "{c}");
    assert_eq!(c["verified"], true, "{c}");
    let clean = entry_to(&c, "available");
    assert_eq!(clean["actor"], "paddock-worker");
    assert!(clean["evidence"]["clean_id"].is_string(), "the clean is named: {clean}");
    assert!(clean["evidence"]["report"]["drives"].is_array(), "the wipe report is the evidence: {clean}");

    let t = tenant(&lab.app, "acme").await;
    let tenant_id = id(&t);
    let tenant_token = token(&["tenant:admin"], Some(tenant_id.parse().expect("uuid")));
    let cluster = lab.ready_cluster(&tenant_id, &tenant_token, "hpc", "gpu").await;
    let active = lab.machine_in(&m, "active").await;
    let c = lab.custody(&m).await;
    let mut expected: Vec<(&str, &str)> = FIRST_CLEAN.to_vec();
    expected.extend([("available", "allocated"), ("allocated", "provisioning"), ("provisioning", "active")]);
    assert_eq!(transitions(&c), pairs(&expected), "{c}");
    assert_eq!((c["verified"].as_bool(), c["unsealed"].as_u64()), (Some(true), Some(0)), "{c}");
    let allocated = entry_to(&c, "allocated");
    assert_eq!(
        (&allocated["evidence"]["tenant_id"], &allocated["evidence"]["cluster_id"]),
        (&json!(tenant_id), &json!(cluster))
    );
    assert_eq!(allocated["evidence"]["clean_id"], clean["evidence"]["clean_id"], "the allocation consumed that wipe");
    assert!(allocated["evidence"]["node_pool_id"].is_string());
    assert_eq!(entry_to(&c, "active")["evidence"]["node_name"], active["node_name"]);

    // Delete the cluster: released, wiped again, available.
    let path = format!("/v1/tenants/{tenant_id}/clusters/{cluster}");
    lab.app.delete(path.as_str()).token(&tenant_token).send().await.expect(202);
    eventually(WAIT, || async {
        (lab.app.get(path.as_str()).token(&tenant_token).send().await.status.as_u16() == 404).then_some(())
    })
    .await;
    lab.machine_in(&m, "available").await;
    let c = eventually(WAIT, || async {
        let c = lab.custody(&m).await;
        (c["items"].as_array().map(Vec::len) == Some(10)).then_some(c)
    })
    .await;
    expected.extend([("active", "releasing"), ("releasing", "cleaning"), ("cleaning", "available")]);
    assert_eq!(transitions(&c), pairs(&expected), "{c}");
    assert_eq!(
        (c["verified"].as_bool(), &c["first_bad_entry"], &c["finding"]),
        (Some(true), &Value::Null, &Value::Null),
        "{c}"
    );
    let seqs: Vec<i64> =
        c["items"].as_array().expect("items").iter().map(|e| e["seq"].as_i64().expect("seq")).collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    // Each entry links to the one before it.
    let items = c["items"].as_array().expect("items");
    for pair in items.windows(2) {
        assert_eq!(pair[1]["prev_mac"], pair[0]["mac"]);
    }
    assert_eq!(entry_to(&c, "releasing")["evidence"]["cluster_id"], json!(cluster));
    assert_ne!(entry_to(&c, "available")["evidence"]["clean_id"], clean["evidence"]["clean_id"], "a new wipe");

    // The operator takes it out of service, then retires it: the reason is recorded.
    let maintenance = format!("/v1/machines/{m}/maintenance");
    let reason = json!({ "reason": "fan replacement" });
    lab.app.post(maintenance.as_str()).token(&admin()).json(&reason).send().await.expect(202);
    lab.machine_in(&m, "maintenance").await;
    lab.app.delete(format!("/v1/machines/{m}")).token(&admin()).send().await.expect(202);
    lab.machine_in(&m, "retired").await;
    let c = lab.custody(&m).await;
    expected.extend([("available", "maintenance"), ("maintenance", "retired")]);
    assert_eq!(transitions(&c), pairs(&expected), "{c}");
    assert_eq!(c["verified"], true, "{c}");
    let entered = entry_to(&c, "maintenance");
    assert_eq!(
        (&entered["reason"], &entered["evidence"]["maintenance_reason"]),
        (&json!("fan replacement"), &json!("fan replacement"))
    );
}

/// The ids of a machine's entries, by seq.
async fn entry_ids(app: &TestApp, machine: &str) -> Vec<String> {
    sqlx::query_scalar("select id::text from custody_entries where machine_id = $1::uuid order by seq")
        .bind(machine)
        .fetch_all(&app.db.pool)
        .await
        .expect("entries")
}

#[tokio::test]
async fn edits_made_in_the_database_are_found_at_the_right_entry() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let m = lab.enroll("gpu", &["n1"]).await.remove(0);
    lab.machine_in(&m, "available").await;
    let app = &lab.app;
    assert_eq!(lab.custody(&m).await["verified"], true);
    let ids = entry_ids(app, &m).await;
    assert_eq!(ids.len(), 4);
    let verdict = |c: &Value| (c["verified"].as_bool(), c["first_bad_entry"].as_str().map(str::to_owned));

    // A changed reason: that entry.
    let (second, third) = (&ids[1], &ids[2]);
    let original: String = sqlx::query_scalar("select reason from custody_entries where id = $1::uuid")
        .bind(third)
        .fetch_one(&app.db.pool)
        .await
        .expect("reason");
    tamper(app, &format!("update custody_entries set reason = 'nothing to see' where id = '{third}'")).await;
    let c = lab.custody(&m).await;
    assert_eq!(verdict(&c), (Some(false), Some(third.clone())), "{c}");
    // Put back exactly, it verifies again: the MAC covers the content, nothing else.
    tamper(
        app,
        &format!("update custody_entries set reason = '{}' where id = '{third}'", original.replace('\'', "''")),
    )
    .await;
    assert_eq!(verdict(&lab.custody(&m).await), (Some(true), None));

    // Two entries swapped (their seq exchanged, through a free value because of the unique
    // (machine, seq) index): the first one out of place.
    let swap = |x: &str, y: &str| {
        [
            format!("update custody_entries set seq = 1000 where id = '{x}'"),
            format!("update custody_entries set seq = 2 where id = '{y}'"),
            format!("update custody_entries set seq = 3 where id = '{x}'"),
        ]
    };
    for statement in swap(second, third) {
        tamper(app, &statement).await;
    }
    let c = lab.custody(&m).await;
    assert_eq!(verdict(&c), (Some(false), Some(third.clone())), "{c}");
    // The same moves the other way round put them back.
    for statement in swap(third, second) {
        tamper(app, &statement).await;
    }
    assert_eq!(verdict(&lab.custody(&m).await), (Some(true), None));

    // A middle entry deleted: the entry after the gap.
    tamper(app, &format!("delete from custody_entries where id = '{second}'")).await;
    let c = lab.custody(&m).await;
    assert_eq!(verdict(&c), (Some(false), Some(third.clone())), "{c}");
    assert!(c["finding"].as_str().is_some_and(|f| f.contains("missing or reordered")), "{c}");

    // The newest entry deleted: a shorter chain is still a chain, but it no longer leads to the
    // machine's state.
    tamper(app, &format!("delete from custody_entries where id = '{}'", ids[3])).await;
    let c = lab.custody(&m).await;
    assert_eq!(c["verified"], false, "{c}");
}

async fn report(app: &TestApp, tenant: &str, token: &str) -> Value {
    let resp = app.get(format!("/v1/tenants/{tenant}/isolation-report")).token(token).send().await.expect(200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    resp.json()
}

/// The machine ids of a report, cluster by cluster.
fn report_machines(report: &Value) -> Vec<String> {
    report["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .flat_map(|c| c["machines"].as_array().expect("machines").iter().map(|m| id_of(&m["machine_id"])))
        .collect()
}

fn id_of(v: &Value) -> String {
    v.as_str().expect("an id").to_owned()
}

#[tokio::test]
async fn isolation_reports_show_each_tenant_only_its_machines_each_wiped_before_allocation() {
    let lab = Lab::new().await;
    let app = &lab.app;
    machine_class(app, "gpu", 8).await;
    let machines = lab.enroll("gpu", &["n1", "n2", "n3"]).await;
    for m in &machines {
        lab.machine_in(m, "available").await;
    }
    let (acme, globex) = (id(&tenant(app, "acme").await), id(&tenant(app, "globex").await));
    let acme_token = token(&["tenant:member"], Some(acme.parse().expect("uuid")));
    let globex_token = token(&["tenant:admin"], Some(globex.parse().expect("uuid")));
    let acme_admin = token(&["tenant:admin"], Some(acme.parse().expect("uuid")));
    let acme_cluster = lab.ready_cluster(&acme, &acme_admin, "hpc", "gpu").await;
    let globex_cluster = lab.ready_cluster(&globex, &globex_token, "hpc", "gpu").await;

    let a = report(app, &acme, &acme_token).await;
    let g = report(app, &globex, &globex_token).await;
    for (r, tenant, cluster) in [(&a, &acme, &acme_cluster), (&g, &globex, &globex_cluster)] {
        assert_eq!(r["tenant_id"], json!(tenant));
        assert_eq!((r["complete"].as_bool(), r["no_machine_shared"].as_bool()), (Some(true), Some(true)), "{r}");
        let clusters = r["clusters"].as_array().expect("clusters");
        assert_eq!(clusters.len(), 1, "{r}");
        let c = &clusters[0];
        assert_eq!(c["cluster_id"], json!(cluster));
        assert_eq!(c["namespace"], format!("pc-{}", cluster.replace('-', "")));
        assert!(c["kubernetes_api"].as_str().is_some_and(|e| e.starts_with("https://")), "{c}");
        let held = c["machines"].as_array().expect("machines");
        assert_eq!(held.len(), 1, "{c}");
        let m = &held[0];
        assert_eq!((m["wipe_verified"].as_bool(), m["ledger_verified"].as_bool()), (Some(true), Some(true)), "{m}");
        assert!(m["wipe"]["completed_at"].as_str() <= m["allocated_at"].as_str(), "{m}");
        // The wipe the report names is the one the allocation's ledger entry names.
        let ledger = custody(app, &id_of(&m["machine_id"])).await;
        assert_eq!(entry_to(&ledger, "allocated")["evidence"]["clean_id"], m["wipe"]["clean_id"]);
        assert!(r["digest"].as_str().is_some_and(|d| d.len() == 64));
    }
    let (mine, theirs) = (report_machines(&a), report_machines(&g));
    assert!(mine.iter().all(|m| !theirs.contains(m)), "{mine:?} / {theirs:?}");
    assert!(!a.to_string().contains(&globex) && !g.to_string().contains(&acme), "a report mentions another tenant");
    // Deterministic: the same world gives the same digest (`as_of` is outside it).
    let again = report(app, &acme, &admin()).await;
    assert_eq!(again["digest"], a["digest"]);

    // The wipe record of acme's machine goes missing: the report says so.
    let clean = id_of(&a["clusters"][0]["machines"][0]["wipe"]["clean_id"]);
    for statement in [
        "alter table machine_allocations drop constraint machine_allocations_clean_id_machine_id_fkey".to_owned(),
        format!("delete from machine_cleans where id = '{clean}'"),
    ] {
        sqlx::query(&statement).execute(&app.db.pool).await.unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    let missing = report(app, &acme, &acme_token).await;
    let m = &missing["clusters"][0]["machines"][0];
    assert_eq!((m["wipe_verified"].as_bool(), &m["wipe"]), (Some(false), &Value::Null), "{m}");
    assert_eq!(missing["complete"], false, "{missing}");
    assert_ne!(missing["digest"], a["digest"]);
    // The other tenant's report is untouched.
    assert_eq!(report(app, &globex, &globex_token).await["digest"], g["digest"]);
}

#[tokio::test]
async fn who_may_read_custody_and_isolation_reports() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let m = id(&crate::common::machine(&app, "n1", "gpu").await);
    let (own, other) = (id(&tenant(&app, "acme").await), id(&tenant(&app, "globex").await));
    let own_uuid: Uuid = own.parse().expect("uuid");
    let member = token(&["tenant:member"], Some(own_uuid));
    let billing = token(&["billing:reader"], None);
    let operator = token(&["provider:operator"], None);
    let missing = Uuid::now_v7();

    // A tenant without clusters has an empty, complete report.
    let r = report(&app, &own, &member).await;
    assert_eq!((r["clusters"].as_array().map(Vec::len), r["complete"].as_bool()), (Some(0), Some(true)), "{r}");
    report(&app, &own, &operator).await;
    for (token, path, status, code) in [
        (&member, format!("/v1/tenants/{other}/isolation-report"), 404, "not_found"),
        (&member, format!("/v1/tenants/{missing}/isolation-report"), 404, "not_found"),
        (&admin(), format!("/v1/tenants/{missing}/isolation-report"), 404, "not_found"),
        (&billing, format!("/v1/tenants/{own}/isolation-report"), 403, "forbidden"),
        (&billing, format!("/v1/tenants/{missing}/isolation-report"), 403, "forbidden"),
        (&member, format!("/v1/machines/{m}/custody"), 403, "forbidden"),
        (&billing, format!("/v1/machines/{missing}/custody"), 403, "forbidden"),
        (&operator, format!("/v1/machines/{missing}/custody"), 404, "not_found"),
    ] {
        let resp = app.get(path.as_str()).token(token).send().await;
        assert_eq!(resp.status.as_u16(), status, "GET {path}");
        assert_eq!(resp.header("content-type"), Some("application/problem+json"), "GET {path}");
        assert_eq!(resp.json()["code"], code, "GET {path}");
    }
    assert_eq!(
        app.get(format!("/v1/machines/{m}/custody")).token(&operator).send().await.expect(200).json()["verified"],
        true
    );
}
