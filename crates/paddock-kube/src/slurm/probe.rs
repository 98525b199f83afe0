//! Talking to slurmrestd: the [`SlurmProbe`] seam and its production implementation
//! [`ServiceProxyProbe`], which goes through the tenant API server's service proxy
//! (`/api/v1/namespaces/<ns>/services/<restapi service>:6820/proxy/...`), so paddock needs no
//! network path into the tenant cluster beyond the API server it already reaches.
//!
//! slurmrestd authenticates with a JWT (`auth/jwt`): HS256 over the key in the Secret
//! [`super::SECRET_JWT`] (read from the tenant cluster on every call, never logged), claims
//! `iat`, `exp` (5 minutes) and `sun` (the Slurm user, [`SLURM_USER`]), sent as the
//! `X-SLURM-USER-TOKEN` header (the API server strips `Authorization` before proxying, but passes
//! other headers through).
//!
//! Every call speaks the slurmrestd data-parser version the cluster's release pins in its stack's
//! catalogue (`rest_api.paddock`, [`super::Images::rest_api_version`]): `/slurm/<version>/...`.

use std::time::{SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use paddock_domain::driver::{demand_unsupported, BoxFuture, DriverError, TenantAccess};
use paddock_domain::slurm_identity::{Change, Slurmdb};
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::debug;

use super::demand::{parse_jobs, parse_nodes, SlurmNode, SlurmQueue};
use super::{NAMESPACE, RESTAPI_PORT, RESTAPI_SERVICE, SECRET_JWT, SECRET_JWT_KEY};
use crate::KubeError;

/// The Slurm user paddock's tokens are for (the operator's `SlurmUser`).
pub const SLURM_USER: &str = "slurm";
/// Lifetime of a token paddock signs.
const TOKEN_TTL_SECONDS: u64 = 300;

/// What paddock asks of slurmrestd. The production implementation is [`ServiceProxyProbe`];
/// tests use stand-ins.
pub trait SlurmProbe: Send + Sync {
    /// Whether slurmrestd answers `GET /slurm/<version>/ping` with a responding controller
    /// (`version`: the data-parser version the cluster's release pins).
    fn ping<'a>(&'a self, tenant: &'a TenantAccess, version: &'a str) -> BoxFuture<'a, Result<bool, DriverError>>;

    /// Sets the Slurm node `slurm_node` to DRAIN with `reason` unless it already drains with a
    /// reason of paddock's ([`REASON_PREFIX`]: a DRAIN someone else set, the operator's
    /// `slurm-operator: ` reasons included, gets paddock's reason, which the operator never
    /// takes back: it undrains only nodes whose reason is its own or empty), and reports whether
    /// it is drained now (no job left on it): `Some(true)`; still draining: `Some(false)`; `None`
    /// when Slurm does not know the node. Speaks `version` as `ping` does.
    fn drain<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        slurm_node: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<Option<bool>, DriverError>>;

    /// Every Slurm node with its state flags and reason (`GET /slurm/<version>/nodes`; none when
    /// slurmrestd answers 404). Speaks `version` as `ping` does.
    fn nodes<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SlurmNode>, DriverError>>;

    /// Every job and every node slurmctld knows (`GET /slurm/<version>/jobs/` and
    /// `GET /slurm/<version>/nodes/`), for the demand of elastic pools (`slurm/demand.rs`).
    /// Speaks `version` as `ping` does. A stand-in that cannot answer it says
    /// `demand_unsupported`.
    fn queue<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
    ) -> BoxFuture<'a, Result<SlurmQueue, DriverError>> {
        let _ = (tenant, version);
        Box::pin(async { Err(demand_unsupported()) })
    }

    /// Slurm's accounting of cluster `cluster` (`GET /slurmdb/<version>/qos/`, `accounts/`,
    /// `users/`, `associations/`; `slurm/accounting.rs`). A stand-in that cannot answer it says
    /// `identity_unsupported`.
    fn slurmdb<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        cluster: &'a str,
    ) -> BoxFuture<'a, Result<Slurmdb, DriverError>> {
        let _ = (tenant, version, cluster);
        super::accounting::unsupported()
    }

    /// Makes one change in the accounting of cluster `cluster` (`slurm/accounting.rs`).
    fn slurmdb_write<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        cluster: &'a str,
        change: &'a Change,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        let _ = (tenant, version, cluster, change);
        super::accounting::unsupported()
    }

    /// Cancels the jobs `filter` selects (`DELETE /slurm/<version>/jobs/`; `slurm/accounting.rs`).
    fn cancel_jobs<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        filter: &'a Value,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        let _ = (tenant, version, filter);
        super::accounting::unsupported()
    }
}

