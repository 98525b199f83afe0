//! A tenant's people in the cluster's Slurm accounting ([`SlurmDriver::sync_identity`]): read
//! and written through slurmrestd's `slurmdb` endpoints (the pinned slurm-operator has no
//! Account or User custom resources), in the data-parser version the release pins
//! (`/slurmdb/v0.0.42/...` today), with the shapes of Slurm's OpenAPI for that version.
//!
//! Read: `GET qos/`, `accounts/`, `users/`, `associations/` (the last of the cluster
//! [`super::cluster_name`] only, partition associations left out). What to write is
//! [`paddock_domain::slurm_identity::plan`]'s; each change is one request or two ([`requests`]):
//!
//! | change | request |
//! |---|---|
//! | QOS | `POST qos/` `{"qos": [{name, description, limits.max.active_jobs.count, limits.max.tres.minutes.total: [gres/gpu]}]}` |
//! | account | `POST accounts/` `{"accounts": [{name, description, organization}]}` |
//! | an account's own association | `POST accounts_association/` `{"association_condition": {accounts, clusters, association: {parent: root, fairshare, qoslevel, defaultqos}}, account}` (made when missing), then as a user's with `user` empty (set) |
//! | a user's association | `POST associations/` `{"associations": [{account, user, cluster, shares_raw, qos, default.qos}]}` |
//! | user | `POST users/` `{"users": [{name, default.account}]}` |
//! | removals | `DELETE association/?account=&user=&cluster=`, `DELETE user/<name>`, `DELETE account/<name>`, `DELETE qos/<name>` |
//!
//! slurmrestd's POSTs create or update, so a repeated change converges. A user's default account
//! is read from its default association (slurmdbd's `GET users/` leaves it empty). Proven against
//! a real slurmrestd, slurmdbd and MariaDB (`tests/kube/slurm_accounting.rs`). A QOS's GPU minutes
//! hold only where slurm.conf tracks `gres/gpu` (`AccountingStorageTRES`): slurmdbd drops a limit
//! of a TRES it does not know, without an error.

use paddock_domain::driver::{identity_unsupported, BoxFuture, DriverError, SlurmVersion, TenantAccess};
use paddock_domain::slurm_identity::{plan, Account, Association, Change, Qos, Slurmdb, User, OWNED};
use serde_json::{json, Value};
use tracing::{debug, instrument};

use super::{ServiceProxyProbe, SlinkyDriver};

/// A `v0.0.42_uint32_no_val_struct` (or `uint64`): `n`, or unlimited.
fn no_val(n: Option<u64>) -> Value {
    match n {
        Some(n) => json!({ "set": true, "infinite": false, "number": n }),
        None => json!({ "set": false, "infinite": true, "number": 0 }),
    }
}

/// The number a no-val struct holds, if set and finite.
fn number(v: &Value) -> Option<u64> {
    (v["set"] == true && v["infinite"] != true).then(|| v["number"].as_u64()).flatten()
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// The items of `key` in an answer without `errors`.
fn items<'a>(answer: &'a Value, key: &str) -> Result<&'a Vec<Value>, String> {
    if let Some(errors) = answer["errors"].as_array().filter(|e| !e.is_empty()) {
        return Err(format!("slurmrestd reports errors: {}", Value::Array(errors.clone())));
    }
    answer[key].as_array().ok_or_else(|| format!("no `{key}` list in the answer"))
}

