//! Nudging the operator's NodeSet controller once slurmctld answers.
//!
//! The operator reconciles a NodeSet by first asking slurmctld, through slurmrestd, whether the
//! NodeSet's reservation exists (`syncFinalizers` in `internal/controller/nodeset`), before it
//! creates any pod. While slurmctld is still starting that call fails, and controller-runtime
//! retries the NodeSet with an exponential backoff of its own (5 ms doubling, up to 1,000 s):
//! on a new cluster the first slurmd pods were measured created 71-133 s after slurmctld
//! answered. An update of the NodeSet is reconciled at once, so paddock writes one annotation,
//! [`ANSWERED_AT`], on each NodeSet that lacks pods (`status.replicas` below `spec.replicas`)
//! when its own ping through slurmrestd succeeds, and again at most every [`RENUDGE_AFTER`]
//! while the pods are still missing (the operator's client for slurmrestd may come a moment
//! later than paddock's). A NodeSet with all its pods is never written.
//!
//! The annotation is written with its own field manager, [`NUDGE_MANAGER`], so paddock's apply
//! of the NodeSet (manager [`crate::isolation::MANAGER`]) neither owns nor removes it. The
//! operator copies a NodeSet's annotations onto the pods it creates afterwards and onto its
//! revisions, but not into the revision's hash: no pod is rolled by it.

use k8s_openapi::chrono::{DateTime, SecondsFormat, Utc};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};
use tracing::info;

use crate::KubeError;

/// The annotation: when paddock last saw slurmctld answer while the NodeSet lacked pods (RFC 3339).
pub const ANSWERED_AT: &str = "paddock.dev/slurmctld-answered-at";

/// The field manager of the annotation.
pub const NUDGE_MANAGER: &str = "paddock-nudge";

/// How long a nudge stands before a NodeSet still without its pods is nudged again.
pub const RENUDGE_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Annotates each of `nodesets` that lacks pods and was not nudged in the last
/// [`RENUDGE_AFTER`] (as of `now`); the names of those written.
pub async fn nudge_unstarted(
    api: &Api<DynamicObject>,
    ns: &str,
    nodesets: &[&DynamicObject],
    now: DateTime<Utc>,
) -> Result<Vec<String>, KubeError> {
    let mut nudged = Vec::new();
    for nodeset in nodesets.iter().filter(|n| due(n, now)) {
        let Some(name) = nodeset.metadata.name.as_deref() else { continue };
        let stamp = now.to_rfc3339_opts(SecondsFormat::Secs, true);
        let body = json!({
            "apiVersion": format!("{}/{}", super::GROUP, super::VERSION),
            "kind": "NodeSet",
            "metadata": { "name": name, "annotations": { ANSWERED_AT: stamp } },
        });
        let params = PatchParams::apply(NUDGE_MANAGER).force();
        api.patch(name, &params, &Patch::Apply(&body))
            .await
            .map_err(|source| KubeError::api("annotate", "NodeSet", format!("{ns}/{name}"), source))?;
        nudged.push(name.to_owned());
    }
    if !nudged.is_empty() {
        info!(nodesets = ?nudged, "slurmctld answers and NodeSets in {ns} lack pods: asked the operator to reconcile them");
    }
    Ok(nudged)
}

/// Whether `nodeset` lacks pods and its last nudge (if any) is older than [`RENUDGE_AFTER`].
pub fn due(nodeset: &DynamicObject, now: DateTime<Utc>) -> bool {
    let int = |section: &str, key: &str| nodeset.data.get(section).and_then(|s| s.get(key)).and_then(Value::as_i64);
    let lacking = int("status", "replicas").unwrap_or(0) < int("spec", "replicas").unwrap_or(0);
    let last = nodeset.metadata.annotations.as_ref().and_then(|a| a.get(ANSWERED_AT));
    let last = last.and_then(|t| DateTime::parse_from_rfc3339(t).ok()).map(|t| t.with_timezone(&Utc));
    // Either way: a stamp far ahead (another worker's clock) must not hold the nudge off.
    let stale = last.is_none_or(|t| (now - t).num_seconds().unsigned_abs() >= RENUDGE_AFTER.as_secs());
    lacking && stale
}

#[cfg(test)]
mod tests {
    use k8s_openapi::chrono::{Duration, TimeZone, Utc};
    use kube::api::DynamicObject;
    use serde_json::json;

    use super::{due, ANSWERED_AT};

    fn nodeset(spec: i64, status: Option<i64>, answered: Option<&str>) -> DynamicObject {
        let mut object = json!({
            "apiVersion": "slinky.slurm.net/v1beta1",
            "kind": "NodeSet",
            "metadata": { "name": "gpu" },
            "spec": { "replicas": spec },
        });
        if let Some(s) = status {
            object["status"] = json!({ "replicas": s });
        }
        if let Some(a) = answered {
            object["metadata"]["annotations"] = json!({ ANSWERED_AT: a });
        }
        serde_json::from_value(object).expect("a NodeSet")
    }

    #[test]
    fn a_nodeset_lacking_pods_is_due_unless_nudged_in_the_last_30_s() {
        let now = Utc.with_ymd_and_hms(2026, 12, 8, 1, 0, 0).single().expect("a time");
        let at = |ago: i64| (now - Duration::seconds(ago)).to_rfc3339();
        assert!(due(&nodeset(2, None, None), now), "no status yet: the operator has not got far");
        assert!(due(&nodeset(2, Some(1), None), now), "one pod of two");
        assert!(due(&nodeset(2, Some(0), Some(&at(30))), now), "the last nudge is 30 s old");
        assert!(due(&nodeset(2, Some(0), Some("not a time")), now), "an unreadable stamp counts as none");
        assert!(!due(&nodeset(2, Some(0), Some(&at(29))), now), "nudged 29 s ago");
        assert!(!due(&nodeset(2, Some(0), Some(&at(-5))), now), "a stamp 5 s ahead waits");
        assert!(due(&nodeset(2, Some(0), Some(&at(-30))), now), "one 30 s ahead does not");
        assert!(!due(&nodeset(2, Some(2), None), now), "every pod is there");
        assert!(!due(&nodeset(1, Some(2), None), now), "scaling down");
        assert!(!due(&nodeset(0, None, None), now), "a pool at zero");
    }
}
