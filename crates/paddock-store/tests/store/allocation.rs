//! Allocation (docs/architecture.md, cluster reconciler step 3): all or nothing, within quota, first come first served,
//! one live allocation per machine.

use std::sync::Arc;
use std::time::Duration;

use paddock_store::allocation::{self, Allocation, Need};
use paddock_store::Store;
use paddock_testkit::eventually;
use paddock_types::{ClusterId, MachineId, TenantId};
use tokio::sync::Barrier;

use crate::support::{class, cluster, count, db, machine, state, tenant};

/// The allocation head timeout (`PADDOCK_ALLOCATION_HEAD_TIMEOUT`) at its default.
const HEAD: Duration = Duration::from_secs(600);

async fn allocate(store: &Store, tenant: TenantId, cluster: ClusterId, needs: &[Need]) -> Allocation {
    allocate_within(store, tenant, cluster, needs, HEAD).await
}

async fn allocate_within(
    store: &Store,
    tenant: TenantId,
    cluster: ClusterId,
    needs: &[Need],
    head_timeout: Duration,
) -> Allocation {
    let mut tx = store.begin().await.expect("begin");
    let outcome = allocation::allocate(&mut tx, &paddock_testkit::ledger_key(), tenant, cluster, needs, head_timeout)
        .await
        .expect("allocate");
    tx.commit().await.expect("commit");
    // As the cluster reconciler does: the machines are handed over once the allocation is in.
    if let Allocation::Allocated(machines) = &outcome {
        let mut tx = store.begin().await.expect("begin");
        allocation::hand_over(&mut tx, machines, needs).await.expect("hand over");
        tx.commit().await.expect("commit");
    }
    outcome
}

async fn waiting(store: &Store, cluster: ClusterId) -> bool {
    sqlx::query_scalar("select waiting_since is not null from clusters where id = $1")
        .bind(cluster.uuid())
        .fetch_one(store.pool())
        .await
        .expect("cluster")
}

const LIVE_ALLOCATIONS: &str = "select count(*) from machine_allocations where machine_id = $1 and released_at is null";

#[tokio::test]
async fn a_request_that_cannot_be_met_in_full_allocates_nothing() {
    let (db, store) = db().await;
    let t = tenant(&store, None, None).await;
    let (cpu, gpu) = (class(&store, "cpu", 0).await, class(&store, "gpu", 4).await);
    let mut machines = vec![machine(&store, cpu).await, machine(&store, cpu).await, machine(&store, gpu).await];
    let (c, need_cpu) = cluster(&store, t, cpu, 0, 2).await;
    let need_gpu = Need { node_pool_id: need_cpu.node_pool_id, machine_class_id: gpu, gpu_count: 4, count: 2 };

    let outcome = allocate(&store, t, c, &[need_cpu.clone(), need_gpu.clone()]).await;
    assert_eq!(outcome, Allocation::Short { machine_class: "gpu".to_owned(), needed: 2, available: 1 });
    for m in &machines {
        assert_eq!(state(&store, *m).await.0, "available", "nothing of the request was taken");
    }
    assert_eq!(db.count("machine_allocations").await, 0);
    assert_eq!(db.count("custody_entries").await, 0);
    assert!(waiting(&store, c).await, "a short cluster waits, keeping its place");

    // With one more GPU machine the whole request goes through, each machine with its own
    // allocation consuming its clean, a custody entry and a reconcile job.
    machines.push(machine(&store, gpu).await);
    let Allocation::Allocated(mut got) = allocate(&store, t, c, &[need_cpu, need_gpu]).await else {
        panic!("the request fits now");
    };
    got.sort_by_key(|m| m.uuid());
    machines.sort_by_key(|m| m.uuid());
    assert_eq!(got, machines);
    for m in &machines {
        assert_eq!(state(&store, *m).await.0, "allocated");
        assert_eq!(count(&store, LIVE_ALLOCATIONS, m.uuid()).await, 1);
        let held: (bool, bool) = sqlx::query_as(
            "select m.clean_id is null, a.clean_id is not null from machines m \
             join machine_allocations a on a.id = m.allocation_id where m.id = $1 and m.cluster_id = $2",
        )
        .bind(m.uuid())
        .bind(c.uuid())
        .fetch_one(store.pool())
        .await
        .expect("allocation");
        assert_eq!(held, (true, true), "the allocation consumed the machine's clean");
        let entry = "select count(*) from custody_entries where machine_id = $1 and to_state = 'allocated'";
        assert_eq!(count(&store, entry, m.uuid()).await, 1);
        let jobs = "select count(*) from jobs where target_id = $1 and kind = 'machine_reconcile' and state = 'queued'";
        assert_eq!(count(&store, jobs, m.uuid()).await, 1);
    }
    assert!(!waiting(&store, c).await);
    assert_eq!(allocation::machines_of(&mut store.conn().await.expect("conn"), t, c).await.expect("held").len(), 4);
}

