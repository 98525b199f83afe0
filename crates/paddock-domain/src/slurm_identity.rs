//! A tenant's people in a `slurm` cluster's accounting (docs/tenants.md, "People in your Slurm"):
//! what `slurm.accounts` and the tenant's SCIM groups ask for ([`desired`]), and the changes that
//! bring what Slurm holds there ([`plan`]). Pure: the drivers read and write Slurm, this decides.
//!
//! What paddock owns in a cluster's Slurm, and so corrects or removes:
//! - the accounts whose description starts with [`OWNED`] (every account paddock writes has it),
//!   and every association under them (the account's own, with its fair-share, and its users');
//! - the QOS whose description starts with [`OWNED`] (one per account, `paddock-<account>`,
//!   carrying the account's limits);
//! - the users whose every association is under such an account: a user that is no longer wanted
//!   anywhere (deactivated, deleted, out of every mapped group) is removed with its associations,
//!   so it can submit no job. Slurm's own (`root`) and anything the tenant's admins made outside
//!   paddock's accounts are never touched.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use paddock_types::cluster::{IdentitySync, SlurmAccount};
use serde::{Deserialize, Serialize};

/// The start of the description of every account and QOS paddock writes: how it knows its own.
pub const OWNED: &str = "paddock: ";

/// The QOS carrying an account's limits.
pub fn qos_name(account: &str) -> String {
    format!("paddock-{account}")
}

/// A Slurm QOS, with the limits paddock sets (`None`: unlimited).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Jobs running at once (`GrpJobs`).
    pub max_jobs: Option<u32>,
    /// GPU minutes in all (`GrpTRESMins=gres/gpu`).
    pub gpu_minutes: Option<u64>,
}

/// A Slurm account.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
}

/// A Slurm user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// Login name.
    pub name: String,
    /// Its default account.
    pub default_account: String,
}

/// A Slurm association: an account's own (empty `user`) or a user's in an account.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Association {
    /// The account.
    pub account: String,
    /// The user; empty for the account's own association.
    pub user: String,
    /// Raw fair-share.
    pub shares: u32,
    /// The QOS it may use.
    pub qos: Vec<String>,
    /// Its default QOS.
    pub default_qos: Option<String>,
    /// No new job may be submitted in it (`MaxSubmitJobs=0`): how a user paddock removes stays
    /// locked out while jobs of theirs are still active, which slurmdbd will not remove the
    /// association under. paddock wants none locked: one it wants again is unlocked.
    #[serde(default)]
    pub locked: bool,
}

/// The accounting of one Slurm cluster: what paddock wants there, or what Slurm reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slurmdb {
    /// QOS.
    pub qos: Vec<Qos>,
    /// Accounts.
    pub accounts: Vec<Account>,
    /// Users.
    pub users: Vec<User>,
    /// Associations.
    pub associations: Vec<Association>,
    /// Wanted: the jobs of a user whose removal waits for them are cancelled
    /// (`cancel_jobs_on_removal`), not left to end.
    #[serde(default)]
    pub cancel_jobs: bool,
}

/// A mapped group as the sync reads it: its name and members (`userName`, active).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMembers {
    /// The group's `displayName`.
    pub display_name: String,
    /// Its members.
    pub members: Vec<(String, bool)>,
}

