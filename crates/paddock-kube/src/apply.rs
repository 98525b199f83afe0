//! The one way every driver writes an object: look first, server-side apply only what differs.
//!
//! paddock owns exactly the fields of its apply bodies (one field manager, [`MANAGER`], forced).
//! So "the object is as paddock wants it" is: every field of the body holds in the live object
//! ([`holds`]), and paddock owns no field the body no longer has ([`owns_only`], read from the
//! object's `managedFields`: an apply without it would remove it). A run that finds that applies
//! nothing, which makes a drift check of a converged
//! cluster one read per object, no write. A run that finds a difference applies the body, and
//! the object counts as changed only if the API server moved its `resourceVersion` (an apply that
//! changes nothing keeps it): a difference [`holds`] sees but server-side apply does not (a list
//! entry another manager added, a quantity the API server spells its own way) costs one no-op
//! apply and is never reported as a correction.
//!
//! [`MANAGER`]: crate::isolation::MANAGER

use std::fmt::Debug;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tracing::debug;

use crate::isolation::MANAGER;
use crate::KubeError;

/// Whether every field of `desired` (an apply body) holds in `live`: objects key by key (a key
/// the body sets to null, `{}`, `[]` or a zero value need not exist; a null holds anywhere),
/// lists entry by entry and of the same length, numbers by value, everything else equal. Fields
/// only the live object has (defaults, status, other managers' fields) do not matter.
pub fn holds(desired: &Value, live: &Value) -> bool {
    difference(desired, live).is_none()
}

/// Whether every field that a field manager owns (its `managedFields` entry's `fieldsV1`) is
/// still in `desired`: structs field by field (`f:` keys); list entries (`k:`, `v:`, `i:`) are
/// left to [`holds`], which compares lists whole.
pub fn owns_only(fields_v1: &Value, desired: &Value) -> bool {
    let Value::Object(owned) = fields_v1 else { return true };
    owned.iter().all(|(key, below)| {
        let Some(name) = key.strip_prefix("f:") else { return true };
        match desired.get(name) {
            None => false,
            Some(inner @ Value::Object(_)) => owns_only(below, inner),
            Some(_) => true,
        }
    })
}

/// Whether `live` is as paddock wants it: `desired` [`holds`] in it and paddock's apply owns
/// nothing `desired` lacks.
fn as_wanted<K: Resource + Serialize>(live: &K, desired: &Value) -> Result<bool, serde_json::Error> {
    let owned_elsewhere = live.meta().managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(MANAGER)
            && entry.operation.as_deref() == Some("Apply")
            && !entry.fields_v1.as_ref().is_none_or(|fields| owns_only(&fields.0, desired))
    });
    if owned_elsewhere {
        return Ok(false);
    }
    // A body's `status` (upstream CRDs carry an empty one) is not applied where the kind has a
    // status subresource, so the live status is no measure of it.
    let live = serde_json::to_value(live)?;
    Ok(match desired {
        Value::Object(fields) if fields.contains_key("status") => {
            fields.iter().filter(|(k, _)| *k != "status").all(|(k, v)| live.get(k).is_some_and(|l| holds(v, l)))
        }
        _ => holds(desired, &live),
    })
}

/// Where `desired` first fails to [`hold`](holds) in `live` (a `/`-separated path and the two
/// values), or None when it holds: the one comparison, whose answer the logs can show.
fn difference(desired: &Value, live: &Value) -> Option<String> {
    match (desired, live) {
        (Value::Object(want), Value::Object(have)) => want.iter().find_map(|(key, value)| match have.get(key) {
            None if nothing(value) => None,
            None => Some(format!("/{key} (missing)")),
            Some(found) => difference(value, found).map(|below| format!("/{key}{below}")),
        }),
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() => {
            want.iter().zip(have).enumerate().find_map(|(i, (w, h))| difference(w, h).map(|b| format!("/{i}{b}")))
        }
        (Value::Array(want), Value::Array(have)) => Some(format!(" ({} entries, {} live)", want.len(), have.len())),
        (Value::Number(want), Value::Number(have)) if want == have || want.as_f64() == have.as_f64() => None,
        // A body's null has no opinion (`creationTimestamp: null` in rendered manifests).
        (Value::Null, _) => None,
        (want, have) if want == have => None,
        (want, have) => Some(format!(" ({want} != {have})")),
    }
}

/// Whether a body's value sets nothing, so that the API server keeps no field for it: null, an
/// empty map or list (`resources: {}`, `args: []`), and a zero value.
fn nothing(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(list) => list.is_empty(),
        // Kubernetes' Go types drop zero values (`omitempty`): a `false`, `0` or `""` the body
        // sets is stored as no field at all (`preserveUnknownFields: false`, `readOnly: false`).
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(text) => text.is_empty(),
    }
}

/// The object as it is after making sure `body` holds in it, and whether that changed it.
#[derive(Debug)]
pub struct Converged<K> {
    /// The live object (as read, or as the apply returned it).
    pub object: K,
    /// Created, or its `resourceVersion` moved.
    pub changed: bool,
}

/// Which object: its kind and `namespace/name` (or just the name), for errors, logs and the
/// `changed` lists the drivers report.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The kind, e.g. `NetworkPolicy`.
    pub kind: &'static str,
    /// The name to read and apply.
    pub name: &'a str,
    /// `namespace/name`, or just the name for a cluster-scoped object.
    pub full_name: &'a str,
}

impl Target<'_> {
    /// `Kind namespace/name`: how a changed object is reported.
    pub fn describe(&self) -> String {
        format!("{} {}", self.kind, self.full_name)
    }
}

