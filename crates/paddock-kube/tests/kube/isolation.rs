//! `ensure_isolation` against a real API server: idempotence, names, labels, validation, the
//! NetworkPolicies as stored (what they would enforce needs a CNI that enforces NetworkPolicy,
//! which the harness has not: enforcement is not tested here), the quota's values and its
//! admission, and separation of two tenants.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Container, LimitRange, Namespace, Pod, PodSpec, ResourceQuota};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use paddock_domain::driver::ClusterRef;
use paddock_kube::isolation::{self, IsolationSettings};
use paddock_kube::KubePlatform;
use serde_json::json;

use crate::support::{self, eventually};

/// Every isolation object of `cluster` as stored: (kind/name, resourceVersion, labels, JSON).
pub async fn stored(client: &Client, cluster: &ClusterRef) -> Vec<(String, String, BTreeMap<String, String>, String)> {
    let ns_name = isolation::namespace_name(cluster.cluster_id);
    let mut out = Vec::new();
    fn row<K: Resource + serde::Serialize>(kind: &str, o: &K) -> (String, String, BTreeMap<String, String>, String) {
        let m = o.meta();
        (
            format!("{kind}/{}", m.name.clone().unwrap_or_default()),
            m.resource_version.clone().unwrap_or_default(),
            m.labels.clone().unwrap_or_default(),
            serde_json::to_string(o).expect("serialize"),
        )
    }
    let ns = Api::<Namespace>::all(client.clone()).get(&ns_name).await.expect("get namespace");
    out.push(row("Namespace", &ns));
    let lp = ListParams::default();
    for o in Api::<NetworkPolicy>::namespaced(client.clone(), &ns_name).list(&lp).await.expect("list policies") {
        out.push(row("NetworkPolicy", &o));
    }
    for o in Api::<ResourceQuota>::namespaced(client.clone(), &ns_name).list(&lp).await.expect("list quotas") {
        out.push(row("ResourceQuota", &o));
    }
    for o in Api::<LimitRange>::namespaced(client.clone(), &ns_name).list(&lp).await.expect("list limits") {
        out.push(row("LimitRange", &o));
    }
    out
}

/// Waits until the resource-quota controller has settled: `status.used` names every resource of
/// `spec.hard` and counts the namespace's ConfigMaps, `kube-root-ca.crt` among them (another
/// controller publishes it a moment after the namespace appears, and the quota is written again
/// when it does). After that nothing but paddock changes the objects, so resourceVersions are
/// stable.
async fn quota_computed(client: &Client, cluster: &ClusterRef) {
    let ns = isolation::namespace_name(cluster.cluster_id);
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    eventually(Duration::from_secs(60), "the quota's status.used to count every object", || {
        let (quotas, config_maps) = (quotas.clone(), config_maps.clone());
        async move {
            let listed = config_maps.list(&ListParams::default()).await.ok()?.items;
            listed.iter().any(|c| c.metadata.name.as_deref() == Some("kube-root-ca.crt")).then_some(())?;
            let q = quotas.get(isolation::QUOTA_NAME).await.ok()?;
            let hard = q.spec?.hard?;
            let used = q.status?.used?;
            let counted = used.get("configmaps")?.0.parse::<usize>().ok()?;
            (hard.keys().all(|k| used.contains_key(k)) && counted == listed.len()).then_some(())
        }
    })
    .await;
}

async fn setup() -> Option<(KubePlatform, Client)> {
    let server = support::shared().await?;
    Some((server.platform().await, server.client().await))
}

#[tokio::test]
async fn ensure_isolation_twice_changes_nothing_the_second_time() {
    let Some((platform, client)) = setup().await else { return };
    let c = support::cluster("ensure-twice", "c1");

    let first = platform.ensure_isolation(&c).await.expect("first ensure");
    assert_eq!(first.changed.len(), 7, "the first run creates every object: {:?}", first.changed);
    quota_computed(&client, &c).await;
    let before = stored(&client, &c).await;
    assert_eq!(before.len(), 7, "namespace, 4 policies, quota, limit range: {:?}", names(&before));

    let second = platform.ensure_isolation(&c).await.expect("second ensure");
    assert_eq!(second, paddock_domain::driver::Isolation { namespace: first.namespace.clone(), changed: Vec::new() });
    let after = stored(&client, &c).await;
    let versions = |rows: &[(String, String, BTreeMap<String, String>, String)]| {
        rows.iter().map(|r| (r.0.clone(), r.1.clone())).collect::<Vec<_>>()
    };
    assert_eq!(versions(&before), versions(&after), "no object got a new resourceVersion");
}