/// slurmrestd through the tenant API server's service proxy (see the module documentation).
#[derive(Debug, Clone)]
pub struct ServiceProxyProbe {
    namespace: String,
}

impl Default for ServiceProxyProbe {
    fn default() -> Self {
        Self::new(NAMESPACE)
    }
}

#[derive(Deserialize)]
struct PingAnswer {
    #[serde(default)]
    pings: Vec<Ping>,
    #[serde(default)]
    errors: Vec<Value>,
}

#[derive(Deserialize)]
struct Ping {
    #[serde(default)]
    pinged: String,
    #[serde(default)]
    responding: Option<bool>,
}

/// Whether a ping answer shows a responding controller and no error.
pub fn ping_succeeded(body: &str) -> bool {
    let Ok(answer) = serde_json::from_str::<PingAnswer>(body) else { return false };
    answer.errors.is_empty() && answer.pings.iter().any(|p| p.responding == Some(true) || p.pinged == "UP")
}

/// Whether a node's `state` flags (slurmrestd's `nodes[].state`) say drained: DRAIN set and no
/// job on it any more (not ALLOCATED, MIXED or COMPLETING).
pub fn node_drained(states: &[String]) -> bool {
    let has = |s: &str| states.iter().any(|x| x.eq_ignore_ascii_case(s));
    has("DRAIN") && !has("ALLOCATED") && !has("MIXED") && !has("COMPLETING")
}

/// The prefix of every Slurm node reason paddock writes (`paddock:release: ...`).
pub const REASON_PREFIX: &str = "paddock:";

/// Whether a node with `states` and `reason` needs paddock's DRAIN request: it does not drain
/// yet, or it drains for a reason that is not paddock's.
pub fn needs_drain(states: &[String], reason: &str) -> bool {
    !states.iter().any(|s| s.eq_ignore_ascii_case("DRAIN")) || !reason.starts_with(REASON_PREFIX)
}

fn node_states(body: &str) -> Option<(Vec<String>, String)> {
    let v: Value = serde_json::from_str(body).ok()?;
    let node = v.get("nodes")?.as_array()?.first()?;
    let states = node.get("state")?.as_array()?;
    let reason = node.get("reason").and_then(Value::as_str).unwrap_or_default().to_owned();
    Some((states.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect(), reason))
}

impl ServiceProxyProbe {
    /// A probe for Slurm in `namespace` of the tenant clusters (the driver's namespace).
    pub fn new(namespace: impl Into<String>) -> Self {
        Self { namespace: namespace.into() }
    }