/// Applies `body` through `api` unless `live` (the object as just read; None: it does not exist)
/// already holds it.
pub async fn converge<K, B>(
    api: &Api<K>,
    target: Target<'_>,
    live: Option<K>,
    body: &B,
) -> Result<Converged<K>, KubeError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    B: Serialize + Debug,
{
    let encode = |source| KubeError::Encode { kind: target.kind, name: target.full_name.to_owned(), source };
    let desired = serde_json::to_value(body).map_err(encode)?;
    let Some(live) = live else {
        let object = apply(api, target, &desired).await?;
        debug!("created {} {}", target.kind, target.full_name);
        return Ok(Converged { object, changed: true });
    };
    if as_wanted(&live, &desired).map_err(encode)? {
        return Ok(Converged { object: live, changed: false });
    }
    let before = live.meta().resource_version.clone();
    let differs = serde_json::to_value(&live).ok().and_then(|l| difference(&desired, &l)).unwrap_or_default();
    let object = apply(api, target, &desired).await?;
    let changed = before != object.meta().resource_version;
    debug!(changed, differs = %differs, "applied {} {}: it differed from paddock's fields", target.kind, target.full_name);
    Ok(Converged { object, changed })
}

/// Reads the object, then [`converge`]s it.
pub async fn get_and_converge<K, B>(api: &Api<K>, target: Target<'_>, body: &B) -> Result<Converged<K>, KubeError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
    B: Serialize + Debug,
{
    let live = api
        .get_opt(target.name)
        .await
        .map_err(|source| KubeError::api("get", target.kind, target.full_name, source))?;
    converge(api, target, live, body).await
}

/// Converges the workload namespace `name` inside a tenant cluster (Slurm's, Ray's) with
/// `labels`, noting it in `changed` when it moved; a namespace being deleted is
/// [`KubeError::NamespaceTerminating`] (applying into it would fail object by object).
pub async fn ensure_namespace(
    client: &kube::Client,
    name: &str,
    labels: std::collections::BTreeMap<String, String>,
    changed: &mut Vec<String>,
) -> Result<(), KubeError> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": name, "labels": labels },
    });
    let target = Target { kind: "Namespace", name, full_name: name };
    let converged = get_and_converge(&api, target, &body).await?;
    if converged.changed {
        changed.push(target.describe());
    }
    if converged.object.status.and_then(|s| s.phase).as_deref() == Some("Terminating") {
        return Err(KubeError::NamespaceTerminating { namespace: name.to_owned() });
    }
    Ok(())
}

async fn apply<K>(api: &Api<K>, target: Target<'_>, body: &Value) -> Result<K, KubeError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let params = PatchParams::apply(MANAGER).force();
    api.patch(target.name, &params, &Patch::Apply(body))
        .await
        .map_err(|source| KubeError::api("apply", target.kind, target.full_name, source))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{holds, owns_only};

    #[test]
    fn a_body_holds_in_an_object_with_more_fields_and_not_in_one_that_lost_or_changed_one() {
        let body = json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"replicas": 2,
            "ports": [{"port": 80}], "selector": null}});
        let live = json!({"metadata": {"name": "a", "labels": {"x": "1", "y": "tenant"}, "resourceVersion": "7"},
            "spec": {"replicas": 2, "ports": [{"port": 80, "protocol": "TCP"}], "paused": false},
            "status": {"ready": 2}});
        assert!(holds(&body, &live));
        let mut edited = live.clone();
        edited["spec"]["replicas"] = json!(5);
        assert!(!holds(&body, &edited), "a field paddock owns was changed");
        let mut removed = live.clone();
        removed["metadata"]["labels"].as_object_mut().expect("labels").remove("x");
        assert!(!holds(&body, &removed), "a label paddock owns was removed");
        let mut added = live.clone();
        added["spec"]["ports"].as_array_mut().expect("ports").push(json!({"port": 443}));
        assert!(!holds(&body, &added), "a list paddock set has another entry: applied again, SSA decides");
        assert!(holds(&json!({"n": 1}), &json!({"n": 1.0})), "numbers by value");
        assert!(
            holds(&json!({"r": {}, "a": [], "z": null, "f": false, "n": 0, "s": ""}), &json!({})),
            "what sets nothing need not be there"
        );
        assert!(holds(&json!({"creationTimestamp": null}), &json!({"creationTimestamp": "2026-12-03T21:20:50Z"})));
        assert!(!holds(&json!({"f": true, "n": 2}), &json!({})), "a value that sets something must be there");
        assert!(!holds(&json!({"n": "1"}), &json!({"n": 1})), "a string is not a number");
    }

    #[test]
    fn a_field_paddock_owns_but_no_longer_wants_needs_an_apply() {
        let owned = json!({"f:metadata": {"f:labels": {".": {}, "f:x": {}}}, "f:spec": {"f:extraConf": {},
            "f:ports": {"k:{\"port\":80}": {"f:port": {}}}}});
        let body = json!({"metadata": {"labels": {"x": "1"}}, "spec": {"extraConf": "a", "ports": [{"port": 80}]}});
        assert!(owns_only(&owned, &body));
        let dropped = json!({"metadata": {"labels": {"x": "1"}}, "spec": {"ports": []}});
        assert!(!owns_only(&owned, &dropped), "extraConf is owned and no longer wanted");
        let label_gone = json!({"metadata": {"labels": {}}, "spec": {"extraConf": "a", "ports": []}});
        assert!(!owns_only(&owned, &label_gone));
    }
}