/// What `accounts` (a cluster's `slurm.accounts`) and the tenant's `groups` ask for: an account,
/// its QOS and its own association per mapped group; each active member a user with an
/// association in every account mapping one of its groups, the first its default. A mapped group
/// that no longer exists maps no one.
pub fn desired(accounts: &[SlurmAccount], groups: &[GroupMembers]) -> Slurmdb {
    let mut db = Slurmdb::default();
    let mut defaults: BTreeMap<String, String> = BTreeMap::new();
    for spec in accounts {
        let account = spec.account_name();
        let qos = qos_name(&account);
        let group = groups.iter().find(|g| g.display_name.to_lowercase() == spec.group.to_lowercase());
        db.qos.push(Qos {
            name: qos.clone(),
            description: format!("{OWNED}limits of account {account}"),
            max_jobs: spec.limits.max_jobs,
            gpu_minutes: spec.limits.gpu_minutes,
        });
        db.accounts.push(Account { name: account.clone(), description: format!("{OWNED}group {}", spec.group) });
        let association = |user: &str, shares: u32| Association {
            account: account.clone(),
            user: user.to_owned(),
            shares,
            qos: vec![qos.clone()],
            default_qos: Some(qos.clone()),
            locked: false,
        };
        db.associations.push(association("", spec.fairshare));
        for (user, _) in group.into_iter().flat_map(|g| g.members.iter()).filter(|(_, active)| *active) {
            defaults.entry(user.clone()).or_insert_with(|| account.clone());
            db.associations.push(association(user, 1));
        }
    }
    db.users = defaults.into_iter().map(|(name, default_account)| User { name, default_account }).collect();
    db
}

/// The counts of a desired accounting, for `status.identity`.
pub fn counts(db: &Slurmdb, synced_at: chrono::DateTime<chrono::Utc>) -> IdentitySync {
    let n = |len: usize| u32::try_from(len).unwrap_or(u32::MAX);
    IdentitySync {
        synced_at,
        users: n(db.users.len()),
        accounts: n(db.accounts.len()),
        associations: n(db.associations.iter().filter(|a| !a.user.is_empty()).count()),
    }
}

/// One write to a Slurm cluster's accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Creates or updates a QOS.
    Qos(Qos),
    /// Creates or updates an account.
    Account(Account),
    /// Creates or updates a user.
    User(User),
    /// Creates or updates an association.
    Association(Association),
    /// Removes a user's association with an account.
    RemoveAssociation {
        /// The account.
        account: String,
        /// The user.
        user: String,
    },
    /// Removes a user and its associations.
    RemoveUser(String),
    /// Removes an account and its associations.
    RemoveAccount(String),
    /// Removes a QOS.
    RemoveQos(String),
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Qos(q) => write!(f, "Slurm QOS {}", q.name),
            Change::Account(a) => write!(f, "Slurm account {}", a.name),
            Change::User(u) => write!(f, "Slurm user {}", u.name),
            Change::Association(a) if a.user.is_empty() => write!(f, "Slurm association of account {}", a.account),
            Change::Association(a) => write!(f, "Slurm association {} in account {}", a.user, a.account),
            Change::RemoveAssociation { account, user } => {
                write!(f, "Slurm association {user} in account {account} (removed)")
            }
            Change::RemoveUser(u) => write!(f, "Slurm user {u} (removed)"),
            Change::RemoveAccount(a) => write!(f, "Slurm account {a} (removed)"),
            Change::RemoveQos(q) => write!(f, "Slurm QOS {q} (removed)"),
        }
    }
}

/// The changes that make `observed` hold `desired` and nothing more of paddock's (see the module
/// documentation for what is paddock's), in an order Slurm accepts: QOS, accounts, users and
/// associations first; then removals, associations before users before accounts before QOS.
/// Empty when Slurm already holds it.
pub fn plan(desired: &Slurmdb, observed: &Slurmdb) -> Vec<Change> {
    let mut changes = Vec::new();
    for q in &desired.qos {
        if observed.qos.iter().find(|o| o.name == q.name) != Some(q) {
            changes.push(Change::Qos(q.clone()));
        }
    }
    for a in &desired.accounts {
        if observed.accounts.iter().find(|o| o.name == a.name) != Some(a) {
            changes.push(Change::Account(a.clone()));
        }
    }
    let key = |a: &Association| (a.account.clone(), a.user.clone());
    let seen: BTreeMap<(String, String), &Association> = observed.associations.iter().map(|a| (key(a), a)).collect();
    for a in desired.associations.iter().filter(|a| a.user.is_empty()) {
        if seen.get(&key(a)) != Some(&a) {
            changes.push(Change::Association(a.clone()));
        }
    }
    for u in &desired.users {
        if observed.users.iter().find(|o| o.name == u.name) != Some(u) {
            changes.push(Change::User(u.clone()));
        }
    }
    for a in desired.associations.iter().filter(|a| !a.user.is_empty()) {
        if seen.get(&key(a)) != Some(&a) {
            changes.push(Change::Association(a.clone()));
        }
    }
    changes.extend(removals(desired, observed));
    changes
}