#[tokio::test]
async fn quotas_count_what_the_tenant_already_holds() {
    let (db, store) = db().await;
    let t = tenant(&store, Some(2), Some(4)).await;
    let (cpu, gpu) = (class(&store, "cpu", 0).await, class(&store, "gpu", 4).await);
    for _ in 0..3 {
        machine(&store, cpu).await;
        machine(&store, gpu).await;
    }
    let (first, need) = cluster(&store, t, cpu, 0, 1).await;
    assert!(matches!(allocate(&store, t, first, &[need]).await, Allocation::Allocated(m) if m.len() == 1));

    let (second, need) = cluster(&store, t, cpu, 0, 2).await;
    let over = allocate(&store, t, second, &[need]).await;
    assert_eq!(over, Allocation::OverQuota { quota: "max_nodes", limit: 2, would_hold: 3 });
    assert!(!waiting(&store, second).await, "over its quota a cluster does not hold up the line");
    assert_eq!(db.count("machine_allocations").await, 1);

    // Nodes are checked before GPUs; a tenant without a node quota meets its GPU quota.
    let (third, need) = cluster(&store, t, gpu, 4, 2).await;
    let over = allocate(&store, t, third, &[need]).await;
    assert_eq!(over, Allocation::OverQuota { quota: "max_nodes", limit: 2, would_hold: 3 });
    let t2 = tenant(&store, None, Some(4)).await;
    let (fourth, need) = cluster(&store, t2, gpu, 4, 2).await;
    assert_eq!(
        allocate(&store, t2, fourth, &[need]).await,
        Allocation::OverQuota { quota: "max_gpus", limit: 4, would_hold: 8 }
    );
    assert_eq!(db.count("machine_allocations").await, 1);
}

#[tokio::test]
async fn an_earlier_waiting_cluster_of_the_class_goes_first() {
    let (_db, store) = db().await;
    let t = tenant(&store, None, None).await;
    let cpu = class(&store, "cpu", 0).await;
    let only = machine(&store, cpu).await;
    let (a, need_a) = cluster(&store, t, cpu, 0, 2).await;
    let (b, need_b) = cluster(&store, t, cpu, 0, 1).await;

    assert_eq!(
        allocate(&store, t, a, std::slice::from_ref(&need_a)).await,
        Allocation::Short { machine_class: "cpu".to_owned(), needed: 2, available: 1 }
    );
    // B would fit, but A waits for the class since before: B is behind it and takes nothing.
    let behind = allocate(&store, t, b, std::slice::from_ref(&need_b)).await;
    assert!(matches!(behind, Allocation::Behind { cluster_id, .. } if cluster_id == a), "{behind:?}");
    assert_eq!(state(&store, only).await.0, "available");
    assert!(waiting(&store, b).await);

    // A machine frees up: A goes first and the next in line (B) is woken.
    machine(&store, cpu).await;
    assert!(matches!(allocate(&store, t, a, &[need_a]).await, Allocation::Allocated(m) if m.len() == 2));
    let woken = "select count(*) from jobs where target_id = $1 and kind = 'cluster_reconcile' and state = 'queued'";
    assert_eq!(count(&store, woken, b.uuid()).await, 1);
    assert_eq!(
        allocate(&store, t, b, &[need_b]).await,
        Allocation::Short { machine_class: "cpu".to_owned(), needed: 1, available: 0 }
    );
}

