//! `KubeTenantStack`: the [`TenantStack`] driver (docs/architecture.md, cluster reconciler step 4),
//! the base stack paddock
//! installs into every tenant cluster: a CNI, the NVIDIA device plugin, a storage class, Slinky's
//! CRDs and operator.
//!
//! - **Definitions** are the project's and are versioned: `stacks/<version>.json` at the repository
//!   root, embedded into the binary; their format, parsing and validation are
//!   [`paddock_domain::stack`] (the service layer reads them too).
//! - **Manifests** are the upstream's and are never committed: the provider fills
//!   `PADDOCK_STACKS_DIR/<version>/<file>` with `scripts/stacks-fetch <version> <dir>`, which
//!   downloads (or renders) each file, falls back to the Go module proxy for a file with
//!   `go_module`, and prints its digest next to the pinned one. Before touching
//!   the tenant cluster paddock reads **every** file of the stack and refuses the whole stack when
//!   one file's SHA-256 differs from the definition (`stack_digest_mismatch`, naming the file and
//!   both digests) or is not pinned (`stack_digest_unpinned`): nothing is applied from a stack that
//!   does not verify.
//! - **Applying**: each file is parsed as multi-document YAML (empty documents skipped, `List`s
//!   flattened) and each object is read and, unless it already holds every field of the file's
//!   object ([`crate::apply`]), server-side applied, forced, with the field manager
//!   [`crate::isolation::MANAGER`], through discovery and [`DynamicObject`]: discovery says whether a kind is
//!   namespaced (objects without a namespace go to the component's `namespace`, else `default`) or
//!   cluster-scoped (a stray namespace is dropped). Components go in definition order; inside one,
//!   Namespaces first, then CRDs, then the rest, each group in file order. A kind served by a CRD
//!   this stack just applied may not be discoverable yet: paddock waits for it (bounded), and
//!   reports "not ready" rather than failing when the wait runs out.
//! - **Idempotency, drift and upgrades**: a converged stack is only read; an object edited or
//!   deleted behind paddock's back is applied again and reported in [`StackStatus::changed`]; and
//!   moving to a new stack version rewrites exactly the objects whose content changed. Upstream
//!   objects are applied as they are, plus one label, [`LABEL_STACK_COMPONENT`] (the component's
//!   name: the same in every version, so it never causes a rewrite). Objects dropped by a newer
//!   version are not pruned yet.
//! - **Readiness** per component rule, read from what the API server answered to the apply (CRDs
//!   are read again once at the end, the API server establishes them asynchronously).
//!   [`StackStatus::version`] is the definition's version.
//! - **Versions**: one driver applies every embedded definition; each cluster names its own
//!   (chosen when it was created), so a release that adds a stack moves no existing cluster.
//!
//! Clients are cached per tenant cluster and rebuilt when the admin kubeconfig changes, as in
//! [`crate::nodes`], whose refusal of kubeconfigs that run programs or read files applies here too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::FutureExt;
use kube::core::{ApiResource, DynamicObject, GroupVersion};
use kube::discovery::{ApiCapabilities, Scope};
use kube::{Api, Client};
use paddock_domain::driver::{BoxFuture, DriverError, StackStatus, TenantAccess, TenantStack};
use paddock_domain::stack::{DefinitionError, ReadinessRule, StackDefinition};
use paddock_types::cluster::ClusterKind;
use paddock_types::ClusterId;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tracing::{debug, info, instrument};

use crate::apply::{get_and_converge, Target};
use crate::nodes;
use crate::KubeError;

/// The label paddock puts on every object of the stack: the component it belongs to (stable
/// across stack versions, so it never makes an upgrade rewrite an unchanged object).
pub const LABEL_STACK_COMPONENT: &str = "paddock.dev/stack-component";

/// How long one run waits for a kind whose CRD it just applied to be served.
const SERVED_WAIT: Duration = Duration::from_secs(20);

/// The CRD kind and its API group.
const CRD_KIND: &str = "CustomResourceDefinition";
const CRD_GROUP: &str = "apiextensions.k8s.io";