/// What of paddock's Slurm holds that `desired` no longer wants.
fn removals(desired: &Slurmdb, observed: &Slurmdb) -> Vec<Change> {
    let wanted_accounts: BTreeSet<&str> = desired.accounts.iter().map(|a| a.name.as_str()).collect();
    let owned: BTreeSet<&str> = observed
        .accounts
        .iter()
        .filter(|a| a.description.starts_with(OWNED))
        .map(|a| a.name.as_str())
        .chain(wanted_accounts.iter().copied())
        .collect();
    let wanted_users: BTreeSet<&str> = desired.users.iter().map(|u| u.name.as_str()).collect();
    let wanted: BTreeSet<(&str, &str)> =
        desired.associations.iter().map(|a| (a.account.as_str(), a.user.as_str())).collect();
    // A user all of whose associations are in paddock's accounts is paddock's.
    let mut users: BTreeMap<&str, bool> = BTreeMap::new();
    for a in observed.associations.iter().filter(|a| !a.user.is_empty()) {
        *users.entry(a.user.as_str()).or_insert(true) &= owned.contains(a.account.as_str());
    }
    let gone_users: BTreeSet<&str> =
        users.into_iter().filter(|(u, ours)| *ours && !wanted_users.contains(u)).map(|(u, _)| u).collect();
    let mut changes: Vec<Change> = observed
        .associations
        .iter()
        .filter(|a| !a.user.is_empty() && owned.contains(a.account.as_str()))
        .filter(|a| !wanted.contains(&(a.account.as_str(), a.user.as_str())) && !gone_users.contains(a.user.as_str()))
        .map(|a| Change::RemoveAssociation { account: a.account.clone(), user: a.user.clone() })
        .collect();
    changes.extend(gone_users.iter().map(|u| Change::RemoveUser((*u).to_owned())));
    changes
        .extend(owned.iter().filter(|a| !wanted_accounts.contains(*a)).map(|a| Change::RemoveAccount((*a).to_owned())));
    let wanted_qos: BTreeSet<&str> = desired.qos.iter().map(|q| q.name.as_str()).collect();
    changes.extend(
        observed
            .qos
            .iter()
            .filter(|q| q.description.starts_with(OWNED) && !wanted_qos.contains(q.name.as_str()))
            .map(|q| Change::RemoveQos(q.name.clone())),
    );
    changes
}