/// Slurm's accounting of cluster `cluster` from the four answers (qos, accounts, users,
/// associations).
pub fn parse_slurmdb(answers: [&Value; 4], cluster: &str) -> Result<Slurmdb, String> {
    let [qos, accounts, users, associations] = answers;
    let qos = items(qos, "qos")?
        .iter()
        .map(|q| Qos {
            name: text(&q["name"]),
            description: text(&q["description"]),
            max_jobs: number(&q["limits"]["max"]["active_jobs"]["count"]).and_then(|n| u32::try_from(n).ok()),
            gpu_minutes: q["limits"]["max"]["tres"]["minutes"]["total"]
                .as_array()
                .and_then(|t| t.iter().find(|t| t["type"] == "gres" && t["name"] == "gpu"))
                .and_then(|t| t["count"].as_u64()),
        })
        .collect();
    let accounts = items(accounts, "accounts")?
        .iter()
        .map(|a| Account { name: text(&a["name"]), description: text(&a["description"]) })
        .collect();
    let associations: Vec<&Value> = items(associations, "associations")?
        .iter()
        .filter(|a| a["partition"].as_str().unwrap_or_default().is_empty())
        .filter(|a| a["cluster"].as_str().is_none_or(|c| c.is_empty() || c == cluster))
        .collect();
    // slurmdbd lists a user's default account only when asked for the user's associations too;
    // the default association of the user on this cluster says it.
    let default_of = |user: &str| {
        associations.iter().find(|a| a["user"] == user && a["is_default"] == true).map(|a| text(&a["account"]))
    };
    let users = items(users, "users")?
        .iter()
        .map(|u| {
            let name = text(&u["name"]);
            let listed = text(&u["default"]["account"]);
            let default_account = if listed.is_empty() { default_of(&name).unwrap_or_default() } else { listed };
            User { name, default_account }
        })
        .collect();
    let associations = associations
        .into_iter()
        .map(|a| Association {
            account: text(&a["account"]),
            user: text(&a["user"]),
            shares: a["shares_raw"].as_u64().and_then(|n| u32::try_from(n).ok()).unwrap_or(1),
            qos: a["qos"].as_array().map(|q| q.iter().map(text).collect()).unwrap_or_default(),
            default_qos: a["default"]["qos"].as_str().filter(|q| !q.is_empty()).map(str::to_owned),
            locked: number(&a["max"]["jobs"]["total"]) == Some(0),
        })
        .collect();
    Ok(Slurmdb { qos, accounts, users, associations, cancel_jobs: false })
}