/// A failure of the stack driver.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// The stack definition is unknown or malformed.
    #[error(transparent)]
    Definition(#[from] DefinitionError),
    /// A manifest file could not be read (typically: the stacks directory was not filled).
    #[error("reading stack manifest {file}")]
    Read {
        /// `<version>/<file>`, relative to the stacks directory.
        file: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A manifest file's digest differs from the definition's.
    #[error("stack manifest {file} has SHA-256 {actual}, but the stack definition pins {expected}")]
    DigestMismatch {
        /// `<version>/<file>`, relative to the stacks directory.
        file: String,
        /// The definition's digest.
        expected: String,
        /// The file's digest.
        actual: String,
    },
    /// The definition pins no digest for a manifest yet.
    #[error("stack manifest {file} (SHA-256 {actual}) has no digest pinned in the stack definition")]
    DigestUnpinned {
        /// `<version>/<file>`, relative to the stacks directory.
        file: String,
        /// The file's digest, to review and pin.
        actual: String,
    },
    /// A manifest file is not YAML.
    #[error("parsing stack manifest {file}")]
    Parse {
        /// `<version>/<file>`, relative to the stacks directory.
        file: String,
        /// Why.
        #[source]
        source: serde_yaml::Error,
    },
    /// A document of a manifest file is not a Kubernetes object.
    #[error("stack manifest {file}, document {index}: {reason}")]
    Invalid {
        /// `<version>/<file>`, relative to the stacks directory.
        file: String,
        /// The document's index in the file, from 0.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The tenant's API server serves no such kind, and no CRD of the stack defines it.
    #[error("stack manifest {file}: the API server serves no {kind} in {api_version}")]
    UnknownKind {
        /// `<version>/<file>`, relative to the stacks directory.
        file: String,
        /// The object's `apiVersion`.
        api_version: String,
        /// The object's `kind`.
        kind: String,
    },
    /// Talking to the tenant cluster failed.
    #[error(transparent)]
    Kube(#[from] KubeError),
}

impl StackError {
    /// The stable snake_case code of this kind of failure (a [`DriverError`]'s `code`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Definition(e) => e.code(),
            Self::Read { .. } => "stack_manifest_unreadable",
            Self::DigestMismatch { .. } => "stack_digest_mismatch",
            Self::DigestUnpinned { .. } => "stack_digest_unpinned",
            Self::Parse { .. } | Self::Invalid { .. } => "stack_manifest_invalid",
            Self::UnknownKind { .. } => "stack_kind_unknown",
            Self::Kube(e) => e.code(),
        }
    }

    /// Whether retrying later may succeed. Everything about the stack's files is the provider's to
    /// fix (retrying the same files cannot help); API failures are classified as in [`KubeError`].
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Kube(e) => e.is_transient(),
            _ => false,
        }
    }

    /// The message of the error and its causes, `: `-separated (never a credential: see
    /// [`KubeError::message_chain`]).
    pub fn message_chain(&self) -> String {
        if let Self::Kube(e) = self {
            return e.message_chain();
        }
        let mut message = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(e) = source {
            message.push_str(": ");
            message.push_str(&e.to_string());
            source = e.source();
        }
        message
    }
}

impl From<StackError> for DriverError {
    fn from(e: StackError) -> Self {
        let (code, message) = (e.code(), e.message_chain());
        if e.is_transient() {
            DriverError::transient(code, message)
        } else {
            DriverError::permanent(code, message)
        }
    }
}

/// One object of a manifest, as read from its file.
#[derive(Debug, Clone)]
struct StackObject {
    /// `<version>/<file>` it comes from (for messages).
    file: String,
    api_version: String,
    kind: String,
    name: String,
    body: Value,
}

impl StackObject {
    fn group(&self) -> &str {
        self.api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or_default()
    }