impl Slurmdb {
    /// Applies `change` as slurmdbd does (a simulated Slurm's accounting): created or updated by
    /// name; a removed user or account takes its associations with it.
    pub fn apply(&mut self, change: &Change) {
        fn upsert<T: Clone>(items: &mut Vec<T>, item: &T, same: impl Fn(&T) -> bool) {
            match items.iter_mut().find(|i| same(i)) {
                Some(found) => *found = item.clone(),
                None => items.push(item.clone()),
            }
        }
        match change {
            Change::Qos(q) => upsert(&mut self.qos, q, |o| o.name == q.name),
            Change::Account(a) => upsert(&mut self.accounts, a, |o| o.name == a.name),
            Change::User(u) => upsert(&mut self.users, u, |o| o.name == u.name),
            Change::Association(a) => {
                upsert(&mut self.associations, a, |o| o.account == a.account && o.user == a.user);
            }
            Change::RemoveAssociation { account, user } => {
                self.associations.retain(|a| !(a.account == *account && a.user == *user));
            }
            Change::RemoveUser(u) => {
                self.users.retain(|o| o.name != *u);
                self.associations.retain(|a| a.user != *u);
            }
            Change::RemoveAccount(name) => {
                self.accounts.retain(|o| o.name != *name);
                self.associations.retain(|a| a.account != *name);
            }
            Change::RemoveQos(name) => self.qos.retain(|o| o.name != *name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_types::cluster::SlurmAccountLimits;

    fn account(group: &str, fairshare: u32) -> SlurmAccount {
        SlurmAccount { group: group.into(), account: None, fairshare, limits: SlurmAccountLimits::default() }
    }

    fn group(name: &str, members: &[(&str, bool)]) -> GroupMembers {
        GroupMembers {
            display_name: name.into(),
            members: members.iter().map(|(u, a)| ((*u).to_owned(), *a)).collect(),
        }
    }

    #[test]
    fn active_members_get_an_association_per_mapped_group_and_the_first_is_their_default() {
        let groups =
            [group("ML", &[("alice", true), ("bob", true), ("carol", false)]), group("infra", &[("bob", true)])];
        let db = desired(&[account("ml", 10), account("infra", 1)], &groups);
        let names: Vec<(&str, &str)> = db.users.iter().map(|u| (u.name.as_str(), u.default_account.as_str())).collect();
        assert_eq!(names, [("alice", "ml"), ("bob", "ml")]);
        assert_eq!(counts(&db, chrono::Utc::now()).associations, 3);
        assert_eq!(db.associations.iter().find(|a| a.account == "ml" && a.user.is_empty()).map(|a| a.shares), Some(10));
        assert!(!db.associations.iter().any(|a| a.user == "carol"), "a deactivated user has no association");
    }

    #[test]
    fn a_plan_converges_restores_drift_and_removes_only_what_is_paddocks() {
        let groups = [group("ml", &[("alice", true), ("bob", true)])];
        let want = desired(&[account("ml", 1)], &groups);
        // Slurm's own root and a user of the tenant's admins outside paddock's accounts.
        let mut slurm = Slurmdb {
            accounts: vec![Account { name: "root".into(), description: "default root account".into() }],
            users: vec![User { name: "root".into(), default_account: "root".into() }],
            associations: vec![
                Association { account: "root".into(), user: "root".into(), shares: 1, ..Association::default() },
                Association { account: "root".into(), user: "dave".into(), shares: 1, ..Association::default() },
            ],
            ..Slurmdb::default()
        };
        for change in plan(&want, &slurm) {
            slurm.apply(&change);
        }
        assert!(plan(&want, &slurm).is_empty(), "a second plan finds nothing to do");
        // Behind paddock's back: bob's association goes, and eve is added to paddock's account.
        slurm.apply(&Change::RemoveAssociation { account: "ml".into(), user: "bob".into() });
        slurm.associations.push(Association { account: "ml".into(), user: "eve".into(), ..Association::default() });
        let fix = plan(&want, &slurm);
        assert_eq!(fix.len(), 2, "{fix:?}");
        assert!(fix.contains(&Change::RemoveUser("eve".into())), "{fix:?}");
        for change in &fix {
            slurm.apply(change);
        }
        // bob is deactivated: his association and user go; root and dave stay.
        let without_bob = desired(&[account("ml", 1)], &[group("ml", &[("alice", true), ("bob", false)])]);
        let gone = plan(&without_bob, &slurm);
        assert_eq!(gone, [Change::RemoveUser("bob".into())]);
        let none = plan(&Slurmdb::default(), &slurm);
        assert!(
            none.contains(&Change::RemoveAccount("ml".into()))
                && none.contains(&Change::RemoveQos("paddock-ml".into()))
        );
        assert!(!none.iter().any(|c| c.to_string().contains("root") || c.to_string().contains("dave")), "{none:?}");
    }
}