    /// A token for [`SLURM_USER`] signed with the cluster's JWT key (read from the tenant cluster).
    async fn token(&self, client: &Client) -> Result<String, DriverError> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &self.namespace);
        let name = format!("{}/{SECRET_JWT}", self.namespace);
        let secret = secrets
            .get_opt(SECRET_JWT)
            .await
            .map_err(|source| KubeError::api("get", "Secret", name.as_str(), source))?;
        let key = secret.and_then(|s| s.data).and_then(|mut d| d.remove(SECRET_JWT_KEY)).ok_or_else(|| {
            DriverError::transient("slurm_jwt_key_missing", format!("Secret {name} has no {SECRET_JWT_KEY} (yet)"))
        })?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
        let claims = json!({ "iat": now, "exp": now + TOKEN_TTL_SECONDS, "sun": SLURM_USER });
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(&key.0))
            .map_err(|e| DriverError::permanent("slurm_jwt_sign_failed", format!("signing a slurmrestd token: {e}")))
    }

    /// The service-proxy path of `path` below `/slurm/<version>/` on the cluster's slurmrestd.
    #[cfg(test)]
    fn uri(&self, version: &str, path: &str) -> String {
        self.uri_in("slurm", version, path)
    }

    /// The service-proxy path of `path` below `/<plugin>/<version>/` (`slurm`, `slurmdb`).
    fn uri_in(&self, plugin: &str, version: &str, path: &str) -> String {
        format!(
            "/api/v1/namespaces/{}/services/{RESTAPI_SERVICE}:{RESTAPI_PORT}/proxy/{plugin}/{version}/{path}",
            self.namespace
        )
    }

    /// `method` `path` (below `/slurm/<version>/`) on slurmrestd; Ok(None) when it answers 404.
    async fn call(
        &self,
        tenant: &TenantAccess,
        request: (&str, &str, &str),
        body: Option<&Value>,
    ) -> Result<Option<String>, DriverError> {
        self.call_in("slurm", tenant, request, body).await
    }

    /// `method` `path` (below `/<plugin>/<version>/`) on slurmrestd; Ok(None) when it answers 404.
    pub(super) async fn call_in(
        &self,
        plugin: &str,
        tenant: &TenantAccess,
        (method, version, path): (&str, &str, &str),
        body: Option<&Value>,
    ) -> Result<Option<String>, DriverError> {
        let client = crate::nodes::tenant_client(tenant).await?;
        let token = self.token(&client).await?;
        let uri = self.uri_in(plugin, version, path);
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let request = http::Request::builder()
            .method(method)
            .uri(uri.as_str())
            .header("X-SLURM-USER-NAME", SLURM_USER)
            .header("X-SLURM-USER-TOKEN", token)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .body(bytes)
            .map_err(|e| DriverError::permanent("slurm_rest_request_invalid", format!("{method} {uri}: {e}")))?;
        match client.request_text(request).await {
            Ok(text) => Ok(Some(text)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(source) => {
                let what = format!("slurmrestd {method} /{plugin}/{version}/{path}");
                Err(KubeError::api("proxy", "Service", what, source).into())
            }
        }
    }

    /// See [`SlurmProbe::ping`].
    pub async fn ping(&self, tenant: &TenantAccess, version: &str) -> Result<bool, DriverError> {
        let answer = self.call(tenant, ("GET", version, "ping"), None).await?;
        let ok = answer.as_deref().is_some_and(ping_succeeded);
        debug!(cluster.id = %tenant.cluster.cluster_id, ok, "pinged slurmrestd");
        Ok(ok)
    }

    /// See [`SlurmProbe::drain`].
    pub async fn drain(
        &self,
        tenant: &TenantAccess,
        version: &str,
        slurm_node: &str,
        reason: &str,
    ) -> Result<Option<bool>, DriverError> {
        let path = format!("node/{slurm_node}");
        let Some(before) = self.call(tenant, ("GET", version, &path), None).await? else { return Ok(None) };
        let Some((states, current)) = node_states(&before) else { return Ok(None) };
        if !needs_drain(&states, &current) {
            return Ok(Some(node_drained(&states)));
        }
        let update = json!({ "state": ["DRAIN"], "reason": reason });
        if self.call(tenant, ("POST", version, &path), Some(&update)).await?.is_none() {
            return Ok(None);
        }
        let after = self.call(tenant, ("GET", version, &path), None).await?;
        Ok(after.as_deref().and_then(node_states).map(|(s, _)| node_drained(&s)))
    }
}