/// Drift: what was deleted or edited behind paddock's back is restored and named, nothing else is
/// written (a field of another manager stays), and the run after that changes nothing again.
#[tokio::test]
async fn ensure_isolation_restores_and_names_what_was_deleted_or_edited_and_nothing_else() {
    let Some((platform, client)) = setup().await else { return };
    let c = support::cluster("drift", "c1");
    platform.ensure_isolation(&c).await.expect("first ensure");
    quota_computed(&client, &c).await;
    let ns = isolation::namespace_name(c.cluster_id);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    policies.delete("paddock-allow-dns", &DeleteParams::default()).await.expect("delete a policy");
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let edit = PatchParams { field_manager: Some("someone-else".into()), ..PatchParams::default() };
    let hard = json!({ "spec": { "hard": { "pods": "100000" } } });
    quotas.patch(isolation::QUOTA_NAME, &edit, &Patch::Merge(&hard)).await.expect("edit the quota");
    let label = json!({ "metadata": { "labels": { "owner.example/team": "ops" } } });
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.patch(&ns, &edit, &Patch::Merge(&label)).await.expect("label the namespace");
    let before = stored(&client, &c).await;

    let corrected = platform.ensure_isolation(&c).await.expect("ensure after drift");
    let mut changed = corrected.changed.clone();
    changed.sort();
    let want = [format!("NetworkPolicy {ns}/paddock-allow-dns"), format!("ResourceQuota {ns}/paddock-quota")];
    assert_eq!(changed, want, "exactly the deleted policy and the edited quota");
    let quota = quotas.get(isolation::QUOTA_NAME).await.expect("quota");
    let pods = quota.spec.and_then(|s| s.hard).and_then(|h| h.get("pods").cloned()).expect("pods");
    assert_ne!(pods.0, "100000", "paddock's value is back");
    policies.get("paddock-allow-dns").await.expect("the policy is back");
    let after = stored(&client, &c).await;
    let namespace_row = |rows: &[(String, String, BTreeMap<String, String>, String)]| {
        rows.iter().find(|r| r.0.starts_with("Namespace/")).cloned().expect("namespace")
    };
    assert_eq!(namespace_row(&before).1, namespace_row(&after).1, "the namespace was not written");
    assert_eq!(namespace_row(&after).2.get("owner.example/team").map(String::as_str), Some("ops"));

    quota_computed(&client, &c).await;
    let settled = stored(&client, &c).await;
    let again = platform.ensure_isolation(&c).await.expect("ensure once more");
    assert!(again.changed.is_empty(), "{:?}", again.changed);
    let versions = |rows: &[(String, String, BTreeMap<String, String>, String)]| {
        rows.iter().map(|r| (r.0.clone(), r.1.clone())).collect::<Vec<_>>()
    };
    assert_eq!(versions(&settled), versions(&stored(&client, &c).await), "nothing written");
}

fn names(rows: &[(String, String, BTreeMap<String, String>, String)]) -> Vec<&str> {
    rows.iter().map(|r| r.0.as_str()).collect()
}

#[tokio::test]
async fn ensure_isolation_names_and_labels_every_object_from_the_ids() {
    let Some((platform, client)) = setup().await else { return };
    let c = support::cluster("names-and-labels", "c1");
    let done = platform.ensure_isolation(&c).await.expect("ensure");
    assert_eq!(done.namespace, format!("pc-{}", c.cluster_id.uuid().simple()));

    let rows = stored(&client, &c).await;
    let mut got = names(&rows);
    got.sort_unstable();
    let mut want = [
        format!("Namespace/{}", done.namespace),
        "NetworkPolicy/paddock-default-deny".to_owned(),
        "NetworkPolicy/paddock-allow-dns".to_owned(),
        "NetworkPolicy/paddock-allow-control-plane".to_owned(),
        "NetworkPolicy/paddock-allow-datastore".to_owned(),
        "ResourceQuota/paddock-quota".to_owned(),
        "LimitRange/paddock-limits".to_owned(),
    ];
    want.sort_unstable();
    assert_eq!(got, want.iter().map(String::as_str).collect::<Vec<_>>());
    for (name, _, labels, _) in &rows {
        assert_eq!(labels.get("paddock.dev/tenant-id"), Some(&c.tenant_id.to_string()), "{name}");
        assert_eq!(labels.get("paddock.dev/cluster-id"), Some(&c.cluster_id.to_string()), "{name}");
        assert_eq!(labels.get("app.kubernetes.io/managed-by").map(String::as_str), Some("paddock"), "{name}");
    }

    // One field manager, and only through apply.
    let ns = Api::<Namespace>::all(client.clone()).get(&done.namespace).await.expect("namespace");
    let annotations = ns.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("paddock.dev/tenant-name").map(String::as_str), Some("names-and-labels"));
    assert_eq!(annotations.get("paddock.dev/cluster-name").map(String::as_str), Some("c1"));
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &done.namespace);
    for p in policies.list(&ListParams::default()).await.expect("list") {
        let managers: Vec<_> = p
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .map(|m| (m.manager.unwrap_or_default(), m.operation.unwrap_or_default()))
            .collect();
        assert_eq!(managers, vec![("paddock".to_owned(), "Apply".to_owned())]);
    }
}

