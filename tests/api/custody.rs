//! The custody ledger and the isolation report (docs/security.md): every transition of a
//! machine's whole lifecycle is recorded and its HMAC chain verifies; an edit made directly in
//! the database (a changed reason, a deleted entry, two entries swapped) is found at the right
//! entry; a tenant's isolation report lists only its own machines, each with the verified wipe
//! that preceded its allocation, and says so when a wipe record is missing; who may read what.
//!
//! Also: a row inserted in the database never verifies, even once the next transition is
//! sealed after it; a transition missing from the ledger breaks the state chain; a cut tail and a
//! restored older copy of the ledger are found against a signed checkpoint, which must be ours;
//! the isolation report names the checkpoint it verified against; a runtime role that does not own
//! the ledger runs the machines but can neither rewrite the ledger nor drop its trigger.
//!
//! The lifecycle runs with the worker in-process and the SIMULATED drivers, like `lifecycle`.

use std::time::Duration;

use paddock_sim::{SimConfig, SimWorld};
use paddock_store::Store;
use paddock_testkit::{admin, eventually, token, TestApp};
use paddock_worker::reconcile::Drivers;
use serde_json::{json, Value};
use tokio::sync::watch;
use uuid::Uuid;

use crate::common::{id, lab_settings, lab_worker_config, machine_class, run_worker, set_machine_state, tenant};

const WAIT: Duration = Duration::from_secs(60);

/// The API on a port, a worker and the simulated machines' agent, over one database (a small
/// copy of `lifecycle`'s lab).
struct Lab {
    app: TestApp,
    stop: watch::Sender<bool>,
}

impl Lab {
    async fn new() -> Lab {
        Lab::on(TestApp::served().await).await
    }

    /// A lab around a served app (over a database its pool reaches as some role).
    async fn on(app: TestApp) -> Lab {
        let world = SimWorld::new(Store::from_pool(app.db.pool.clone()), SimConfig::zero());
        let drivers = Drivers { bmc: Some(world.bmc()), kube: Some(world.kube()) };
        let (stop, _) = run_worker(&app, &world, drivers, lab_settings(), lab_worker_config(), "custody-worker");
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
            "node_pools": [{ "name": "gpu", "machine_class": class, "count": 1, "role": "system" }] });
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

/// Sends an available machine through maintenance and back to available (three more entries).
async fn maintenance_round(lab: &Lab, m: &str) {
    let path = format!("/v1/machines/{m}/maintenance");
    lab.app.post(path.as_str()).token(&admin()).json(&json!({ "reason": "fan" })).send().await.expect(202);
    lab.machine_in(m, "maintenance").await;
    lab.app.delete(path.as_str()).token(&admin()).send().await.expect(202);
    lab.machine_in(m, "available").await;
}