#[tokio::test]
async fn a_waiting_head_holds_back_its_class_only_until_its_timeout_and_then_keeps_what_frees_up() {
    let (_db, store) = db().await;
    let head_timeout = Duration::from_secs(1);
    let (big, small) = (tenant(&store, None, None).await, tenant(&store, None, None).await);
    let cpu = class(&store, "cpu", 0).await;
    let first = machine(&store, cpu).await;
    let (a, need_a) = cluster(&store, big, cpu, 0, 2).await;
    let (b, need_b) = cluster(&store, small, cpu, 0, 1).await;
    let (c, need_c) = cluster(&store, small, cpu, 0, 1).await;
    let within = async |t: TenantId, cl: ClusterId, need: &Need| {
        allocate_within(&store, t, cl, std::slice::from_ref(need), head_timeout).await
    };

    // A cannot be met for now and waits; within its timeout B waits behind it though one fits.
    assert!(matches!(within(big, a, &need_a).await, Allocation::Short { .. }));
    // Behind it until its timeout ends, which B is told so that it can try again then.
    let Allocation::Behind { cluster_id, until } = within(small, b, &need_b).await else { panic!("B is not behind A") };
    assert_eq!(cluster_id, a);
    let left = until - chrono::Utc::now();
    assert!(left > chrono::Duration::zero() && left.to_std().expect("positive") <= head_timeout, "{left}");
    // Past A's timeout, and not before it, B is served from the machine that was already free:
    // until then every try is told the same wait.
    let served = eventually(head_timeout * 20, || async {
        // The database's clock is this host's: a try that starts past `until` is served.
        let past = chrono::Utc::now() > until;
        match within(small, b, &need_b).await {
            Allocation::Allocated(machines) => Some(machines),
            other => {
                assert!(!past, "still held back after A's timeout ended ({until}): {other:?}");
                assert_eq!(other, Allocation::Behind { cluster_id: a, until }, "behind A until its timeout ends");
                None
            }
        }
    })
    .await;
    assert!(chrono::Utc::now() >= until, "B was served before A's timeout ended ({until})");
    assert_eq!(served, vec![first]);
    // A machine freed from then on is kept for A: C, behind A, does not get it.
    let freed = machine(&store, cpu).await;
    assert!(matches!(within(small, c, &need_c).await, Allocation::Short { available: 0, .. }));
    assert_eq!(state(&store, freed).await.0, "available");
    // Once enough have been freed, A is served; then C is the head and is served in turn.
    let second = machine(&store, cpu).await;
    let mut expected = vec![freed, second];
    expected.sort_by_key(|m| m.uuid());
    assert_eq!(within(big, a, &need_a).await, Allocation::Allocated(expected));
    let third = machine(&store, cpu).await;
    assert_eq!(within(small, c, &need_c).await, Allocation::Allocated(vec![third]));
}