    /// For a CRD, the `(group, kind)` it defines.
    fn defines(&self) -> Option<(String, String)> {
        if self.kind != CRD_KIND || self.group() != CRD_GROUP {
            return None;
        }
        let spec = self.body.get("spec")?;
        Some((spec.get("group")?.as_str()?.to_owned(), spec.get("names")?.get("kind")?.as_str()?.to_owned()))
    }

    /// Apply-order rank inside a component: Namespaces, then CRDs, then the rest.
    fn rank(&self) -> u8 {
        match (self.group(), self.kind.as_str()) {
            ("", "Namespace") => 0,
            (CRD_GROUP, CRD_KIND) => 1,
            _ => 2,
        }
    }
}

/// A component with its verified, parsed objects in apply order.
#[derive(Debug, Clone)]
struct LoadedComponent {
    name: String,
    namespace: Option<String>,
    ready: Vec<ReadinessRule>,
    objects: Vec<StackObject>,
}

/// Parses the multi-document YAML `text` of `file` into objects (empty documents skipped, `List`
/// items flattened).
fn parse_manifest(file: &str, text: &str) -> Result<Vec<StackObject>, StackError> {
    let mut out = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value =
            Value::deserialize(document).map_err(|source| StackError::Parse { file: file.to_owned(), source })?;
        let items = match value {
            Value::Null => continue,
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str) == Some("List") => {
                o.get("items").and_then(Value::as_array).cloned().unwrap_or_default()
            }
            other => vec![other],
        };
        for body in items {
            let invalid =
                |reason: &str| StackError::Invalid { file: file.to_owned(), index, reason: reason.to_owned() };
            if !body.is_object() {
                return Err(invalid("not a mapping"));
            }
            let field = |v: Option<&Value>| v.and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
            let api_version = field(body.get("apiVersion")).ok_or_else(|| invalid("no apiVersion"))?;
            let kind = field(body.get("kind")).ok_or_else(|| invalid("no kind"))?;
            let name = field(body.pointer("/metadata/name")).ok_or_else(|| invalid("no metadata.name"))?;
            if api_version.parse::<GroupVersion>().is_err() {
                return Err(invalid("malformed apiVersion"));
            }
            out.push(StackObject { file: file.to_owned(), api_version, kind, name, body });
        }
    }
    Ok(out)
}

/// Discovery results of one run, by `apiVersion`.
struct Resolver {
    client: Client,
    served: HashMap<String, Vec<(ApiResource, ApiCapabilities)>>,
}

impl Resolver {
    /// The resource serving `object`'s kind, if the API server serves it. `fresh` re-queries the
    /// group version (after a CRD of it was applied).
    async fn resolve(
        &mut self,
        object: &StackObject,
        fresh: bool,
    ) -> Result<Option<(ApiResource, ApiCapabilities)>, KubeError> {
        if fresh || !self.served.contains_key(&object.api_version) {
            let gv: GroupVersion = object.api_version.parse().unwrap_or_else(|_| GroupVersion::gv("", ""));
            let resources = match kube::discovery::pinned_group(&self.client, &gv).await {
                Ok(group) => group.versioned_resources(&gv.version),
                // Not served (yet): an unknown group version answers 404.
                Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
                Err(kube::Error::Discovery(_)) => Vec::new(),
                Err(source) => {
                    return Err(KubeError::api("discover", "API group version", &object.api_version, source))
                }
            };
            self.served.insert(object.api_version.clone(), resources);
        }
        let served = self.served.get(&object.api_version).into_iter().flatten();
        Ok(served.into_iter().find(|(r, _)| r.kind == object.kind).cloned())
    }
}

/// An object after its apply, for the readiness rules.
struct Applied {
    component: usize,
    kind: String,
    group: String,
    /// `namespace/name` or `name`.
    full_name: String,
    api: Api<DynamicObject>,
    name: String,
    object: DynamicObject,
}

/// A client for one tenant cluster.
#[derive(Clone)]
struct TenantClient {
    /// SHA-256 of the kubeconfig it was built from (to notice a rotated kubeconfig).
    fingerprint: [u8; 32],
    client: Client,
}

