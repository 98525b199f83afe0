//! The tenant's people written into a cluster's Slurm accounting ([`SlurmDriver::sync_identity`])
//! by the production driver and probe through the API server's service proxy, against a REAL
//! slurmrestd, slurmdbd and MariaDB (`paddock_testkit::slurm_host` with accounting: Slurm
//! 26.05.5 and MariaDB 10.11 from the roots `scripts/slurm-host` builds), the slurmrestd on this
//! host's routable address behind the cluster's RestApi Service. What Slurm holds is read back with
//! `sacctmgr`, as the tenant's admins read it.

use paddock_domain::slurm_identity::{desired, GroupMembers};
use paddock_kube::slurm::{self, objects};
use paddock_testkit::slurm_host::{self, Options, SlurmHost};
use paddock_types::cluster::{SlurmAccount, SlurmAccountLimits, SlurmSpec};

use crate::slurm::{pool, unique, version};
use crate::slurm_rest::RestCluster;

/// `slurm.accounts` mapping the group ML to account `ml` (fair-share 10, at most 5 jobs and 6000
/// GPU minutes).
fn ml_account() -> SlurmAccount {
    let limits = SlurmAccountLimits { max_jobs: Some(5), gpu_minutes: Some(6000) };
    SlurmAccount { group: "ML".into(), account: Some("ml".into()), fairshare: 10, limits }
}

/// What [`ml_account`] asks for with ML's `members` (`userName`, active).
fn ml(members: &[(&str, bool)]) -> paddock_domain::slurm_identity::Slurmdb {
    let members = members.iter().map(|(u, a)| ((*u).to_owned(), *a)).collect();
    desired(&[ml_account()], &[GroupMembers { display_name: "ML".into(), members }])
}

