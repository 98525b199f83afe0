//! Allocation under concurrency (docs/architecture.md): many clusters asking at once for the same
//! few machines through `paddock_store::allocation::allocate`, each in its own transaction, as the
//! cluster reconcilers of several workers would. No machine is ever handed to two clusters, every
//! cluster gets all it asked for or nothing, those left without machines wait in line, and the
//! earliest waiting cluster is served first when machines free up.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use paddock_store::allocation::{self, Allocation, Need};
use paddock_store::Store;
use paddock_testkit::{admin, TestApp};
use paddock_types::{ClusterId, MachineClassId, MachineId, NodePoolId, TenantId};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use crate::common::{id, machine, machine_class, set_machine_state, tenant};

const MACHINES: usize = 6;
const CLUSTERS: usize = 20;

/// The allocation head timeout (`PADDOCK_ALLOCATION_HEAD_TIMEOUT`) at its default.
const HEAD: Duration = Duration::from_secs(600);

/// One cluster asking for machines: its ids and what its one pool needs.
#[derive(Debug, Clone)]
struct Asker {
    tenant: TenantId,
    cluster: ClusterId,
    need: Need,
}

/// `MACHINES` available machines of class `cpu` and `CLUSTERS` clusters (each of its own tenant),
/// each with one `cpu` pool wanting 1 or 2 machines.
async fn world(app: &TestApp) -> (Vec<String>, Vec<Asker>) {
    let class = machine_class(app, "cpu", 0).await;
    let class_id = MachineClassId(Uuid::parse_str(&id(&class)).expect("uuid"));
    let mut machines = Vec::new();
    for i in 0..MACHINES {
        let m = machine(app, &format!("node-{i}"), "cpu").await;
        set_machine_state(app, &id(&m), "available").await;
        machines.push(id(&m));
    }
    let mut askers = Vec::new();
    for i in 0..CLUSTERS {
        let t = id(&tenant(app, &format!("tenant-{i}")).await);
        let count = 1 + (i % 2) as u32;
        let body = json!({
            "name": format!("c{i}"), "kind": "kubernetes", "isolation": "private-nodes",
            "node_pools": [{ "name": "p", "machine_class": "cpu", "count": count }],
        });
        app.post(format!("/v1/tenants/{t}/clusters")).token(&admin()).json(&body).send().await.expect(202);
        let (cluster, pool): (Uuid, Uuid) = sqlx::query_as(
            "select c.id, p.id from clusters c join node_pools p on p.cluster_id = c.id where c.tenant_id = $1::uuid",
        )
        .bind(&t)
        .fetch_one(&app.db.pool)
        .await
        .expect("cluster and pool");
        askers.push(Asker {
            tenant: TenantId(Uuid::parse_str(&t).expect("uuid")),
            cluster: ClusterId(cluster),
            need: Need { node_pool_id: NodePoolId(pool), machine_class_id: class_id, gpu_count: 0, count },
        });
    }
    (machines, askers)
}

/// A store with a pool of its own, wide enough that every asker holds a connection at once.
async fn wide_store(app: &TestApp) -> Store {
    let pool = PgPoolOptions::new().max_connections(CLUSTERS as u32 + 4).connect(&app.db.url).await.expect("connect");
    Store::from_pool(pool)
}

/// `allocate` for one asker in its own transaction, committed whatever the outcome (the waiting
/// mark is the only write of a refusal).
async fn allocate(store: &Store, a: &Asker) -> Allocation {
    let mut tx = store.begin().await.expect("begin");
    let outcome = allocation::allocate(
        &mut tx,
        &paddock_testkit::ledger_key(),
        a.tenant,
        a.cluster,
        std::slice::from_ref(&a.need),
        HEAD,
    )
    .await
    .expect("allocate");
    tx.commit().await.expect("commit");
    outcome
}

/// Every asker at once (a barrier releases them together).
async fn allocate_all(store: &Store, askers: &[Asker]) -> Vec<(Asker, Allocation)> {
    let barrier = Arc::new(tokio::sync::Barrier::new(askers.len()));
    let tasks: Vec<_> = askers
        .iter()
        .cloned()
        .map(|a| {
            let (store, barrier) = (store.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let outcome = allocate(&store, &a).await;
                (a, outcome)
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("allocation task"));
    }
    results
}

/// The machines each cluster holds, from the machines' own rows.
async fn held(app: &TestApp) -> HashMap<Uuid, Vec<Uuid>> {
    let rows: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "select cluster_id, id from machines where cluster_id is not null and state = 'allocated' order by id",
    )
    .fetch_all(&app.db.pool)
    .await
    .expect("held machines");
    let mut by_cluster: HashMap<Uuid, Vec<Uuid>> = HashMap::new();
    for (cluster, machine) in rows {
        by_cluster.entry(cluster).or_default().push(machine);
    }
    by_cluster
}