/// The tenant base stacks, by version, applied from a stacks directory.
pub struct KubeTenantStack {
    stacks_dir: PathBuf,
    definitions: BTreeMap<String, StackDefinition>,
    clients: Mutex<HashMap<ClusterId, TenantClient>>,
}

impl Debug for KubeTenantStack {
    // The clients hold credentials: show nothing of them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTenantStack")
            .field("stacks_dir", &self.stacks_dir)
            .field("versions", &self.definitions.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl KubeTenantStack {
    /// Every embedded stack definition (see [`paddock_domain::stack::DEFINITIONS`]), their
    /// manifests read from `stacks_dir/<version>/` (`PADDOCK_STACKS_DIR`); the files are checked
    /// by [`Self::verify`] and on every run.
    pub fn new(stacks_dir: PathBuf) -> Self {
        let definitions = paddock_domain::stack::definitions().map(|d| (d.version.clone(), d.clone())).collect();
        Self { stacks_dir, definitions, clients: Mutex::new(HashMap::new()) }
    }

    /// Stacks from definitions that are not embedded (tests, or a provider's own stacks).
    pub fn with_definitions(
        stacks_dir: PathBuf,
        definitions: impl IntoIterator<Item = StackDefinition>,
    ) -> Result<Self, StackError> {
        let mut by_version = BTreeMap::new();
        for definition in definitions {
            definition.validate()?;
            by_version.insert(definition.version.clone(), definition);
        }
        Ok(Self { stacks_dir, definitions: by_version, clients: Mutex::new(HashMap::new()) })
    }

    /// The definition of stack `version`.
    pub fn definition(&self, version: &str) -> Result<&StackDefinition, StackError> {
        self.definitions.get(version).ok_or_else(|| {
            let known = self.definitions.keys().cloned().collect::<Vec<_>>().join(", ");
            StackError::Definition(DefinitionError::UnknownVersion { version: version.to_owned(), known })
        })
    }

    /// The definitions this driver applies, oldest first.
    pub fn definitions(&self) -> impl Iterator<Item = &StackDefinition> {
        self.definitions.values()
    }

    /// Reads every manifest of stack `version` and checks its digest and that it parses, without
    /// talking to any cluster (for a start-up check).
    pub fn verify(&self, version: &str) -> Result<(), StackError> {
        self.load(self.definition(version)?).map(drop)
    }

    /// Every component with its verified objects in apply order; fails on the first file that
    /// is missing, does not match its digest, or does not parse.
    fn load(&self, definition: &StackDefinition) -> Result<Vec<LoadedComponent>, StackError> {
        let version = &definition.version;
        let mut out = Vec::new();
        for component in &definition.components {
            let mut objects = Vec::new();
            for manifest in &component.manifests {
                let file = format!("{version}/{}", manifest.file);
                let path = self.stacks_dir.join(version).join(&manifest.file);
                let bytes = std::fs::read(&path).map_err(|source| StackError::Read { file: file.clone(), source })?;
                let actual = hex::encode(Sha256::digest(&bytes));
                match &manifest.sha256 {
                    None => return Err(StackError::DigestUnpinned { file, actual }),
                    Some(expected) if *expected != actual => {
                        return Err(StackError::DigestMismatch { file, expected: expected.clone(), actual })
                    }
                    Some(_) => {}
                }
                let text = String::from_utf8(bytes).map_err(|_| StackError::Invalid {
                    file: file.clone(),
                    index: 0,
                    reason: "not UTF-8".to_owned(),
                })?;
                objects.extend(parse_manifest(&file, &text)?);
            }
            // Stable: file order is kept within each rank.
            objects.sort_by_key(StackObject::rank);
            out.push(LoadedComponent {
                name: component.name.clone(),
                namespace: component.namespace.clone(),
                ready: component.ready.clone(),
                objects,
            });
        }
        Ok(out)
    }

    /// The (cached) client of the tenant cluster.
    async fn client(&self, tenant: &TenantAccess) -> Result<Client, KubeError> {
        let cluster_id = tenant.cluster.cluster_id;
        let kubeconfig = tenant.admin_kubeconfig.expose();
        let fingerprint: [u8; 32] = Sha256::digest(kubeconfig.as_bytes()).into();
        if let Some(cached) = self.cache().get(&cluster_id).filter(|c| c.fingerprint == fingerprint) {
            return Ok(cached.client.clone());
        }
        // The same checks as for the nodes driver: no programs run, no local files read, a CA.
        let (client, _ca_bundle) = nodes::admin_client(cluster_id, nodes::admin_kubeconfig(tenant)?).await?;
        self.cache().insert(cluster_id, TenantClient { fingerprint, client: client.clone() });
        Ok(client)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<ClusterId, TenantClient>> {
        // A panic while holding the lock cannot leave the map half-updated: recover it.
        self.clients.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Verifies the stack's files, applies every object in order into the tenant cluster and
    /// reports readiness (see the module documentation).
    #[instrument(skip_all, fields(cluster.id = %tenant.cluster.cluster_id, stack.version = %version))]
    pub async fn ensure(
        &self,
        tenant: &TenantAccess,
        version: &str,
        kind: ClusterKind,
    ) -> Result<StackStatus, StackError> {
        // Only the components applied into clusters of this kind (KubeRay only into `ray` ones).
        let mut definition = self.definition(version)?.clone();
        definition.components.retain(|c| c.applies_to(kind.as_str()));
        // Every file is verified before the first write: a stack that does not verify applies nothing.
        let components = self.load(&definition)?;
        let version = version.to_owned();
        let client = self.client(tenant).await?;
        // The kinds the stack's own CRDs define, which may be served only once those are applied.
        let defined: BTreeSet<(String, String)> =
            components.iter().flat_map(|c| &c.objects).filter_map(StackObject::defines).collect();
        let mut resolver = Resolver { client: client.clone(), served: HashMap::new() };
        let mut applied = Vec::new();
        let mut changed = Vec::new();
        for (index, component) in components.iter().enumerate() {
            let own_namespace = component.namespace.as_ref().and_then(|ns| namespace_object(ns, &component.objects));
            for object in own_namespace.iter().chain(&component.objects) {
                let (found, c) = self.apply(&mut resolver, &defined, index, component, object).await?;
                changed.extend(c);
                let Some(found) = found else {
                    // A kind of the stack's own CRDs is not served yet: the next run goes on.
                    let reason = format!(
                        "component {}: waiting for the API server to serve {} {}",
                        component.name, object.api_version, object.kind
                    );
                    info!(changed = changed.len(), "{reason}");
                    return Ok(StackStatus { ready: false, reason, version, changed });
                };
                applied.push(found);
            }
        }
        let waiting = readiness(&components, &mut applied).await?;
        if changed.is_empty() {
            debug!(objects = applied.len(), ready = waiting.is_empty(), "stack {version} holds");
        } else {
            info!(objects = applied.len(), changed = ?changed, ready = waiting.is_empty(), "applied stack {version}");
        }
        Ok(StackStatus { ready: waiting.is_empty(), reason: waiting.join("; "), version, changed })
    }

    /// Applies one object unless it holds already; None when its kind is defined by a CRD of the
    /// stack that is not served yet. Second: the object (`Kind ns/name`) when this created or
    /// corrected it.
    async fn apply(
        &self,
        resolver: &mut Resolver,
        defined: &BTreeSet<(String, String)>,
        index: usize,
        component: &LoadedComponent,
        object: &StackObject,
    ) -> Result<(Option<Applied>, Option<String>), StackError> {
        let mut found = resolver.resolve(object, false).await?;
        if found.is_none() {
            if !defined.contains(&(object.group().to_owned(), object.kind.clone())) {
                return Err(StackError::UnknownKind {
                    file: object.file.clone(),
                    api_version: object.api_version.clone(),
                    kind: object.kind.clone(),
                });
            }
            // The CRD was applied moments ago: wait (bounded) until the API server serves it.
            let deadline = Instant::now() + SERVED_WAIT;
            while found.is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(250)).await;
                found = resolver.resolve(object, true).await?;
            }
        }
        let Some((resource, caps)) = found else { return Ok((None, None)) };
        let mut body = object.body.clone();
        label(&mut body, &component.name);
        let (api, full_name): (Api<DynamicObject>, String) = match caps.scope {
            Scope::Namespaced => {
                let ns = body
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .or_else(|| component.namespace.clone())
                    .unwrap_or_else(|| "default".to_owned());
                body["metadata"]["namespace"] = Value::String(ns.clone());
                (Api::namespaced_with(resolver.client.clone(), &ns, &resource), format!("{ns}/{}", object.name))
            }
            Scope::Cluster => {
                // kubectl ignores a namespace on a cluster-scoped object; so does paddock.
                if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("namespace");
                }
                (Api::all_with(resolver.client.clone(), &resource), object.name.clone())
            }
        };
        let what = format!("{} {full_name}", object.kind);
        let target = Target { kind: "stack object", name: &object.name, full_name: &what };
        let converged = get_and_converge(&api, target, &body).await?;
        debug!(component = %component.name, changed = converged.changed, "ensured {what}");
        let (result, changed) = (converged.object, converged.changed.then_some(what));
        let applied = Applied {
            component: index,
            kind: object.kind.clone(),
            group: object.group().to_owned(),
            full_name,
            api,
            name: object.name.clone(),
            object: result,
        };
        Ok((Some(applied), changed))
    }
}

/// Puts [`LABEL_STACK_COMPONENT`] on an object's apply body. Besides marking what the stack
/// owns, it makes paddock own at least one field of every object: an apply owning none (an
/// upstream Namespace with just a name) leaves no managedFields entry, and the next apply then
/// records the API server's defaults under `before-first-apply`, a write that would repeat on
/// every fresh object and break "a converged stack writes nothing".
fn label(body: &mut Value, component: &str) {
    let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if !labels.is_object() {
        *labels = json!({});
    }
    labels[LABEL_STACK_COMPONENT] = Value::String(component.to_owned());
}

/// The Namespace object paddock applies for a component's `namespace`, unless the component's
/// manifests carry it themselves (then theirs is applied, unchanged, in its place).
fn namespace_object(ns: &str, objects: &[StackObject]) -> Option<StackObject> {
    if objects.iter().any(|o| o.rank() == 0 && o.name == ns) {
        return None;
    }
    Some(StackObject {
        file: "(component namespace)".to_owned(),
        api_version: "v1".to_owned(),
        kind: "Namespace".to_owned(),
        name: ns.to_owned(),
        body: json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } }),
    })
}