#[tokio::test]
async fn a_machine_holds_one_live_allocation_even_when_two_clusters_race_for_it() {
    let (_db, store) = db().await;
    let (t1, t2) = (tenant(&store, None, None).await, tenant(&store, None, None).await);
    let cpu = class(&store, "cpu", 0).await;
    let only: MachineId = machine(&store, cpu).await;
    let (a, need_a) = cluster(&store, t1, cpu, 0, 1).await;
    let (b, need_b) = cluster(&store, t2, cpu, 0, 1).await;

    let mut first = store.begin().await.expect("begin");
    let holder: i32 = sqlx::query_scalar("select pg_backend_pid()").fetch_one(&mut *first).await.expect("pid");
    assert_eq!(
        allocation::allocate(&mut first, &paddock_testkit::ledger_key(), t1, a, &[need_a], HEAD).await.expect("a"),
        Allocation::Allocated(vec![only])
    );
    // The second allocator of the class waits for the first one's transaction...
    let racing = {
        let store = store.clone();
        tokio::spawn(async move { allocate(&store, t2, b, &[need_b]).await })
    };
    // (it waits on a lock the first one holds; no allocator without a wait would get there).
    let blocked = "select exists (select 1 from pg_stat_activity where $1 = any(pg_blocking_pids(pid)))";
    eventually(Duration::from_secs(30), || async {
        let waits: bool = sqlx::query_scalar(blocked).bind(holder).fetch_one(store.pool()).await.expect("locks");
        waits.then_some(())
    })
    .await;
    assert!(!racing.is_finished(), "one allocator per class at a time");
    first.commit().await.expect("commit");
    // ...and then finds the machine taken.
    let second = racing.await.expect("task");
    assert_eq!(second, Allocation::Short { machine_class: "cpu".to_owned(), needed: 1, available: 0 });
    assert_eq!(count(&store, LIVE_ALLOCATIONS, only.uuid()).await, 1);

    // The schema refuses a second live allocation outright, even with a clean of its own.
    let clean = uuid::Uuid::now_v7();
    sqlx::query(
        "insert into machine_cleans (id, machine_id, run_id, method, evidence) values ($1, $2, $3, 'agent', '{}')",
    )
    .bind(clean)
    .bind(only.uuid())
    .bind(uuid::Uuid::now_v7())
    .execute(store.pool())
    .await
    .expect("clean");
    let pool: uuid::Uuid = sqlx::query_scalar("select id from node_pools where cluster_id = $1")
        .bind(b.uuid())
        .fetch_one(store.pool())
        .await
        .expect("pool");
    let second_live = sqlx::query(
        "insert into machine_allocations (id, machine_id, clean_id, tenant_id, cluster_id, node_pool_id) \
         values ($1, $2, $3, $4, $5, $6)",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(only.uuid())
    .bind(clean)
    .bind(t2.uuid())
    .bind(b.uuid())
    .bind(pool)
    .execute(store.pool())
    .await
    .expect_err("a second live allocation");
    let db_error = second_live.as_database_error().expect("a database error");
    assert_eq!(db_error.constraint(), Some("machine_allocations_live_key"), "{db_error}");
}

#[tokio::test]
async fn a_tenant_allocating_two_classes_at_once_stays_within_its_node_quota() {
    let (_db, store) = db().await;
    let t = tenant(&store, Some(2), None).await;
    let (a_class, b_class) = (class(&store, "a", 0).await, class(&store, "b", 0).await);
    for _ in 0..2 {
        machine(&store, a_class).await;
        machine(&store, b_class).await;
    }
    let (a, need_a) = cluster(&store, t, a_class, 0, 2).await;
    let (b, need_b) = cluster(&store, t, b_class, 0, 1).await;

    // A takes the whole quota and has not committed yet when B, of another class (so no class
    // lock keeps them apart), asks for one more.
    let mut first = store.begin().await.expect("begin");
    let holder: i32 = sqlx::query_scalar("select pg_backend_pid()").fetch_one(&mut *first).await.expect("pid");
    let got = allocation::allocate(&mut first, &paddock_testkit::ledger_key(), t, a, &[need_a], HEAD).await;
    assert!(matches!(got.expect("a"), Allocation::Allocated(m) if m.len() == 2));
    let racing = {
        let store = store.clone();
        tokio::spawn(async move { allocate(&store, t, b, &[need_b]).await })
    };
    // B either waits for A's transaction (the tenant's lock) or, were nothing to hold it, is done
    // already: both end the wait, and only the first keeps the quota.
    let blocked = "select exists (select 1 from pg_stat_activity where $1 = any(pg_blocking_pids(pid)))";
    eventually(Duration::from_secs(30), || async {
        let waits: bool = sqlx::query_scalar(blocked).bind(holder).fetch_one(store.pool()).await.expect("locks");
        (waits || racing.is_finished()).then_some(())
    })
    .await;
    first.commit().await.expect("commit");
    let second = racing.await.expect("task");
    assert_eq!(second, Allocation::OverQuota { quota: "max_nodes", limit: 2, would_hold: 3 });
    let held = "select count(*) from machines where tenant_id = $1 and state = 'allocated'";
    assert_eq!(count(&store, held, t.uuid()).await, 2, "the tenant holds its quota, not more");
}

/// One cluster's allocator in [`concurrent_allocators_share_no_machine_and_pass_no_quota`]: tries
/// until it is served or has tried `tries` times, each try in a transaction of its own as the
/// cluster reconciler makes them; what it was served.
async fn allocator(store: Store, t: TenantId, c: ClusterId, need: Need, start: Arc<Barrier>) -> Vec<MachineId> {
    start.wait().await;
    for _ in 0..6 {
        // A short head timeout, so that the line moves within the test.
        if let Allocation::Allocated(machines) =
            allocate_within(&store, t, c, std::slice::from_ref(&need), Duration::from_millis(1)).await
        {
            return machines;
        }
        tokio::task::yield_now().await;
    }
    Vec::new()
}

#[tokio::test]
async fn concurrent_allocators_share_no_machine_and_pass_no_quota() {
    let (_db, store) = db().await;
    let (cpu, gpu) = (class(&store, "cpu", 0).await, class(&store, "gpu", 2).await);
    for _ in 0..10 {
        machine(&store, cpu).await;
        machine(&store, gpu).await;
    }
    // Eight tenants, most with quotas below what their clusters ask for together; each has two
    // clusters of each class asking for two machines: 64 machines asked of 20, every try of each
    // cluster at once with all the others.
    let quotas = [(Some(3), None), (Some(2), Some(4)), (None, Some(2)), (Some(4), Some(4)), (None, None)];
    let mut tenants = Vec::new();
    let mut tasks = Vec::new();
    let start = Arc::new(Barrier::new(8 * 4));
    for k in 0..8 {
        let (max_nodes, max_gpus) = quotas[k % quotas.len()];
        let t = tenant(&store, max_nodes, max_gpus).await;
        tenants.push((t, max_nodes, max_gpus));
        for (class, gpus) in [(cpu, 0), (cpu, 0), (gpu, 2), (gpu, 2)] {
            let (c, need) = cluster(&store, t, class, gpus, 2).await;
            tasks.push((c, tokio::spawn(allocator(store.clone(), t, c, need, start.clone()))));
        }
    }
    let mut served: Vec<MachineId> = Vec::new();
    for (c, task) in tasks {
        let got = task.await.expect("an allocator failed");
        // All or nothing: what a cluster got is all it asked for, and all it holds.
        assert!(got.is_empty() || got.len() == 2, "cluster {c} got {got:?}");
        let holds = "select count(*) from machines where cluster_id = $1 and state = 'allocated'";
        assert_eq!(count(&store, holds, c.uuid()).await, got.len() as i64, "cluster {c}");
        served.extend(got);
    }
    assert!(!served.is_empty(), "no allocator was ever served");
    // No machine served twice, none allocated twice.
    let mut unique = served.clone();
    unique.sort_by_key(|m| m.uuid());
    unique.dedup();
    assert_eq!(unique.len(), served.len(), "a machine was served to two clusters");
    for m in &served {
        assert_eq!(count(&store, LIVE_ALLOCATIONS, m.uuid()).await, 1, "machine {m}");
    }
    // No tenant above its quotas.
    for (t, max_nodes, max_gpus) in tenants {
        let (nodes, gpus): (i64, i64) = sqlx::query_as(
            "select count(*), coalesce(sum(c.gpu_count), 0)::bigint from machines m \
             join machine_classes c on c.id = m.machine_class_id where m.tenant_id = $1 and m.state = 'allocated'",
        )
        .bind(t.uuid())
        .fetch_one(store.pool())
        .await
        .expect("held");
        assert!(max_nodes.is_none_or(|n| nodes <= i64::from(n)), "tenant {t} holds {nodes} nodes over {max_nodes:?}");
        assert!(max_gpus.is_none_or(|g| gpus <= i64::from(g)), "tenant {t} holds {gpus} GPUs over {max_gpus:?}");
    }
}