async fn waiting_since(app: &TestApp, cluster: ClusterId) -> Option<chrono::DateTime<chrono::Utc>> {
    sqlx::query_scalar("select waiting_since from clusters where id = $1")
        .bind(cluster.uuid())
        .fetch_one(&app.db.pool)
        .await
        .expect("cluster")
}

/// The invariants after any round of allocations.
async fn check_invariants(app: &TestApp, askers: &[Asker], when: &str) {
    // At most one live allocation per machine, and each matches the machine's own holder.
    let doubled: i64 = sqlx::query_scalar(
        "select count(*) from (select machine_id from machine_allocations where released_at is null \
         group by machine_id having count(*) > 1) d",
    )
    .fetch_one(&app.db.pool)
    .await
    .expect("doubled");
    assert_eq!(doubled, 0, "{when}: a machine is in two live allocations");
    let mismatched: i64 = sqlx::query_scalar(
        "select count(*) from machine_allocations a join machines m on m.id = a.machine_id \
         where a.released_at is null and (m.allocation_id is distinct from a.id or m.cluster_id <> a.cluster_id)",
    )
    .fetch_one(&app.db.pool)
    .await
    .expect("mismatched");
    assert_eq!(mismatched, 0, "a live allocation disagrees with its machine");
    // Every allocation consumed a clean of its own.
    let reused: i64 = sqlx::query_scalar(
        "select count(*) from (select clean_id from machine_allocations group by clean_id having count(*) > 1) d",
    )
    .fetch_one(&app.db.pool)
    .await
    .expect("cleans");
    assert_eq!(reused, 0, "a clean was consumed twice");
    // All or nothing per cluster; those without machines wait, those with none do not.
    let held = held(app).await;
    assert!(held.values().map(Vec::len).sum::<usize>() <= MACHINES);
    for a in askers {
        let n = held.get(&a.cluster.uuid()).map_or(0, Vec::len);
        assert!(n == 0 || n == a.need.count as usize, "{when}: cluster {} holds {n} of {}", a.cluster, a.need.count);
        let waiting = waiting_since(app, a.cluster).await;
        if n == 0 {
            assert!(waiting.is_some(), "{when}: cluster {} got nothing but does not wait", a.cluster);
        } else {
            assert!(waiting.is_none(), "{when}: cluster {} got its machines but still waits", a.cluster);
        }
    }
}