impl ServiceProxyProbe {
    /// See [`SlurmProbe::nodes`]. An answer that is not a node list is an error (a slurmrestd
    /// that answers but cannot reach its controller answers with `errors`).
    pub async fn nodes(&self, tenant: &TenantAccess, version: &str) -> Result<Vec<SlurmNode>, DriverError> {
        let Some(answer) = self.call(tenant, ("GET", version, "nodes"), None).await? else { return Ok(Vec::new()) };
        parse_nodes(&answer).map_err(|why| {
            DriverError::transient("slurm_nodes_unreadable", format!("slurmrestd GET /slurm/{version}/nodes: {why}"))
        })
    }

    /// `GET` `path` (below `/slurm/<version>/`), which must answer.
    async fn read(&self, tenant: &TenantAccess, version: &str, path: &str) -> Result<String, DriverError> {
        self.call(tenant, ("GET", version, path), None).await?.ok_or_else(|| {
            let message = format!("slurmrestd does not serve GET /slurm/{version}/{path} (404)");
            DriverError::transient("slurm_rest_not_found", message)
        })
    }

    /// See [`SlurmProbe::queue`]. An answer that is not the documented shape, or that reports
    /// errors, is a transient failure (slurmctld may be restarting).
    pub async fn queue(&self, tenant: &TenantAccess, version: &str) -> Result<SlurmQueue, DriverError> {
        let invalid = |what: &str, why: String| {
            DriverError::transient("slurm_rest_answer_invalid", format!("slurmrestd's {what} of {version}: {why}"))
        };
        let jobs = parse_jobs(&self.read(tenant, version, "jobs/").await?).map_err(|e| invalid("job list", e))?;
        let nodes = parse_nodes(&self.read(tenant, version, "nodes/").await?).map_err(|e| invalid("node list", e))?;
        debug!(cluster.id = %tenant.cluster.cluster_id, jobs = jobs.len(), nodes = nodes.len(), "read Slurm's queue");
        Ok(SlurmQueue { jobs, nodes })
    }
}

