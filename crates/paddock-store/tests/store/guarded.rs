//! Guarded updates: a write guarded on a stale version changes nothing and says so.

use chrono::Utc;
use paddock_domain::cluster::set_condition;
use paddock_store::allocation::{self, Allocation};
use paddock_store::{cluster, lifecycle, machine};
use paddock_types::cluster::{ClusterPhase, ConditionStatus, Endpoints};
use paddock_types::machine::MachineState;

use crate::support::{class, cluster as new_cluster, count, db, machine as new_machine, state, tenant};

/// The allocation head timeout (`PADDOCK_ALLOCATION_HEAD_TIMEOUT`) at its default.
const HEAD: std::time::Duration = std::time::Duration::from_secs(600);

/// The cluster's phase, conditions and status version as stored.
/// `lifecycle::finish_release` in a transaction of its own.
async fn finish_release(
    store: &paddock_store::Store,
    m: paddock_types::MachineId,
    from: MachineState,
    version: i64,
    what: &str,
) -> bool {
    let mut tx = store.begin().await.expect("begin");
    let moved = lifecycle::finish_release(&mut tx, &paddock_testkit::ledger_key(), m, from, version).await.expect(what);
    tx.commit().await.expect("commit");
    moved
}

async fn status(store: &paddock_store::Store, id: paddock_types::ClusterId) -> (String, serde_json::Value, i64) {
    sqlx::query_as("select phase, conditions, status_version from clusters where id = $1")
        .bind(id.uuid())
        .fetch_one(store.pool())
        .await
        .expect("cluster")
}

#[tokio::test]
async fn a_cluster_status_write_on_a_stale_version_writes_nothing() {
    let (_db, store) = db().await;
    let t = tenant(&store, None, None).await;
    let cpu = class(&store, "cpu", 0).await;
    let (c, _) = new_cluster(&store, t, cpu, 0, 1).await;
    let mut conn = store.conn().await.expect("conn");
    let (_, _, v) = status(&store, c).await;

    let mut conditions = Vec::new();
    set_condition(&mut conditions, "Ready", ConditionStatus::False, "Reconciling", "not yet", Utc::now());
    let endpoints = Endpoints::default();
    let write = cluster::StatusWrite {
        phase: ClusterPhase::Provisioning,
        conditions: &conditions,
        endpoints: &endpoints,
        observed_generation: 0,
    };
    let before = status(&store, c).await;
    assert!(!cluster::set_status(&mut conn, t, c, v - 1, &write).await.expect("stale"));
    assert!(!cluster::set_status(&mut conn, t, c, v + 1, &write).await.expect("ahead"));
    assert_eq!(status(&store, c).await, before, "a lost guard writes nothing");

    assert!(cluster::set_status(&mut conn, t, c, v, &write).await.expect("current"));
    let (phase, _, after) = status(&store, c).await;
    assert_eq!((phase.as_str(), after), ("provisioning", v + 1));
    // The same status again is no write (the version stays) and no lost race.
    assert!(cluster::set_status(&mut conn, t, c, after, &write).await.expect("unchanged"));
    assert_eq!(status(&store, c).await.2, after);
    // The version read before the write is stale now.
    let moved = cluster::StatusWrite { phase: ClusterPhase::Degraded, ..write };
    assert!(!cluster::set_status(&mut conn, t, c, v, &moved).await.expect("stale again"));
    assert_eq!(status(&store, c).await.0, "provisioning");

    // Conditions alone: the same guard.
    let (_, stored, current) = status(&store, c).await;
    set_condition(&mut conditions, "Ready", ConditionStatus::True, "Ready", "", Utc::now());
    assert!(!cluster::set_conditions(&mut conn, t, c, current - 1, &conditions).await.expect("stale"));
    assert_eq!(status(&store, c).await, ("provisioning".to_owned(), stored, current));
    assert!(cluster::set_conditions(&mut conn, t, c, current, &conditions).await.expect("current"));
    assert_eq!(status(&store, c).await.2, current + 1);

    // Another tenant's cluster is never written, whatever the version.
    let other = tenant(&store, None, None).await;
    assert!(!cluster::set_conditions(&mut conn, other, c, current + 1, &[]).await.expect("foreign"));
    assert_eq!(status(&store, c).await.2, current + 1);
}