/// The reasons the stack is not ready (empty: ready), per component rule.
async fn readiness(components: &[LoadedComponent], applied: &mut [Applied]) -> Result<Vec<String>, StackError> {
    let mut waiting = Vec::new();
    for a in applied.iter_mut() {
        let component = &components[a.component];
        let rules = &component.ready;
        let why = match (a.group.as_str(), a.kind.as_str()) {
            (CRD_GROUP, CRD_KIND) if rules.contains(&ReadinessRule::CrdsEstablished) => {
                if !crd_established(&a.object) {
                    // The API server establishes a new CRD asynchronously: read it once more.
                    let what = format!("{} {}", a.kind, a.full_name);
                    a.object = a
                        .api
                        .get(&a.name)
                        .await
                        .map_err(|source| KubeError::api("get", "stack object", what, source))?;
                }
                (!crd_established(&a.object)).then(|| "not Established".to_owned())
            }
            ("apps", kind @ ("Deployment" | "DaemonSet" | "StatefulSet"))
                if rules.contains(&ReadinessRule::WorkloadsAvailable) =>
            {
                workload_unavailable(kind, &a.object)
            }
            _ => None,
        };
        if let Some(why) = why {
            waiting.push(format!("component {}: {} {} {why}", component.name, a.kind, a.full_name));
        }
    }
    Ok(waiting)
}