impl SlurmProbe for ServiceProxyProbe {
    fn queue<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
    ) -> BoxFuture<'a, Result<SlurmQueue, DriverError>> {
        ServiceProxyProbe::queue(self, tenant, version).boxed()
    }

    fn ping<'a>(&'a self, tenant: &'a TenantAccess, version: &'a str) -> BoxFuture<'a, Result<bool, DriverError>> {
        ServiceProxyProbe::ping(self, tenant, version).boxed()
    }

    fn drain<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        slurm_node: &'a str,
        reason: &'a str,
    ) -> BoxFuture<'a, Result<Option<bool>, DriverError>> {
        ServiceProxyProbe::drain(self, tenant, version, slurm_node, reason).boxed()
    }

    fn nodes<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SlurmNode>, DriverError>> {
        ServiceProxyProbe::nodes(self, tenant, version).boxed()
    }

    fn slurmdb<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        cluster: &'a str,
    ) -> BoxFuture<'a, Result<Slurmdb, DriverError>> {
        ServiceProxyProbe::slurmdb(self, tenant, version, cluster).boxed()
    }

    fn slurmdb_write<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        cluster: &'a str,
        change: &'a Change,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        ServiceProxyProbe::slurmdb_write(self, tenant, version, cluster, change).boxed()
    }

    fn cancel_jobs<'a>(
        &'a self,
        tenant: &'a TenantAccess,
        version: &'a str,
        filter: &'a Value,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        ServiceProxyProbe::cancel_jobs(self, tenant, version, filter).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_succeeds_only_with_a_responding_controller_and_no_errors() {
        let up = r#"{"pings":[{"hostname":"slurm-controller-0","pinged":"UP","latency":120,"mode":"primary",
                     "primary":true,"responding":true}],"meta":{},"errors":[],"warnings":[]}"#;
        assert!(ping_succeeded(up));
        let down = r#"{"pings":[{"hostname":"slurm-controller-0","pinged":"DOWN","responding":false}],"errors":[]}"#;
        assert!(!ping_succeeded(down));
        let failed = r#"{"pings":[],"errors":[{"error":"Unable to contact slurmctld"}]}"#;
        assert!(!ping_succeeded(failed));
        assert!(!ping_succeeded("not json"));
    }

    #[test]
    fn calls_speak_the_version_they_are_given() {
        let probe = ServiceProxyProbe::new("slurm");
        assert_eq!(
            probe.uri("v0.0.43", "ping"),
            "/api/v1/namespaces/slurm/services/slurm-restapi:6820/proxy/slurm/v0.0.43/ping"
        );
        // What the driver gives it: the version the cluster's release pins in its stack.
        let catalog = crate::slurm::SlurmCatalog::embedded();
        for (stack, slurm) in [("2026.12.1", "26.05"), ("2026.12.1", "25.11"), ("2026.12.0", "25.11")] {
            let images = catalog.images(stack, slurm).expect("a release of the stack");
            assert_eq!(images.rest_api_version(), "v0.0.42", "{stack} {slurm}");
        }
    }

    #[test]
    fn drained_means_drain_and_no_jobs() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert!(node_drained(&s(&["IDLE", "DRAIN"])));
        assert!(node_drained(&s(&["DOWN", "DRAIN"])));
        assert!(!node_drained(&s(&["ALLOCATED", "DRAIN"])));
        assert!(!node_drained(&s(&["MIXED", "DRAIN"])));
        assert!(!node_drained(&s(&["IDLE"])));
        assert_eq!(
            node_states(r#"{"nodes":[{"name":"cpu-0","state":["IDLE","DRAIN"]}]}"#),
            Some((s(&["IDLE", "DRAIN"]), String::new()))
        );
        assert_eq!(
            node_states(r#"{"nodes":[{"name":"cpu-0","state":["DRAIN"],"reason":"paddock:release: x"}]}"#),
            Some((s(&["DRAIN"]), "paddock:release: x".to_owned()))
        );
        assert_eq!(node_states(r#"{"nodes":[]}"#), None);
    }

    #[test]
    fn a_node_list_reads_names_states_and_reasons() {
        // The shape of slurmrestd v0.0.42's `GET /slurm/v0.0.42/nodes` (fields cut).
        let body = r#"{"nodes":[{"name":"cpu-0","state":["IDLE","DRAIN"],"reason":"paddock:hw: ecc",
            "reason_set_by_user":"root","partitions":["cpu"]},{"name":"cpu-1","state":["IDLE"],"reason":""},
            {"name":"cpu-2","state":["MIXED"]}],"meta":{},"errors":[],"warnings":[]}"#;
        let nodes = parse_nodes(body).expect("a node list");
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let node = |name: &str, state: &[&str], reason: &str| SlurmNode {
            name: name.into(),
            state: s(state),
            reason: reason.into(),
            ..SlurmNode::default()
        };
        assert_eq!(
            nodes,
            [
                node("cpu-0", &["IDLE", "DRAIN"], "paddock:hw: ecc"),
                node("cpu-1", &["IDLE"], ""),
                node("cpu-2", &["MIXED"], "")
            ]
        );
        assert!(parse_nodes(r#"{"nodes":[],"errors":[{"error":"Unable to contact slurmctld"}]}"#).is_err());
        assert!(parse_nodes("not json").is_err());
    }

    #[test]
    fn a_drain_of_someone_else_gets_paddocks_reason() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert!(needs_drain(&s(&["IDLE"]), ""));
        assert!(needs_drain(&s(&["IDLE"]), "paddock:release: machine released"), "not drained yet");
        assert!(needs_drain(&s(&["IDLE", "DRAIN"]), "slurm-operator: Pod (slurm/cpu-1) was cordoned"));
        assert!(needs_drain(&s(&["ALLOCATED", "DRAIN"]), "tenant maintenance"));
        assert!(!needs_drain(&s(&["ALLOCATED", "DRAIN"]), "paddock:release: machine released"));
        assert!(!needs_drain(&s(&["IDLE", "DRAIN"]), "paddock:hw: ecc"), "another paddock reason stays");
    }
}