#[tokio::test]
async fn concurrent_allocations_never_hand_a_machine_to_two_clusters() {
    let app = TestApp::new().await;
    let (machines, askers) = world(&app).await;
    let store = wide_store(&app).await;

    let results = allocate_all(&store, &askers).await;
    let mut given: HashSet<MachineId> = HashSet::new();
    let mut served = 0;
    for (a, outcome) in &results {
        match outcome {
            Allocation::Allocated(ids) => {
                assert_eq!(ids.len(), a.need.count as usize, "all or nothing: {outcome:?}");
                for m in ids {
                    assert!(given.insert(*m), "machine {m} was handed out twice");
                }
                served += 1;
            }
            Allocation::Short { needed, available, .. } => {
                assert_eq!(*needed, a.need.count);
                assert!(*available < *needed, "{outcome:?}");
            }
            Allocation::Behind { cluster_id, .. } => assert_ne!(*cluster_id, a.cluster),
            Allocation::OverQuota { .. } => panic!("no quota is set: {outcome:?}"),
        }
    }
    assert!(given.len() <= MACHINES);
    assert!(served >= 3, "six machines serve at least three clusters of at most two: {results:?}");
    assert!(served < CLUSTERS, "thirty wanted, six available: somebody waits");
    check_invariants(&app, &askers, "first round").await;
    // What the outcomes say is what the rows say.
    let holders = held(&app).await;
    for (a, outcome) in &results {
        let mut rows = holders.get(&a.cluster.uuid()).cloned().unwrap_or_default();
        rows.sort();
        let mut said: Vec<Uuid> = match outcome {
            Allocation::Allocated(ids) => ids.iter().map(|m| m.uuid()).collect(),
            _ => Vec::new(),
        };
        said.sort();
        assert_eq!(rows, said, "cluster {}", a.cluster);
    }
    // Whatever was not handed out is still available.
    let available: i64 = sqlx::query_scalar("select count(*) from machines where state = 'available'")
        .fetch_one(&app.db.pool)
        .await
        .expect("available");
    assert_eq!(available as usize, machines.len() - given.len());

    // Again, all at once: nobody gets more, nobody loses anything, the line keeps its order.
    // (Like the cluster reconciler, only clusters still short ask: a served pool needs nothing.)
    let line_before = line(&app).await;
    let unserved: Vec<Asker> =
        results.iter().filter(|(_, o)| !matches!(o, Allocation::Allocated(_))).map(|(a, _)| a.clone()).collect();
    let again = allocate_all(&store, &unserved).await;
    for (a, outcome) in &again {
        if let Allocation::Allocated(ids) = outcome {
            // Only possible for a cluster whose pool is still short, with machines left over.
            assert!(!results.iter().any(|(b, o)| b.cluster == a.cluster && matches!(o, Allocation::Allocated(_))));
            assert!(ids.iter().all(|m| !given.contains(m)), "a held machine was handed out again");
        }
    }
    check_invariants(&app, &askers, "second round").await;
    let line_after = line(&app).await;
    assert!(
        line_after.iter().all(|c| line_before.contains(c)),
        "nobody joins the line by asking again: {line_before:?} -> {line_after:?}"
    );

    // First come, first served: free as many machines as the head of the line needs; asking in
    // reverse order of arrival, everyone else is behind it, and it gets them.
    let head = *line_after.first().expect("somebody waits");
    let head_asker = askers.iter().find(|a| a.cluster == head).expect("head asker").clone();
    // The machines come from clusters that scale down (their pools want what they keep).
    let held_now = held(&app).await;
    let mut freed = Vec::new();
    let mut shrunk = Vec::new();
    for (cluster, machines) in &held_now {
        if freed.len() >= head_asker.need.count as usize {
            break;
        }
        let take = machines.len().min(head_asker.need.count as usize - freed.len());
        for m in &machines[..take] {
            // The release ends in cleaning, and a verified clean makes it available again.
            set_machine_state(&app, &m.to_string(), "cleaning").await;
            set_machine_state(&app, &m.to_string(), "available").await;
            freed.push(*m);
        }
        sqlx::query("update node_pools set count = $2 where cluster_id = $1")
            .bind(cluster)
            .bind((machines.len() - take) as i32)
            .execute(&app.db.pool)
            .await
            .expect("scale down");
        shrunk.push(ClusterId(*cluster));
    }
    assert_eq!(freed.len(), head_asker.need.count as usize);
    let mut others: Vec<Asker> =
        line_after.iter().skip(1).map(|c| askers.iter().find(|a| a.cluster == *c).expect("asker").clone()).collect();
    others.reverse();
    for a in &others {
        match allocate(&store, a).await {
            Allocation::Behind { cluster_id, .. } => assert_eq!(cluster_id, head, "the head of the line goes first"),
            other => panic!("cluster {} jumped the line: {other:?}", a.cluster),
        }
    }
    match allocate(&store, &head_asker).await {
        Allocation::Allocated(ids) => {
            let got: HashSet<Uuid> = ids.iter().map(|m| m.uuid()).collect();
            assert_eq!(got, freed.iter().copied().collect(), "the head gets the freed machines");
        }
        other => panic!("the head of the line was not served: {other:?}"),
    }
    assert_eq!(waiting_since(&app, head).await, None);
    let unchanged: Vec<Asker> = askers.iter().filter(|a| !shrunk.contains(&a.cluster)).cloned().collect();
    check_invariants(&app, &unchanged, "after the head was served").await;
    // The next in line is now the head.
    let line_last = line(&app).await;
    assert_eq!(line_last, line_after[1..].to_vec());
}

/// The waiting clusters, first come first.
async fn line(app: &TestApp) -> Vec<ClusterId> {
    let ids: Vec<Uuid> =
        sqlx::query_scalar("select id from clusters where waiting_since is not null order by waiting_since, id")
            .fetch_all(&app.db.pool)
            .await
            .expect("line");
    ids.into_iter().map(ClusterId).collect()
}

/// A cluster its tenant's quota keeps from being served (the quota was lowered after the pool was
/// made) must not hold up the line for everyone else: it cannot be served whatever frees up.
#[tokio::test]
async fn an_over_quota_cluster_does_not_hold_up_the_line() {
    let app = TestApp::new().await;
    let (_, askers) = world(&app).await;
    let store = wide_store(&app).await;
    let (first, second) = (&askers[1], &askers[2]);
    assert_eq!(first.need.count, 2);
    // The provider lowers the tenant's quota below what its pool wants (the API allows it).
    app.patch(format!("/v1/tenants/{}", first.tenant))
        .token(&admin())
        .json(&json!({ "quotas": { "max_nodes": 1 } }))
        .send()
        .await
        .expect(200);
    match allocate(&store, first).await {
        Allocation::OverQuota { quota: "max_nodes", limit: 1, would_hold: 2 } => {}
        other => panic!("expected the quota to refuse: {other:?}"),
    }
    // Six machines sit idle; the next cluster (another tenant, within its quota) asks for one.
    match allocate(&store, second).await {
        Allocation::Allocated(ids) => assert_eq!(ids.len(), 1),
        other => panic!("served behind a cluster that cannot be served: {other:?}"),
    }
}