/// `sacctmgr -nP <args>`: its rows, fields split.
fn sacctmgr(slurm: &SlurmHost, args: &[&str]) -> Vec<Vec<String>> {
    let mut all = vec!["sacctmgr", "-nP"];
    all.extend_from_slice(args);
    let out = slurm.run(&all);
    assert!(out.status.success(), "sacctmgr {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| l.split('|').map(str::to_owned).collect()).collect()
}

/// A change made as the tenant's admin (`sacctmgr -i <args>`).
fn admin(slurm: &SlurmHost, args: &[&str]) {
    let mut all = vec!["sacctmgr", "-i"];
    all.extend_from_slice(args);
    let out = slurm.run(&all);
    assert!(
        out.status.success(),
        "sacctmgr {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The cluster's associations: account, user, raw shares, QOS, default QOS.
fn associations(slurm: &SlurmHost, cluster: &str) -> Vec<[String; 5]> {
    let rows =
        sacctmgr(slurm, &["show", "assoc", &format!("cluster={cluster}"), "format=account,user,share,qos,defaultqos"]);
    let mut rows: Vec<[String; 5]> =
        rows.into_iter().map(|r| [r[0].clone(), r[1].clone(), r[2].clone(), r[3].clone(), r[4].clone()]).collect();
    rows.sort();
    rows
}

/// The (account, user) pairs of the cluster's associations.
fn pairs(slurm: &SlurmHost, cluster: &str) -> Vec<(String, String)> {
    associations(slurm, cluster).into_iter().map(|[a, u, ..]| (a, u)).collect()
}

fn pair(account: &str, user: &str) -> (String, String) {
    (account.to_owned(), user.to_owned())
}

/// The names in the first column of `sacctmgr show <what>`.
fn names(slurm: &SlurmHost, what: &str, format: &str) -> Vec<String> {
    let mut names: Vec<String> =
        sacctmgr(slurm, &["show", what, &format!("format={format}")]).into_iter().map(|r| r[0].clone()).collect();
    names.sort();
    names
}

/// A cluster's real Slurm with accounting (slurmctld, slurmrestd behind the cluster's RestApi
/// Service, slurmdbd, MariaDB) under paddock's slurm.conf for [`ml_account`], and the production
/// driver that syncs into it.
struct Accounted {
    slurm: SlurmHost,
    rest: RestCluster,
    /// The Slurm cluster's name.
    cluster: String,
}

impl Accounted {
    async fn start() -> Option<Self> {
        let root = slurm_host::root_with_accounting()?;
        let rest = RestCluster::new(vec![pool(&unique("cpu"), 1, 0, Vec::new())]).await?;
        let cluster = slurm::cluster_name(rest.tenant.cluster.cluster_id);
        let options = Options { cluster: Some(cluster.clone()), jwt_key: Some(rest.jwt_key()), accounting: true };
        // slurm.conf as paddock's Controller has it for a spec with that mapping, and one node
        // that never registers: accepted jobs wait.
        let spec = SlurmSpec { accounts: vec![ml_account()], ..SlurmSpec::default() };
        let extra = objects::controller_extra_conf(&spec, &[]);
        let conf = format!("{extra}\nNodeName=cpu-0 State=FUTURE CPUs=1\nPartitionName=all Nodes=cpu-0 Default=YES");
        let mut slurm = SlurmHost::start_with(&root, &conf, &options);
        // slurmctld registers its cluster with slurmdbd at its start (with Slurm's `root` account).
        slurm.wait("slurmctld to register the cluster", |s| {
            names(s, "cluster", "cluster").contains(&cluster).then_some(())
        });
        let port = slurm.start_slurmrestd_on(rest.ip);
        rest.route_to(port).await;
        Some(Accounted { slurm, rest, cluster })
    }

    /// Syncs ML with `members`: what was written.
    async fn sync(&self, members: &[(&str, bool)]) -> Vec<String> {
        self.sync_to(&ml(members)).await
    }

    async fn sync_to(&self, want: &paddock_domain::slurm_identity::Slurmdb) -> Vec<String> {
        self.rest.driver.sync_identity(&self.rest.tenant, &version(), want).await.expect("sync")
    }

    /// The tenant's admins' own (`sacctmgr`): an account `lab` with a user `dave`, and a QOS.
    fn admins_own(&self) {
        let cluster = format!("cluster={}", self.cluster);
        admin(&self.slurm, &["add", "account", "lab", "description=the lab's own", "organization=lab", &cluster]);
        admin(&self.slurm, &["add", "user", "dave", "account=lab", &cluster]);
        admin(&self.slurm, &["add", "qos", "lab-qos", "description=the lab's"]);
    }

    /// Cancels `user`'s jobs and waits until they have ended.
    fn cancel(&self, user: &str) {
        let out = self.slurm.run(&["scancel", "-u", user]);
        assert!(out.status.success(), "scancel: {}", String::from_utf8_lossy(&out.stderr));
        self.slurm.wait(&format!("{user}'s jobs to end"), |s| {
            let out = s.run(&["squeue", "-h", "-u", user]);
            String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
        });
    }
}

/// Accounts, QOS (with its GPU minutes), users and associations are created in slurmdbd as
/// `slurm.accounts` maps the tenant's groups; a second sync writes nothing; drift behind paddock's
/// back (a member's association deleted, strangers added to paddock's account, the account's
/// fair-share and the QOS's limit changed) is restored in one sync; what the tenant's admins made
/// outside paddock's accounts (their account, user, QOS, Slurm's `root`) is left alone, also when
/// the mapping goes and paddock removes its own.
#[tokio::test]
async fn the_tenants_people_are_written_into_a_real_slurmdbd_and_drift_is_restored() {
    let Some(lab) = Accounted::start().await else { return };
    let (slurm, cluster) = (&lab.slurm, lab.cluster.as_str());
    lab.admins_own();
    let theirs = associations(slurm, cluster);

    let written = lab.sync(&[("alice", true), ("bob", true)]).await;
    assert_eq!(written.len(), 7, "{written:?}");
    let all = associations(slurm, cluster);
    let row = |a: &str, u: &str| all.iter().find(|r| r[0] == a && r[1] == u).cloned();
    let own = row("ml", "").expect("the account's own association");
    assert_eq!((own[2].as_str(), own[3].as_str()), ("10", "paddock-ml"), "{own:?}");
    for user in ["alice", "bob"] {
        let r = row("ml", user).unwrap_or_else(|| panic!("{user}'s association in ml: {all:?}"));
        assert_eq!((r[3].as_str(), r[4].as_str()), ("paddock-ml", "paddock-ml"), "{r:?}");
    }
    let qos = sacctmgr(slurm, &["show", "qos", "paddock-ml", "format=name,grpjobs,grptresmins"]);
    assert_eq!(qos, [["paddock-ml", "5", "gres/gpu=6000"]], "{qos:?}");
    let users = sacctmgr(slurm, &["show", "user", "format=user,defaultaccount"]);
    for user in ["alice", "bob"] {
        assert!(users.contains(&vec![user.to_owned(), "ml".to_owned()]), "{user} with default account ml: {users:?}");
    }
    // Read back as written: a second sync writes nothing.
    let again = lab.sync(&[("alice", true), ("bob", true)]).await;
    assert!(again.is_empty(), "a sync at rest wrote {again:?}");

    // Behind paddock's back: alice's association goes, mallory and dave join paddock's account,
    // the account gets another fair-share and its QOS another limit.
    admin(slurm, &["delete", "user", "alice"]);
    admin(slurm, &["add", "user", "mallory", "account=ml", &format!("cluster={cluster}")]);
    admin(slurm, &["add", "user", "dave", "account=ml", &format!("cluster={cluster}")]);
    admin(slurm, &["modify", "qos", "paddock-ml", "set", "GrpJobs=99"]);
    admin(slurm, &["modify", "account", "ml", "set", "fairshare=3"]);
    assert!(!lab.sync(&[("alice", true), ("bob", true)]).await.is_empty());
    assert!(lab.sync(&[("alice", true), ("bob", true)]).await.is_empty(), "restored in one sync");
    let mut want: Vec<(String, String)> = theirs.iter().map(|[a, u, ..]| (a.clone(), u.clone())).collect();
    want.extend([pair("ml", ""), pair("ml", "alice"), pair("ml", "bob")]);
    want.sort();
    assert_eq!(pairs(slurm, cluster), want);
    assert_eq!(sacctmgr(slurm, &["show", "qos", "paddock-ml", "format=name,grpjobs"]), [["paddock-ml", "5"]]);
    let own = associations(slurm, cluster).into_iter().find(|r| r[0] == "ml" && r[1].is_empty());
    assert_eq!(own.map(|r| r[2].clone()).as_deref(), Some("10"), "the account's fair-share is restored");
    assert!(!names(slurm, "user", "user").contains(&"mallory".to_owned()), "mallory is paddock's to remove");

    // The mapping goes: paddock's account, QOS and users go; the tenant's admins' own stay.
    assert!(!lab.sync_to(&desired(&[], &[])).await.is_empty());
    assert_eq!(associations(slurm, cluster), theirs, "only the tenant's own associations are left");
    let qos = names(slurm, "qos", "name");
    assert!(qos.contains(&"lab-qos".to_owned()) && !qos.contains(&"paddock-ml".to_owned()), "{qos:?}");
    assert!(!names(slurm, "account", "account").contains(&"ml".to_owned()));
}

/// A member deactivated while a job of theirs waits is locked out (slurmdbd keeps the
/// association of an active job): no new job, the job left alone; active again, they are
/// unlocked; deactivated again once their jobs have ended, their user and association go and,
/// with paddock's slurm.conf (accounting enforced), they can submit no job at all, as no one
/// outside the mapped groups can; the members still can, and so can the admins' own users.
#[tokio::test]
async fn a_removed_member_is_locked_out_while_their_jobs_run_and_then_removed() {
    let Some(lab) = Accounted::start().await else { return };
    let (slurm, cluster) = (&lab.slurm, lab.cluster.as_str());
    lab.admins_own();
    lab.sync(&[("alice", true), ("bob", true)]).await;
    let job = submit(slurm, "bob", "ml").expect("bob submits in ml");

    let locked = lab.sync(&[("alice", true), ("bob", false)]).await;
    assert_eq!(locked, ["Slurm user bob (removed): locked out until their active jobs end"]);
    assert!(lab.sync(&[("alice", true), ("bob", false)]).await.is_empty(), "locked once");
    let refused = submit(slurm, "bob", "ml").expect_err("a locked-out bob submits");
    assert!(refused.contains("Job violates accounting/QOS policy"), "{refused}");
    assert!(pairs(slurm, cluster).contains(&pair("ml", "bob")), "the association of bob's job stays");
    let out = slurm.run(&["squeue", "-h", "-j", &job, "-o", "%u %T"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "bob PENDING", "bob's job is left alone");

    lab.sync(&[("alice", true), ("bob", true)]).await;
    submit(slurm, "bob", "ml").expect("bob, active again, submits");
    lab.cancel("bob");
    let removed = lab.sync(&[("alice", true), ("bob", false)]).await;
    assert_eq!(removed, ["Slurm user bob (removed)"]);
    assert!(!pairs(slurm, cluster).contains(&pair("ml", "bob")));
    assert!(!names(slurm, "user", "user").contains(&"bob".to_owned()), "bob's user is removed");
    for (user, account) in [("bob", "ml"), ("bob", "lab"), ("carol", "ml")] {
        let refused = submit(slurm, user, account).expect_err(&format!("{user} submits in {account}"));
        assert!(refused.contains("Invalid account"), "{user} in {account}: {refused}");
    }
    submit(slurm, "alice", "ml").expect("alice submits in ml");
    submit(slurm, "dave", "lab").expect("dave submits in lab");
}

/// With `cancel_jobs_on_removal`, a member deactivated while a job of theirs waits has the job
/// cancelled, and is removed once it has ended.
#[tokio::test]
async fn a_removed_members_jobs_are_cancelled_when_the_cluster_asks() {
    let Some(lab) = Accounted::start().await else { return };
    let (slurm, cluster) = (&lab.slurm, lab.cluster.as_str());
    lab.sync(&[("alice", true), ("bob", true)]).await;
    let job = submit(slurm, "bob", "ml").expect("bob submits in ml");
    let mut without_bob = ml(&[("alice", true), ("bob", false)]);
    without_bob.cancel_jobs = true;
    let written = lab.sync_to(&without_bob).await;
    assert_eq!(
        written.first().map(String::as_str),
        Some("Slurm user bob (removed): their jobs cancelled"),
        "{written:?}"
    );
    slurm.wait("bob's job to end", |s| {
        let out = s.run(&["squeue", "-h", "-u", "bob"]);
        String::from_utf8_lossy(&out.stdout).trim().is_empty().then_some(())
    });
    let out = slurm.run(&["sacct", "-n", "-X", "-j", &job, "-o", "State"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "CANCELLED+", "bob's job was cancelled");
    // Removed by this sync or the next.
    lab.sync_to(&without_bob).await;
    assert!(!pairs(slurm, cluster).contains(&pair("ml", "bob")));
    let refused = submit(slurm, "bob", "ml").expect_err("a removed bob submits");
    assert!(refused.contains("Invalid account"), "{refused}");
}

/// `sbatch -A <account>` (held) as `user`, one of the Slurm root's people, with a JWT of theirs
/// (the key file of `auth/slurm` is Slurm's own): the job's id, or sbatch's refusal.
fn submit(slurm: &SlurmHost, user: &str, account: &str) -> Result<String, String> {
    let jwt = format!("SLURM_JWT={}", slurm.token(user));
    let as_user = format!("--reuid={user}");
    let group = format!("--regid={user}");
    let args =
        ["setpriv", &as_user, &group, "--clear-groups", "env", &jwt, "sbatch", "--parsable", "-H", "-A", account];
    let mut all = args.to_vec();
    all.extend_from_slice(&["-D", "/tmp", "--wrap", "hostname"]);
    let out = slurm.run(&all);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}