#[tokio::test]
async fn network_policies_as_stored_select_every_pod_and_deny_by_default() {
    let Some((platform, client)) = setup().await else { return };
    let c = support::cluster("netpol", "c1");
    let ns = platform.ensure_isolation(&c).await.expect("ensure").namespace;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);

    let mut seen = BTreeMap::new();
    for p in policies.list(&ListParams::default()).await.expect("list") {
        let spec = p.spec.expect("spec");
        let selector = spec.pod_selector.clone().unwrap_or_default();
        assert!(
            selector.match_labels.unwrap_or_default().is_empty()
                && selector.match_expressions.unwrap_or_default().is_empty(),
            "{:?} selects every pod",
            p.metadata.name
        );
        seen.insert(p.metadata.name.expect("name"), spec);
    }

    let deny = &seen["paddock-default-deny"];
    assert_eq!(deny.policy_types.as_deref(), Some(&["Ingress".to_owned(), "Egress".to_owned()][..]));
    assert!(deny.ingress.as_deref().unwrap_or_default().is_empty(), "no ingress rule");
    assert!(deny.egress.as_deref().unwrap_or_default().is_empty(), "no egress rule");

    let ports = |rules: Vec<Option<Vec<k8s_openapi::api::networking::v1::NetworkPolicyPort>>>| {
        let mut v: Vec<String> = rules
            .into_iter()
            .flat_map(Option::unwrap_or_default)
            .map(|p| format!("{}/{:?}", p.protocol.unwrap_or_default(), p.port.expect("a port")))
            .collect();
        v.sort();
        v
    };
    let dns = &seen["paddock-allow-dns"];
    assert_eq!(dns.policy_types.as_deref(), Some(&["Egress".to_owned()][..]));
    let dns_rules = dns.egress.clone().unwrap_or_default();
    assert_eq!(ports(dns_rules.iter().map(|r| r.ports.clone()).collect()), ["TCP/Int(53)", "UDP/Int(53)"]);
    let peer = &dns_rules[0].to.clone().expect("a peer")[0];
    assert_eq!(
        peer.namespace_selector.clone().and_then(|s| s.match_labels),
        Some(BTreeMap::from([("kubernetes.io/metadata.name".to_owned(), "kube-system".to_owned())]))
    );
    assert_eq!(
        peer.pod_selector.clone().and_then(|s| s.match_labels),
        Some(BTreeMap::from([("k8s-app".to_owned(), "kube-dns".to_owned())]))
    );

    let cp = &seen["paddock-allow-control-plane"];
    assert_eq!(cp.policy_types.as_deref(), Some(&["Ingress".to_owned()][..]));
    let cp_rules = cp.ingress.clone().unwrap_or_default();
    assert_eq!(ports(cp_rules.iter().map(|r| r.ports.clone()).collect()), ["TCP/Int(6443)", "TCP/Int(8132)"]);

    let ds = &seen["paddock-allow-datastore"];
    assert_eq!(ds.policy_types.as_deref(), Some(&["Egress".to_owned()][..]));
    let ds_rules = ds.egress.clone().unwrap_or_default();
    assert_eq!(ports(ds_rules.iter().map(|r| r.ports.clone()).collect()), ["TCP/Int(2379)"]);
    assert_eq!(seen.len(), 4, "{:?}", seen.keys());
}

