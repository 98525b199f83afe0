//! The tenant's people written into a cluster's Slurm accounting ([`SlurmDriver::sync_identity`])
//! by the production driver and probe through the API server's service proxy, against the
//! slurmrestd STAND-IN of the real-operator tests ([`restd`]), which answers v0.0.42's `slurmdb`
//! endpoints as slurmdbd keeps its records. It listens on a free port of this host's routable
//! address here (the real-operator tests hold port 6820). No real slurmdbd runs here: the proof
//! against real Slurm comes with the real-Slurm test path.

use base64::Engine;
use paddock_domain::slurm_identity::{desired, GroupMembers};
use paddock_kube::slurm;
use paddock_kube::SlinkyDriver;
use paddock_testkit::skip;
use paddock_types::cluster::{SlurmAccount, SlurmAccountLimits};
use serde_json::json;

use crate::played::operator::routable_ip;
use crate::played::restd;
use crate::slurm::{access, desired as slurm_desired, pool, secrets, server, settings, unique, version};
use crate::slurm_probe::{play_restapi, NO_ROUTABLE_ADDRESS};

fn ml(members: &[(&str, bool)]) -> paddock_domain::slurm_identity::Slurmdb {
    let limits = SlurmAccountLimits { max_jobs: Some(5), gpu_minutes: Some(6000) };
    let spec = SlurmAccount { group: "ML".into(), account: Some("ml".into()), fairshare: 10, limits };
    let members = members.iter().map(|(u, a)| ((*u).to_owned(), *a)).collect();
    desired(&[spec], &[GroupMembers { display_name: "ML".into(), members }])
}

#[tokio::test]
async fn users_accounts_qos_and_associations_are_written_through_slurmdb_and_drift_is_restored() {
    let Some(ip) = skip::require(routable_ip(), NO_ROUTABLE_ADDRESS) else { return };
    let Some(server) = server().await else { return };
    let client = server.client().await;
    let tenant = access(&server);
    let ns = unique("slurm");
    let secrets = secrets();
    // The production driver writes the JWT key Secret the probe reads.
    let driver = SlinkyDriver::with_service_proxy(settings(&ns));
    driver
        .ensure_slurm(&tenant, &slurm_desired(vec![pool(&unique("cpu"), 1, 0, Vec::new())], &secrets))
        .await
        .expect("ensure");
    let key = base64::engine::general_purpose::STANDARD.decode(secrets.jwt_hs256_key.expose()).expect("b64");
    let restd = restd::StandInRestd::new(key);
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.expect("bind the stand-in");
    let port = listener.local_addr().expect("addr").port();
    let _serving = restd.clone().serve_on(listener);
    play_restapi(&client, &ns, ip, port).await;
    let cluster = slurm::cluster_name(tenant.cluster.cluster_id);

    let written =
        driver.sync_identity(&tenant, &version(), &ml(&[("alice", true), ("bob", true)])).await.expect("sync");
    assert_eq!(written.len(), 7, "{written:?}");
    let db = restd.accounting();
    let pairs: Vec<(String, String)> = db.associations.keys().cloned().collect();
    let pair = |a: &str, u: &str| (a.to_owned(), u.to_owned());
    assert_eq!(pairs, [pair("ml", ""), pair("ml", "alice"), pair("ml", "bob")]);
    let own = &db.associations[&pair("ml", "")];
    assert_eq!((own["shares_raw"].as_u64(), own["cluster"].as_str()), (Some(10), Some(cluster.as_str())), "{own}");
    assert_eq!(db.associations[&pair("ml", "alice")]["default"]["qos"], "paddock-ml");
    let qos = &db.qos["paddock-ml"]["limits"]["max"];
    assert_eq!(qos["active_jobs"]["count"]["number"], 5, "{qos}");
    assert_eq!(qos["tres"]["minutes"]["total"], json!([{ "type": "gres", "name": "gpu", "count": 6000 }]));
    assert_eq!(db.users["bob"]["default"]["account"], "ml");
    // Read back as written: a second sync writes nothing.
    let again = driver.sync_identity(&tenant, &version(), &ml(&[("alice", true), ("bob", true)])).await.expect("again");
    assert!(again.is_empty(), "{again:?}");

    // Behind paddock's back: alice's association goes, mallory joins paddock's account.
    restd.set_association("ml", "alice", None);
    let mallory = json!({ "account": "ml", "user": "mallory", "cluster": cluster, "shares_raw": 1 });
    restd.set_association("ml", "mallory", Some(mallory));
    let restored =
        driver.sync_identity(&tenant, &version(), &ml(&[("alice", true), ("bob", true)])).await.expect("fix");
    assert_eq!(restored.len(), 2, "{restored:?}");
    let pairs: Vec<(String, String)> = restd.accounting().associations.keys().cloned().collect();
    assert_eq!(pairs, [pair("ml", ""), pair("ml", "alice"), pair("ml", "bob")]);

    // bob is deactivated: his user and association go.
    driver.sync_identity(&tenant, &version(), &ml(&[("alice", true), ("bob", false)])).await.expect("deactivated");
    let db = restd.accounting();
    assert!(!db.users.contains_key("bob") && !db.associations.contains_key(&pair("ml", "bob")), "{db:?}");

    let seen = restd.seen();
    for request in [
        "GET /slurmdb/v0.0.42/qos/",
        "GET /slurmdb/v0.0.42/associations/",
        "POST /slurmdb/v0.0.42/qos/",
        "POST /slurmdb/v0.0.42/accounts/",
        "POST /slurmdb/v0.0.42/users/",
        "POST /slurmdb/v0.0.42/associations/",
        "DELETE /slurmdb/v0.0.42/user/mallory",
        "DELETE /slurmdb/v0.0.42/user/bob",
    ] {
        assert!(seen.contains(request), "{request} not among {seen:?}");
    }
    assert_eq!(restd.denied(), 0);
}