fn crd_established(crd: &DynamicObject) -> bool {
    let conditions = crd.data.pointer("/status/conditions").and_then(Value::as_array);
    conditions.into_iter().flatten().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("Established")
            && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

/// Why a Deployment, DaemonSet or StatefulSet is not available yet, or None when it is: its
/// controller observed the current generation and every desired replica is updated and available.
fn workload_unavailable(kind: &str, o: &DynamicObject) -> Option<String> {
    let int = |p: &str| o.data.pointer(p).and_then(Value::as_i64);
    let generation = o.metadata.generation.unwrap_or(0);
    if int("/status/observedGeneration").unwrap_or(-1) < generation {
        return Some("not observed by its controller yet".to_owned());
    }
    let (desired, updated, available) = match kind {
        "DaemonSet" => (
            int("/status/desiredNumberScheduled").unwrap_or(0),
            int("/status/updatedNumberScheduled").unwrap_or(0),
            int("/status/numberAvailable").unwrap_or(0),
        ),
        _ => (
            // The API server defaults spec.replicas to 1.
            int("/spec/replicas").unwrap_or(1),
            int("/status/updatedReplicas").unwrap_or(0),
            int("/status/availableReplicas").unwrap_or(0),
        ),
    };
    (updated < desired || available < desired)
        .then(|| format!("not available ({available}/{desired} available, {updated}/{desired} updated)"))
}

impl TenantStack for KubeTenantStack {
    fn ensure_stack<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        kind: ClusterKind,
    ) -> BoxFuture<'a, Result<StackStatus, DriverError>> {
        async move { self.ensure(tenant, version, kind).await.map_err(DriverError::from) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_parse_as_multi_document_yaml_in_apply_order() {
        let text = "---\n# a comment-only document\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n\
                    ---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
                    metadata: {name: xs.example.com}\nspec: {group: example.com, names: {kind: X}}\n---\n\
                    apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: n}}\n";
        let mut objects = parse_manifest("v/f.yaml", text).expect("parses");
        objects.sort_by_key(StackObject::rank);
        let kinds: Vec<_> = objects.iter().map(|o| o.kind.as_str()).collect();
        assert_eq!(kinds, ["Namespace", "CustomResourceDefinition", "Deployment"]);
        assert_eq!(objects[1].defines(), Some(("example.com".to_owned(), "X".to_owned())));

        let e = parse_manifest("v/f.yaml", "kind: Deployment\nmetadata: {name: d}\n").expect_err("no apiVersion");
        assert_eq!(e.code(), "stack_manifest_invalid");
        assert!(e.to_string().contains("v/f.yaml, document 0: no apiVersion"), "{e}");
    }

    #[test]
    fn digest_mismatches_name_the_file_and_both_digests_and_are_permanent() {
        let e = DriverError::from(StackError::DigestMismatch {
            file: "1/a.yaml".to_owned(),
            expected: "aa".to_owned(),
            actual: "bb".to_owned(),
        });
        assert_eq!(e.code, "stack_digest_mismatch");
        assert!(!e.is_transient());
        assert!(
            e.message.contains("1/a.yaml") && e.message.contains("aa") && e.message.contains("bb"),
            "{}",
            e.message
        );
    }

    #[test]
    fn workloads_are_available_once_observed_updated_and_available() {
        let object = |data: Value, generation: i64| {
            let mut o: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "generation": generation}
            }))
            .expect("object");
            o.data = data;
            o
        };
        let d = object(json!({"spec": {"replicas": 2}}), 1);
        assert!(workload_unavailable("Deployment", &d).is_some());
        let d = object(
            json!({"spec": {"replicas": 2}, "status": {"observedGeneration": 1, "updatedReplicas": 2, "availableReplicas": 2}}),
            1,
        );
        assert_eq!(workload_unavailable("Deployment", &d), None);
        let ds = object(
            json!({"status": {"observedGeneration": 3, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 1}}),
            3,
        );
        assert!(workload_unavailable("DaemonSet", &ds).is_some());
    }
}
