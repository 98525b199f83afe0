//! The re-seal job with two keys: values sealed under the old key are sealed again under the
//! current one (so the old key can be retired), a second run changes nothing, and a value that
//! no configured key opens is left alone and fails the job, naming how many.

use std::sync::Arc;
use std::time::Duration;

use paddock_domain::job_kind::RESEAL;
use paddock_domain::secret::{Binding, Cipher};
use paddock_service::Services;
use paddock_store::{job, reseal, Store};
use paddock_testkit::{admin, ledger_key, TestApp};
use paddock_worker::reconcile::Resealer;
use paddock_worker::{JobHandler, Outcome};
use serde_json::json;
use uuid::Uuid;

use crate::support::claim;

const WORKER: &str = "reseal-test-worker";

fn binding(row: Uuid) -> Binding<'static> {
    Binding { table: "machines", column: "bmc_password_enc", row }
}

async fn passwords(store: &Store) -> Vec<(Uuid, Vec<u8>)> {
    let mut conn = store.conn().await.expect("conn");
    sqlx::query_as("select id, bmc_password_enc from machines order by id").fetch_all(&mut *conn).await.expect("read")
}

/// Enqueues the job (as `paddock reseal` does), then claims, runs and completes it.
async fn reseal_once(store: &Store, resealer: &Resealer) -> Outcome {
    let mut tx = store.begin().await.expect("begin");
    reseal::enqueue(&mut tx).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let jobs = claim(store, WORKER, &[RESEAL], Duration::from_secs(60), 4).await;
    assert_eq!(jobs.len(), 1, "one re-seal job");
    let outcome = resealer.run(&jobs[0]).await;
    job::complete(store, jobs[0].id, WORKER).await.expect("complete");
    outcome
}

#[tokio::test]
async fn reseal_moves_every_secret_to_the_current_key_so_the_old_one_can_be_retired() {
    let (old_key, new_key) = (Cipher::generate_key(), Cipher::generate_key());
    let old = Arc::new(Cipher::new(&old_key, &[]).expect("old key"));
    let app = TestApp::with_services(|s| Services::new(s.store().clone(), old.clone(), ledger_key())).await;
    let store = app.services.store().clone();
    app.post("/v1/machine-classes")
        .token(&admin())
        .json(&json!({ "name": "cpu", "cpu_cores": 8, "memory_gib": 32, "gpu_model": "", "gpu_count": 0 }))
        .send()
        .await
        .expect(201);
    for n in 0..3 {
        let body = json!({ "name": format!("m-{n}"), "machine_class": "cpu",
            "bmc": { "url": format!("sim://m-{n}"), "username": "admin", "password": format!("pw-{n}") } });
        app.post("/v1/machines").token(&admin()).json(&body).send().await.expect(202);
    }
    let rotated = Arc::new(Cipher::new(&new_key, std::slice::from_ref(&old_key)).expect("keys"));
    let resealer = Resealer::new(Services::new(store.clone(), rotated.clone(), ledger_key()));
    assert!(matches!(reseal_once(&store, &resealer).await, Outcome::Done));

    let retired = Cipher::new(&new_key, &[]).expect("the new key alone");
    let after = passwords(&store).await;
    assert_eq!(after.len(), 3);
    let mut opened: Vec<String> = after
        .iter()
        .map(|(id, sealed)| {
            String::from_utf8(retired.open(sealed, binding(*id)).expect("opens without the old key")).expect("utf-8")
        })
        .collect();
    opened.sort();
    assert_eq!(opened, ["pw-0", "pw-1", "pw-2"]);

    // Idempotent: a second run finds nothing to do and writes nothing.
    assert!(matches!(reseal_once(&store, &resealer).await, Outcome::Done));
    assert_eq!(passwords(&store).await, after);

    // A value under a key no longer configured is left as it is, and the job says so.
    let lost = Cipher::new(&Cipher::generate_key(), &[]).expect("a third key");
    let (victim, _) = after[0].clone();
    let unreadable = lost.seal(b"pw-lost", binding(victim)).expect("seal");
    let mut conn = store.conn().await.expect("conn");
    sqlx::query("update machines set bmc_password_enc = $2 where id = $1")
        .bind(victim)
        .bind(&unreadable)
        .execute(&mut *conn)
        .await
        .expect("plant");
    match reseal_once(&store, &resealer).await {
        Outcome::Fail { problem } => {
            assert_eq!(problem.code, "reseal_unreadable_values");
            assert!(problem.detail.starts_with("1 sealed values"), "{}", problem.detail);
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(passwords(&store).await[0].1, unreadable);
}