#[tokio::test]
async fn machine_moves_on_a_stale_state_or_version_write_nothing() {
    let (db, store) = db().await;
    let t = tenant(&store, None, None).await;
    let cpu = class(&store, "cpu", 0).await;
    let m = new_machine(&store, cpu).await;
    let (c, need) = new_cluster(&store, t, cpu, 0, 1).await;
    let mut conn = store.conn().await.expect("conn");
    let (_, v) = state(&store, m).await;
    let entries = "select count(*) from custody_entries where machine_id = $1";

    // A plain transition: the wrong state or an old version is refused, with no ledger entry.
    assert!(!machine::transition(
        &mut conn,
        &paddock_testkit::ledger_key(),
        m,
        MachineState::Cleaning,
        v,
        MachineState::Maintenance
    )
    .await
    .expect("t"));
    assert!(!machine::transition(
        &mut conn,
        &paddock_testkit::ledger_key(),
        m,
        MachineState::Available,
        v - 1,
        MachineState::Maintenance
    )
    .await
    .expect("t"));
    assert_eq!(state(&store, m).await, ("available".to_owned(), v));
    assert_eq!(count(&store, entries, m.uuid()).await, 0);

    let mut tx = store.begin().await.expect("begin");
    assert_eq!(
        allocation::allocate(&mut tx, &paddock_testkit::ledger_key(), t, c, &[need], HEAD).await.expect("allocate"),
        Allocation::Allocated(vec![m])
    );
    tx.commit().await.expect("commit");
    let (_, v) = state(&store, m).await;
    let ledger = count(&store, entries, m.uuid()).await;

    // A release guarded on what was read: a stale version or state is refused and says so.
    assert!(!lifecycle::begin_release(&mut conn, &paddock_testkit::ledger_key(), m, MachineState::Allocated, v - 1)
        .await
        .expect("stale"));
    assert!(!lifecycle::begin_release(&mut conn, &paddock_testkit::ledger_key(), m, MachineState::Active, v)
        .await
        .expect("wrong state"));
    assert!(!finish_release(&store, m, MachineState::Allocated, v, "not releasing").await);
    assert_eq!(state(&store, m).await, ("allocated".to_owned(), v));
    assert_eq!(count(&store, entries, m.uuid()).await, ledger);
    let started = "select count(*) from machine_allocations where machine_id = $1 and release_started_at is not null";
    assert_eq!(count(&store, started, m.uuid()).await, 0, "billing runs on");

    assert!(lifecycle::begin_release(&mut conn, &paddock_testkit::ledger_key(), m, MachineState::Allocated, v)
        .await
        .expect("release"));
    assert_eq!(state(&store, m).await, ("releasing".to_owned(), v + 1));
    assert_eq!(count(&store, started, m.uuid()).await, 1);
    // The same read again is stale now: a second release of it writes nothing.
    assert!(!lifecycle::begin_release(&mut conn, &paddock_testkit::ledger_key(), m, MachineState::Allocated, v)
        .await
        .expect("again"));
    assert!(!finish_release(&store, m, MachineState::Releasing, v, "stale").await);
    assert_eq!(state(&store, m).await, ("releasing".to_owned(), v + 1));

    assert!(finish_release(&store, m, MachineState::Releasing, v + 1, "finish").await);
    assert_eq!(state(&store, m).await, ("cleaning".to_owned(), v + 2));
    let live = "select count(*) from machine_allocations where machine_id = $1 and released_at is null";
    assert_eq!(count(&store, live, m.uuid()).await, 0);
    assert_eq!(count(&store, entries, m.uuid()).await, ledger + 2);
    assert_eq!(db.count("machine_allocations").await, 1);
}