async fn checkpoint(app: &TestApp) -> Value {
    let resp = app.get("/v1/custody/checkpoint").token(&admin()).send().await.expect(200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    resp.json()
}

/// `POST /v1/custody/verify` of `checkpoint`; the verification of `machine`'s head.
async fn verify(app: &TestApp, checkpoint: &Value, machine: &str) -> (Value, Value) {
    let body = json!({ "checkpoint": checkpoint });
    let v = app.post("/v1/custody/verify").token(&admin()).json(&body).send().await.expect(200).json();
    let head = v["machines"].as_array().expect("machines").iter().find(|h| h["machine_id"] == machine).cloned();
    (v.clone(), head.unwrap_or_else(|| panic!("{machine} is not in {v}")))
}

fn head_seq(checkpoint: &Value, machine: &str) -> Option<i64> {
    checkpoint["machines"].as_array().expect("machines").iter().find(|h| h["machine_id"] == machine)?["seq"].as_i64()
}

#[tokio::test]
async fn a_row_inserted_in_the_database_is_a_break_even_after_the_next_machine_step() {
    let lab = Lab::new().await;
    let app = &lab.app;
    machine_class(app, "gpu", 8).await;
    let m = lab.enroll("gpu", &["n1"]).await.remove(0);
    lab.machine_in(&m, "available").await;
    // A row without a MAC is refused outright; one with a made-up MAC, linked to the real head,
    // goes in: what someone with database access (but not the key) can do.
    let insert = "insert into custody_entries (id, machine_id, seq, actor, from_state, to_state, reason, evidence, \
                  prev_mac, mac) select $1, $2::uuid, 5, 'paddock-worker', 'available', 'available', 'checked', '{}', \
                  (select mac from custody_entries where machine_id = $2::uuid and seq = 4), $3";
    let unsealed = sqlx::query(insert).bind(Uuid::now_v7()).bind(&m).bind(None::<Vec<u8>>).execute(&app.db.pool).await;
    assert!(unsealed.is_err(), "an entry without a MAC was accepted");
    let forged = Uuid::now_v7();
    sqlx::query(insert).bind(forged).bind(&m).bind(vec![7u8; 32]).execute(&app.db.pool).await.expect("forged row");

    // A normal machine step after it: its entry is sealed as written, and seals nothing else.
    let path = format!("/v1/machines/{m}/maintenance");
    lab.app.post(path.as_str()).token(&admin()).json(&json!({ "reason": "fan" })).send().await.expect(202);
    lab.machine_in(&m, "maintenance").await;
    let c = lab.custody(&m).await;
    assert_eq!(c["items"].as_array().map(Vec::len), Some(6), "{c}");
    assert_eq!(entry_to(&c, "maintenance")["seq"], 6, "{c}");
    assert_eq!(
        (c["verified"].as_bool(), c["first_bad_entry"].as_str()),
        (Some(false), Some(forged.to_string().as_str())),
        "{c}"
    );
}

#[tokio::test]
async fn a_transition_missing_from_the_ledger_breaks_the_state_chain() {
    let lab = Lab::new().await;
    machine_class(&lab.app, "gpu", 8).await;
    let m = lab.enroll("gpu", &["n1"]).await.remove(0);
    lab.machine_in(&m, "available").await;
    // Moved in the database behind the ledger's back: available -> maintenance, no entry.
    set_machine_state(&lab.app, &m, "maintenance").await;
    lab.app.delete(format!("/v1/machines/{m}/maintenance")).token(&admin()).send().await.expect(202);
    let c = eventually(WAIT, || async {
        let c = lab.custody(&m).await;
        (c["items"].as_array().map(Vec::len) == Some(6)).then_some(c)
    })
    .await;
    // Every entry is sealed and linked, but the fifth leaves a state the fourth never entered.
    let fifth = &c["items"][4];
    assert_eq!((fifth["from"].as_str(), c["items"][3]["to"].as_str()), (Some("maintenance"), Some("available")));
    assert_eq!((c["verified"].as_bool(), &c["first_bad_entry"]), (Some(false), &fifth["id"]), "{c}");
    assert!(c["finding"].as_str().is_some_and(|f| f.contains("a transition is missing")), "{c}");
}

#[tokio::test]
async fn a_cut_tail_is_found_against_a_checkpoint_and_only_our_checkpoints_count() {
    let lab = Lab::new().await;
    let app = &lab.app;
    machine_class(app, "gpu", 8).await;
    let m = lab.enroll("gpu", &["n1"]).await.remove(0);
    lab.machine_in(&m, "available").await;
    maintenance_round(&lab, &m).await;
    let cp = checkpoint(app).await;
    assert_eq!(head_seq(&cp, &m), Some(7), "{cp}");
    assert!(cp["signature"].is_string() && cp["key_id"].is_string(), "{cp}");
    let (v, head) = verify(app, &cp, &m).await;
    assert_eq!((v["verified"].as_bool(), head["reaches_checkpoint"].as_bool()), (Some(true), Some(true)), "{v}");

    // The last three entries removed: the chain still ends where the machine is, so it verifies
    // on its own; the checkpoint finds the cut.
    tamper(app, &format!("delete from custody_entries where machine_id = '{m}' and seq > 4")).await;
    assert_eq!(lab.custody(&m).await["verified"], true);
    let (v, head) = verify(app, &cp, &m).await;
    assert_eq!(v["verified"], false, "{v}");
    assert_eq!(
        (head["reaches_checkpoint"].as_bool(), head["chain_verified"].as_bool(), head["seq"].as_i64()),
        (Some(false), Some(true), Some(4)),
        "{head}"
    );
    assert!(head["finding"].as_str().is_some_and(|f| f.contains("entries were removed")), "{head}");

    // A checkpoint edited to match (its head moved back), or signed by another key: refused.
    let mut edited = cp.clone();
    let i = cp["machines"].as_array().expect("machines").iter().position(|h| h["machine_id"] == m).expect("head");
    edited["machines"][i]["seq"] = json!(4);
    let other = paddock_domain::signing::SigningKey::from_pem(&paddock_domain::signing::SigningKey::generate_pem())
        .expect("key");
    let mut foreign = cp.clone();
    let document = json!({ "issued_at": cp["issued_at"], "machines": cp["machines"] });
    let signed = other.sign(&document);
    (foreign["signature"], foreign["key_id"]) = (json!(signed.signature), json!(signed.key_id));
    for bad in [edited, foreign] {
        let resp = app.post("/v1/custody/verify").token(&admin()).json(&json!({ "checkpoint": bad })).send().await;
        assert_eq!(resp.status.as_u16(), 422);
        assert_eq!(resp.header("content-type"), Some("application/problem+json"));
        assert_eq!(resp.json()["code"], "validation_failed");
    }
}

#[tokio::test]
async fn a_restored_older_copy_of_the_ledger_is_found_against_a_newer_checkpoint() {
    let lab = Lab::new().await;
    let app = &lab.app;
    machine_class(app, "gpu", 8).await;
    let m = lab.enroll("gpu", &["n1"]).await.remove(0);
    lab.machine_in(&m, "available").await;
    let older = checkpoint(app).await;
    sqlx::query("create table custody_backup as select * from custody_entries")
        .execute(&app.db.pool)
        .await
        .expect("backup");
    maintenance_round(&lab, &m).await;
    let newer = checkpoint(app).await;
    assert_eq!((head_seq(&older, &m), head_seq(&newer, &m)), (Some(4), Some(7)));

    // The backup restored in place of the table: a valid chain, ending where the machine is.
    tamper(app, "delete from custody_entries").await;
    sqlx::query("insert into custody_entries select * from custody_backup")
        .execute(&app.db.pool)
        .await
        .expect("restore");
    assert_eq!(lab.custody(&m).await["verified"], true);
    let (v, head) = verify(app, &older, &m).await;
    assert_eq!((v["verified"].as_bool(), head["reaches_checkpoint"].as_bool()), (Some(true), Some(true)), "{v}");
    let (v, head) = verify(app, &newer, &m).await;
    assert_eq!((v["verified"].as_bool(), head["reaches_checkpoint"].as_bool()), (Some(false), Some(false)), "{v}");
    assert_eq!((head["checkpoint_seq"].as_i64(), head["seq"].as_i64()), (Some(7), Some(4)), "{head}");
}

#[tokio::test]
async fn without_a_signing_key_checkpoints_are_409_naming_the_setting() {
    let app = TestApp::without_signing_key().await;
    let body = json!({ "checkpoint": { "issued_at": "2026-12-01T00:00:00Z", "machines": [],
        "signature": "AAAA", "key_id": "0000000000000000" } });
    for resp in [
        app.get("/v1/custody/checkpoint").token(&admin()).send().await,
        app.post("/v1/custody/verify").token(&admin()).json(&body).send().await,
    ] {
        assert_eq!(resp.status.as_u16(), 409);
        assert_eq!(resp.header("content-type"), Some("application/problem+json"));
        let problem = resp.json();
        assert_eq!(problem["code"], "signing_key_missing");
        assert!(problem["detail"].as_str().is_some_and(|d| d.contains("PADDOCK_USAGE_SIGNING_KEY")), "{problem}");
    }
    assert_eq!(app.count("custody_checkpoints").await, 0);
}

#[tokio::test]
async fn the_isolation_report_names_the_latest_checkpoint() {
    let app = TestApp::new().await;
    let t = id(&tenant(&app, "acme").await);
    assert_eq!(report(&app, &t, &admin()).await["checkpoint"], Value::Null);
    checkpoint(&app).await;
    let latest = checkpoint(&app).await;
    let r = report(&app, &t, &admin()).await;
    assert_eq!(
        (&r["checkpoint"]["issued_at"], &r["checkpoint"]["key_id"]),
        (&latest["issued_at"], &latest["key_id"]),
        "{r}"
    );
    let document = json!({ "issued_at": latest["issued_at"], "machines": latest["machines"] });
    assert_eq!(r["checkpoint"]["digest"], paddock_domain::ledger::digest(&document));
}

#[tokio::test]
async fn a_runtime_role_that_does_not_own_the_ledger_runs_machines_but_cannot_rewrite_the_ledger() {
    // The test database belongs to the superuser that migrated it (the owner); the runtime role
    // gets what `paddock migrate` grants it (`Store::grant_runtime`, as with
    // PADDOCK_MIGRATE_DATABASE_URL). Roles are per server: each test makes its own, left behind
    // with the throw-away test server.
    let owner = paddock_testkit::TestDb::new().await;
    let role = format!("runtime_{}", Uuid::new_v4().simple());
    sqlx::query(&format!("create role {role} login")).execute(&owner.pool).await.expect("create role");
    Store::from_pool(owner.pool.clone()).grant_runtime(&role).await.expect("grant");
    // The simulated world lives in its own schema (never in production): the test lets the role use it.
    for grant in [
        format!("grant usage on schema {} to {role}", paddock_sim::SCHEMA),
        format!("grant select, insert, update, delete on all tables in schema {} to {role}", paddock_sim::SCHEMA),
    ] {
        sqlx::query(&grant).execute(&owner.pool).await.expect("granting the simulated world");
    }
    let options: sqlx::postgres::PgConnectOptions = owner.url.parse().expect("url");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect_with(options.username(&role))
        .await
        .expect("connecting as the runtime role");
    let current: String = sqlx::query_scalar("select current_user::text").fetch_one(&pool).await.expect("whoami");
    assert_eq!(current, role);
    let runtime = paddock_testkit::TestDb { name: owner.name.clone(), url: owner.url.clone(), pool };
    let lab = Lab::on(TestApp::served_on(runtime).await).await;
    let app = &lab.app;

    // Machine steps work: enrolled, inspected, wiped, available; maintenance and back.
    machine_class(app, "gpu", 8).await;
    let m = lab.enroll("gpu", &["n1"]).await.remove(0);
    lab.machine_in(&m, "available").await;
    maintenance_round(&lab, &m).await;
    let c = lab.custody(&m).await;
    assert_eq!((c["verified"].as_bool(), c["items"].as_array().map(Vec::len)), (Some(true), Some(7)), "{c}");
    checkpoint(app).await;

    // The ledger and its checkpoints: read and append only, triggers out of reach.
    for statement in [
        "update custody_entries set reason = 'edited'",
        "delete from custody_entries",
        "truncate custody_entries",
        "drop trigger custody_entries_append_only on custody_entries",
        "alter table custody_entries disable trigger custody_entries_append_only",
        "alter table custody_entries drop constraint custody_entries_mac_present",
        "update custody_checkpoints set key_id = 'edited'",
        "delete from custody_checkpoints",
    ] {
        let refused = sqlx::query(statement).execute(&app.db.pool).await.expect_err(statement);
        let code = refused.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{statement}: {refused}");
        // Refused for want of the privilege or of ownership, not only by the trigger (which
        // would refuse the owner too, until the owner drops it).
        let message = refused.to_string();
        assert!(message.contains("permission denied") || message.contains("must be owner"), "{statement}: {message}");
    }
    let rows: i64 =
        sqlx::query_scalar("select count(*) from custody_entries").fetch_one(&app.db.pool).await.expect("count");
    assert_eq!(rows, 7);
}

/// A checkpoint answers every head; reading it again while no head moved answers the same
/// checkpoint and records nothing, and one is issued (and recorded) once a head moved.
#[tokio::test]
async fn a_checkpoint_is_issued_only_when_a_chain_head_moved() {
    let app = TestApp::new().await;
    machine_class(&app, "gpu", 8).await;
    let n1 = id(&crate::common::machine(&app, "n1", "gpu").await);
    let first = checkpoint(&app).await;
    for _ in 0..3 {
        assert_eq!(checkpoint(&app).await, first, "nothing moved: the same checkpoint");
    }
    assert_eq!(app.count("custody_checkpoints").await, 1);
    let (v, head) = verify(&app, &first, &n1).await;
    assert_eq!((v["verified"].as_bool(), head["reaches_checkpoint"].as_bool()), (Some(true), Some(true)), "{v}");

    // A new machine is a new head.
    let n2 = id(&crate::common::machine(&app, "n2", "gpu").await);
    let second = checkpoint(&app).await;
    assert_ne!(second["signature"], first["signature"]);
    assert_eq!((head_seq(&second, &n1), head_seq(&second, &n2)), (Some(1), Some(1)));
    assert_eq!(app.count("custody_checkpoints").await, 2);
    assert_eq!(checkpoint(&app).await, second);

    // A head that moves along its chain.
    let mut conn = app.db.pool.acquire().await.expect("conn");
    let key = app.services.ledger_key();
    let machine_id = paddock_types::MachineId(n1.parse().expect("uuid"));
    let (from, to) =
        (paddock_types::machine::MachineState::Enrolling, paddock_types::machine::MachineState::Inspecting);
    assert!(paddock_store::machine::transition(&mut conn, key, machine_id, from, 1, to).await.expect("move"));
    drop(conn);
    let third = checkpoint(&app).await;
    assert_eq!((head_seq(&third, &n1), head_seq(&third, &n2)), (Some(2), Some(1)));
    assert_eq!(app.count("custody_checkpoints").await, 3);
}

/// The custody chains the isolation report verified in full so far, from `/metrics`.
async fn chain_verifications(app: &TestApp) -> u64 {
    let text = String::from_utf8(app.get("/metrics").send().await.expect(200).body.to_vec()).expect("utf-8");
    let line = text
        .lines()
        .find(|l| l.starts_with("paddock_custody_chain_verifications_total "))
        .unwrap_or_else(|| panic!("no chain verification counter in {text}"));
    line.rsplit(' ').next().and_then(|n| n.parse().ok()).expect("a count")
}

/// The isolation report verifies a machine's chain (every MAC) once per chain: a report read
/// again reuses the verdict; any change to the chain, below its head too, is verified anew.
#[tokio::test]
async fn the_isolation_report_verifies_a_chain_again_only_once_it_changed() {
    let lab = Lab::new().await;
    let app = &lab.app;
    machine_class(app, "gpu", 8).await;
    let m = lab.enroll("gpu", &["n1"]).await.remove(0);
    lab.machine_in(&m, "available").await;
    let acme = id(&tenant(app, "acme").await);
    let acme_admin = token(&["tenant:admin"], Some(acme.parse().expect("uuid")));
    lab.ready_cluster(&acme, &acme_admin, "hpc", "gpu").await;
    let held = |r: &Value| r["clusters"][0]["machines"][0].clone();

    let before = chain_verifications(app).await;
    let first = report(app, &acme, &acme_admin).await;
    assert_eq!(held(&first)["ledger_verified"], true, "{first}");
    assert_eq!(chain_verifications(app).await, before + 1);
    for _ in 0..3 {
        assert_eq!(report(app, &acme, &acme_admin).await["digest"], first["digest"]);
    }
    assert_eq!(chain_verifications(app).await, before + 1, "an unchanged chain is not verified again");

    // An entry below the head edited by someone with database access: a new chain, found at once.
    tamper(app, &format!("update custody_entries set reason = 'nothing to see' where machine_id = '{m}' and seq = 2"))
        .await;
    let edited = report(app, &acme, &acme_admin).await;
    assert_eq!(held(&edited)["ledger_verified"], false, "{edited}");
    assert_eq!(chain_verifications(app).await, before + 2);
}