#[tokio::test]
async fn quota_and_limit_range_apply_to_a_pod_without_resources() {
    let Some((platform, client)) = setup().await else { return };
    let c = support::cluster("quota", "c1");
    let ns = platform.ensure_isolation(&c).await.expect("ensure").namespace;

    let quota = Api::<ResourceQuota>::namespaced(client.clone(), &ns).get(isolation::QUOTA_NAME).await.expect("quota");
    let hard: BTreeMap<String, String> =
        quota.spec.and_then(|s| s.hard).unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    // The documented per-namespace quota (docs/security.md), written out here rather than read
    // from the implementation's own constant, so that a change to it is a visible contract change.
    let want: BTreeMap<String, String> = [
        ("pods", "20"),
        ("requests.cpu", "8"),
        ("requests.memory", "16Gi"),
        ("limits.cpu", "16"),
        ("limits.memory", "32Gi"),
        ("services", "10"),
        ("services.loadbalancers", "2"),
        ("services.nodeports", "4"),
        ("persistentvolumeclaims", "10"),
        ("requests.storage", "100Gi"),
        ("secrets", "100"),
        ("configmaps", "100"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(hard, want);

    // Admission: the LimitRanger fills in requests and limits, so the quota (which demands them)
    // accepts a pod that has none. Quota admission waits for the controller's first count.
    quota_computed(&client, &c).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = Pod {
        metadata: kube::api::ObjectMeta { name: Some("bare".to_owned()), ..Default::default() },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".to_owned(),
                image: Some("busybox".to_owned()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    // Retried: the `default` ServiceAccount the pod needs comes from a controller, shortly.
    let created = eventually(Duration::from_secs(60), "a pod without resources to be admitted", || {
        let (pods, pod) = (pods.clone(), pod.clone());
        async move {
            pods.create(&PostParams::default(), &pod).await.map_err(|e| eprintln!("pod not admitted yet: {e:?}")).ok()
        }
    })
    .await;
    let resources = created.spec.expect("spec").containers[0].resources.clone().expect("defaulted resources");
    let requests: BTreeMap<String, String> =
        resources.requests.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    assert_eq!(requests.get("cpu").map(String::as_str), Some("100m"));
    assert_eq!(requests.get("memory").map(String::as_str), Some("128Mi"));
    let limits: BTreeMap<String, String> =
        resources.limits.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    assert_eq!(limits.get("cpu").map(String::as_str), Some("1"));
    assert_eq!(limits.get("memory").map(String::as_str), Some("1Gi"));
}

#[tokio::test]
async fn two_clusters_of_two_tenants_get_separate_namespaces() {
    let Some((platform, client)) = setup().await else { return };
    let a = support::cluster("tenant-a", "alpha");
    let b = support::cluster("tenant-b", "beta");
    let ns_a = platform.ensure_isolation(&a).await.expect("ensure a").namespace;
    let ns_b = platform.ensure_isolation(&b).await.expect("ensure b").namespace;
    assert_ne!(ns_a, ns_b);

    for (mine, other, other_ns) in [(&a, &b, &ns_b), (&b, &a, &ns_a)] {
        for (name, _, labels, json) in stored(&client, mine).await {
            assert_eq!(labels.get("paddock.dev/tenant-id"), Some(&mine.tenant_id.to_string()), "{name}");
            for foreign in [other.tenant_id.to_string(), other.cluster_id.to_string(), other_ns.clone()] {
                assert!(!json.contains(&foreign), "{name} of {} mentions {foreign}", mine.cluster_name);
            }
        }
    }
}

#[tokio::test]
async fn an_invalid_setting_is_a_permanent_validation_error() {
    let Some(server) = support::shared().await else { return };
    // A label value with spaces: the API server's NetworkPolicy validation rejects it (422).
    let settings = IsolationSettings { dns_app_label: "not a label".to_owned(), ..IsolationSettings::default() };
    let platform = KubePlatform::new(server.client().await, settings);
    let c = support::cluster("invalid", "c1");
    let err = platform.ensure_isolation(&c).await.expect_err("rejected by validation");
    assert_eq!(err.status_code(), Some(422), "{err:?}");
    assert!(!err.is_transient(), "{err:?}");
    assert!(err.to_string().contains("NetworkPolicy"), "{err}");
}

#[tokio::test]
async fn a_foreign_namespace_with_the_derived_name_is_left_alone() {
    let Some((platform, client)) = setup().await else { return };
    let c = support::cluster("foreign", "c1");
    let ns_name = isolation::namespace_name(c.cluster_id);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let foreign = Namespace {
        metadata: kube::api::ObjectMeta { name: Some(ns_name.clone()), ..Default::default() },
        ..Default::default()
    };
    namespaces.create(&PostParams::default(), &foreign).await.expect("create a namespace by hand");

    let err = platform.ensure_isolation(&c).await.expect_err("not ours");
    assert!(matches!(err, paddock_kube::KubeError::ForeignNamespace { .. }), "{err:?}");
    assert!(!err.is_transient());
    let err = platform.remove_isolation(&c).await.expect_err("not ours to delete");
    assert!(matches!(err, paddock_kube::KubeError::ForeignNamespace { .. }), "{err:?}");
    // Through the trait, as the worker sees it: permanent, with a stable code.
    let driver: &dyn paddock_domain::driver::PlatformDriver = &platform;
    let err = driver.ensure_isolation(&c).await.expect_err("not ours");
    assert_eq!((err.code.as_str(), err.is_transient()), ("foreign_namespace", false), "{err:?}");
    assert!(err.message.contains(&ns_name), "{}", err.message);
    let still = namespaces.get(&ns_name).await.expect("still there");
    assert!(still.metadata.deletion_timestamp.is_none());
    assert!(!still.metadata.labels.unwrap_or_default().contains_key("paddock.dev/cluster-id"), "not adopted");
}