/// One request to slurmrestd: method, path below `/slurmdb/<version>/`, body.
pub type Request = (&'static str, String, Option<Value>);

/// The requests that make `change`, in order.
pub fn requests(change: &Change, cluster: &str) -> Vec<Request> {
    match change {
        Change::Qos(q) => {
            let gpu: Vec<Value> =
                q.gpu_minutes.map(|n| json!({ "type": "gres", "name": "gpu", "count": n })).into_iter().collect();
            let limits = json!({ "max": { "active_jobs": { "count": no_val(q.max_jobs.map(u64::from)) },
                                          "tres": { "minutes": { "total": gpu } } } });
            let body = json!({ "qos": [{ "name": q.name, "description": q.description, "limits": limits }] });
            vec![("POST", "qos/".to_owned(), Some(body))]
        }
        Change::Account(a) => {
            let body =
                json!({ "accounts": [{ "name": a.name, "description": a.description, "organization": ORGANIZATION }] });
            vec![("POST", "accounts/".to_owned(), Some(body))]
        }
        Change::User(u) => {
            let body = json!({ "users": [{ "name": u.name, "default": { "account": u.default_account } }] });
            vec![("POST", "users/".to_owned(), Some(body))]
        }
        Change::Association(a) if a.user.is_empty() => account_association(a, cluster),
        Change::Association(a) => {
            let submit = no_val(a.locked.then_some(0));
            let assoc = json!({ "account": a.account, "user": a.user, "cluster": cluster,
                                "shares_raw": a.shares, "qos": a.qos,
                                "default": { "qos": a.default_qos.clone().unwrap_or_default() },
                                "max": { "jobs": { "total": submit } } });
            vec![("POST", "associations/".to_owned(), Some(json!({ "associations": [assoc] })))]
        }
        Change::RemoveAssociation { account, user } => {
            vec![("DELETE", format!("association/?account={account}&user={user}&cluster={cluster}"), None)]
        }
        Change::RemoveUser(u) => vec![("DELETE", format!("user/{u}"), None)],
        Change::RemoveAccount(a) => vec![("DELETE", format!("account/{a}"), None)],
        Change::RemoveQos(q) => vec![("DELETE", format!("qos/{q}"), None)],
    }
}

/// The organization of the accounts paddock writes.
const ORGANIZATION: &str = "paddock";

/// An account's own association (no user) under `root`: made by `POST accounts_association/` as
/// `sacctmgr add account` makes it (a no-op when it is there), then set by `POST associations/`.
/// slurmdbd makes no account association from `POST associations/`: it takes its `"user": ""`
/// (which it requires) for a user association of the user "", under which no user can be added;
/// an existing account association it finds, and updates.
fn account_association(a: &Association, cluster: &str) -> Vec<Request> {
    let default_qos = a.default_qos.clone().unwrap_or_default();
    let make = json!({
        "association_condition": {
            "accounts": [a.account], "clusters": [cluster],
            "association": { "parent": "root", "fairshare": a.shares, "qoslevel": a.qos, "defaultqos": default_qos },
        },
        "account": { "description": format!("{OWNED}{}", a.account), "organization": ORGANIZATION },
    });
    let set = json!({ "associations": [{ "account": a.account, "user": "", "cluster": cluster,
                                         "parent_account": "root", "shares_raw": a.shares, "qos": a.qos,
                                         "default": { "qos": default_qos } }] });
    vec![("POST", "accounts_association/".to_owned(), Some(make)), ("POST", "associations/".to_owned(), Some(set))]
}

impl ServiceProxyProbe {
    /// Slurm's accounting of the cluster `cluster`, in `version`.
    pub async fn slurmdb(&self, tenant: &TenantAccess, version: &str, cluster: &str) -> Result<Slurmdb, DriverError> {
        let mut answers = Vec::with_capacity(4);
        for path in ["qos/", "accounts/", "users/", "associations/"] {
            let text = self.call_in("slurmdb", tenant, ("GET", version, path), None).await?.ok_or_else(|| {
                let message = format!("slurmrestd does not serve GET /slurmdb/{version}/{path} (404)");
                DriverError::transient("slurm_rest_not_found", message)
            })?;
            let value: Value = serde_json::from_str(&text).map_err(|e| unreadable(version, path, &e.to_string()))?;
            answers.push(value);
        }
        let refs = [&answers[0], &answers[1], &answers[2], &answers[3]];
        parse_slurmdb(refs, cluster).map_err(|why| unreadable(version, "...", &why))
    }

    /// Makes `change` in the accounting of cluster `cluster`, in `version`. A removal of
    /// something already gone (404) is done.
    pub async fn slurmdb_write(
        &self,
        tenant: &TenantAccess,
        version: &str,
        cluster: &str,
        change: &Change,
    ) -> Result<(), DriverError> {
        for (method, path, body) in requests(change, cluster) {
            let answer = self.call_in("slurmdb", tenant, (method, version, &path), body.as_ref()).await?;
            let Some(text) = answer else {
                if method == "DELETE" {
                    continue;
                }
                let message = format!("slurmrestd does not serve {method} /slurmdb/{version}/{path} (404)");
                return Err(DriverError::transient("slurm_rest_not_found", message));
            };
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if let Some(errors) = value["errors"].as_array().filter(|e| !e.is_empty()) {
                let message =
                    format!("slurmrestd refused {method} /slurmdb/{version}/{path}: {}", Value::Array(errors.clone()));
                return Err(DriverError::transient("slurmdb_write_refused", message));
            }
            debug!(cluster.id = %tenant.cluster.cluster_id, "{method} /slurmdb/{version}/{path}");
        }
        Ok(())
    }
}

impl ServiceProxyProbe {
    /// Cancels the jobs `filter` selects (`DELETE /slurm/<version>/jobs/`, as `scancel` with
    /// filters).
    pub async fn cancel_jobs(&self, tenant: &TenantAccess, version: &str, filter: &Value) -> Result<(), DriverError> {
        let answer = self.call_in("slurm", tenant, ("DELETE", version, "jobs/"), Some(filter)).await?;
        let value: Value = answer.as_deref().and_then(|t| serde_json::from_str(t).ok()).unwrap_or(Value::Null);
        if let Some(errors) = value["errors"].as_array().filter(|e| !e.is_empty()) {
            let message = format!("slurmrestd refused to cancel jobs ({filter}): {}", Value::Array(errors.clone()));
            return Err(DriverError::transient("slurm_cancel_refused", message));
        }
        debug!(cluster.id = %tenant.cluster.cluster_id, "cancelled the jobs of {filter}");
        Ok(())
    }
}

fn unreadable(version: &str, path: &str, why: &str) -> DriverError {
    DriverError::transient("slurm_rest_answer_invalid", format!("slurmrestd's GET /slurmdb/{version}/{path}: {why}"))
}

impl SlinkyDriver {
    /// See [`paddock_domain::driver::SlurmDriver::sync_identity`]: reads the accounting, writes
    /// the plan's changes one by one (a failure stops the run; the next sync reads again).
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id))]
    pub async fn sync_identity(
        &self,
        tenant: &TenantAccess,
        slurm: &SlurmVersion,
        desired: &Slurmdb,
    ) -> Result<Vec<String>, DriverError> {
        let images = self.settings.catalog.images(&slurm.stack_version, &slurm.version)?;
        let version = images.rest_api_version();
        let cluster = super::cluster_name(tenant.cluster.cluster_id);
        let observed = self.probe.slurmdb(tenant, version, &cluster).await?;
        let mut written = Vec::new();
        for change in &plan(desired, &observed) {
            match self.probe.slurmdb_write(tenant, version, &cluster, change).await {
                Ok(()) => written.push(change.to_string()),
                Err(e) if jobs_active(&e) => {
                    let cancel = cancel_filter(change).filter(|_| desired.cancel_jobs);
                    if let Some(filter) = &cancel {
                        self.probe.cancel_jobs(tenant, version, filter).await?;
                        written.push(format!("{change}: their jobs cancelled"));
                    }
                    let locks = lock_out(change, &observed);
                    for lock in &locks {
                        self.probe.slurmdb_write(tenant, version, &cluster, lock).await?;
                    }
                    if !locks.is_empty() {
                        written.push(format!("{change}: locked out until their active jobs end"));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(written)
    }
}

/// Whether slurmdbd refused a removal because jobs of the association are active (pending or
/// running): `ESLURM_JOBS_RUNNING_ON_ASSOC`, "Job(s) active, cancel job(s) before remove".
fn jobs_active(e: &DriverError) -> bool {
    e.message.contains("Job(s) active")
}

/// The filter of `DELETE /slurm/<version>/jobs/` for the jobs a removal waits for: the user's
/// in the account, the user's, or the account's.
fn cancel_filter(change: &Change) -> Option<Value> {
    match change {
        Change::RemoveAssociation { account, user } => Some(json!({ "account": account, "user_name": user })),
        Change::RemoveUser(user) => Some(json!({ "user_name": user })),
        Change::RemoveAccount(account) => Some(json!({ "account": account })),
        _ => None,
    }
}

/// What locks out the user of a removal slurmdbd refused while their jobs are active: each of
/// their associations the removal covers, not locked yet, with no new job allowed. Their jobs
/// go on; a later sync removes them once the jobs have ended.
fn lock_out(change: &Change, observed: &Slurmdb) -> Vec<Change> {
    let covered = |a: &&Association| match change {
        Change::RemoveAssociation { account, user } => a.account == *account && a.user == *user,
        Change::RemoveUser(user) => a.user == *user,
        Change::RemoveAccount(account) => a.account == *account && !a.user.is_empty(),
        _ => false,
    };
    observed
        .associations
        .iter()
        .filter(covered)
        .filter(|a| !a.locked)
        .map(|a| Change::Association(Association { locked: true, ..a.clone() }))
        .collect()
}

/// The default of [`super::SlurmProbe::slurmdb`] for stand-ins that cannot.
pub(super) fn unsupported<'a, T: Send + 'a>() -> BoxFuture<'a, Result<T, DriverError>> {
    Box::pin(async { Err(identity_unsupported()) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_domain::slurm_identity::desired;
    use paddock_domain::slurm_identity::GroupMembers;
    use paddock_types::cluster::{SlurmAccount, SlurmAccountLimits};

    #[test]
    fn what_is_written_reads_back_as_written() {
        let limits = SlurmAccountLimits { max_jobs: Some(5), gpu_minutes: Some(6000) };
        let spec = SlurmAccount { group: "ml".into(), account: None, fairshare: 10, limits };
        let groups = [GroupMembers { display_name: "ml".into(), members: vec![("alice".into(), true)] }];
        let want = desired(&[spec], &groups);
        // Each request's body is the item slurmrestd lists back (its GETs answer the same shapes).
        let mut lists: [Vec<Value>; 4] = Default::default();
        // (An account's own association is made, then set as listed: the second request's.)
        for (_, path, body) in plan(&want, &Slurmdb::default()).iter().flat_map(|c| requests(c, "c1")) {
            let body = body.expect("a write");
            let (slot, key) = match path.as_str() {
                "qos/" => (0, "qos"),
                "accounts/" => (1, "accounts"),
                "users/" => (2, "users"),
                "associations/" => (3, "associations"),
                _ => continue,
            };
            lists[slot].extend(body[key].as_array().expect("items").iter().cloned());
        }
        let answers = [
            json!({ "qos": lists[0], "errors": [] }),
            json!({ "accounts": lists[1], "errors": [] }),
            json!({ "users": lists[2], "errors": [] }),
            json!({ "associations": lists[3], "errors": [] }),
        ];
        let read = parse_slurmdb([&answers[0], &answers[1], &answers[2], &answers[3]], "c1").expect("parses");
        assert!(plan(&want, &read).is_empty(), "{read:?}");
        let other = parse_slurmdb([&answers[0], &answers[1], &answers[2], &answers[3]], "c2").expect("parses");
        assert!(other.associations.is_empty(), "another cluster's associations were read as this one's");
        let failed = json!({ "qos": [], "errors": [{ "error": "Unable to connect to database" }] });
        assert!(parse_slurmdb([&failed, &answers[1], &answers[2], &answers[3]], "c1").is_err());
    }

    #[test]
    fn a_refused_removal_locks_out_the_associations_it_covers_once() {
        let assoc = |account: &str, user: &str, locked: bool| Association {
            account: account.into(),
            user: user.into(),
            shares: 1,
            locked,
            ..Association::default()
        };
        let observed = Slurmdb {
            associations: vec![
                assoc("ml", "", false),
                assoc("ml", "bob", false),
                assoc("cv", "bob", true),
                assoc("ml", "al", false),
            ],
            ..Slurmdb::default()
        };
        let locks = lock_out(&Change::RemoveUser("bob".into()), &observed);
        assert_eq!(locks, [Change::Association(assoc("ml", "bob", true))], "cv's is locked already");
        let locks = lock_out(&Change::RemoveAccount("ml".into()), &observed);
        assert_eq!(locks.len(), 2, "the users' associations, not the account's own: {locks:?}");
        let (_, _, body) = requests(&locks[0], "c1").remove(0);
        assert_eq!(body.expect("a write")["associations"][0]["max"]["jobs"]["total"]["number"], 0);
        let refused = DriverError::permanent(
            "kube_api_error",
            "slurmdb_users_remove failed: Job(s) active, cancel job(s) before remove",
        );
        assert!(jobs_active(&refused) && !jobs_active(&DriverError::permanent("x", "Unable to connect to database")));
    }
}
