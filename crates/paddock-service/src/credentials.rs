//! Tenant cluster credentials: how paddock reaches a tenant cluster's own API server (the sealed
//! admin kubeconfig, shared by the worker and the API), and the tenant's own kubeconfig
//! (`GET /v1/tenants/{tenant_id}/clusters/{cluster_id}/kubeconfig`, docs/api.md, docs/tenants.md).
//!
//! The tenant's kubeconfig holds a TokenRequest token of a per-cluster ServiceAccount bound to
//! cluster-admin (made by the [`TenantCredentials`] driver), never the admin kubeconfig. Only
//! `tenant:admin` (own tenant) and `provider:admin` may get one; every call is audited
//! (`cluster.kubeconfig`, success and failure), and the audit details never hold the kubeconfig.

use std::sync::Arc;

use chrono::{DateTime, Duration, SecondsFormat, Utc};
use paddock_domain::driver::{ClusterRef, TenantAccess, TenantCredentials};
use paddock_domain::secret::{Binding, Cipher, SecretString};
use paddock_domain::{Error, Permission, Result, Scope};
use paddock_store::{cluster as cluster_store, tenant, Conn, StoreError};
use paddock_types::cluster::{ConditionStatus, KUBECONFIG_TTL_DEFAULT, KUBECONFIG_TTL_MAX, KUBECONFIG_TTL_MIN};
use paddock_types::tenant::TenantState;
use paddock_types::{ClusterId, TenantId};
use serde_json::json;

use crate::{Ctx, Done, Services};

/// The condition saying the tenant control plane answers (set by the cluster reconciler).
const CONTROL_PLANE_READY: &str = "ControlPlaneReady";

/// The binding of a cluster's sealed admin kubeconfig.
pub fn kubeconfig_binding(cluster: ClusterId) -> Binding<'static> {
    Binding { table: "clusters", column: "admin_kubeconfig_enc", row: cluster.uuid() }
}

/// How paddock reaches a tenant cluster's own API: its endpoint and the opened admin kubeconfig;
/// `None` until the control plane published both.
pub async fn tenant_access(
    conn: &mut Conn,
    cipher: &Cipher,
    cluster: ClusterRef,
    endpoint: Option<&str>,
) -> std::result::Result<Option<TenantAccess>, StoreError> {
    let Some(endpoint) = endpoint else {
        return Ok(None);
    };
    let sealed = cluster_store::admin_kubeconfig(conn, cluster.tenant_id, cluster.cluster_id).await?;
    open_access(cipher, cluster, Some(endpoint), sealed.as_deref())
}

/// [`tenant_access`] from a sealed admin kubeconfig already read; `None` without both.
pub fn open_access(
    cipher: &Cipher,
    cluster: ClusterRef,
    endpoint: Option<&str>,
    sealed: Option<&[u8]>,
) -> std::result::Result<Option<TenantAccess>, StoreError> {
    let (Some(endpoint), Some(sealed)) = (endpoint, sealed) else {
        return Ok(None);
    };
    let opened = cipher.open(sealed, kubeconfig_binding(cluster.cluster_id)).map_err(|e| {
        StoreError::Corrupt(format!("the admin kubeconfig of cluster {} cannot be opened: {e}", cluster.cluster_id))
    })?;
    access(cluster, endpoint, opened).map(Some)
}

/// How paddock reaches `cluster`'s own API at `endpoint` with the admin kubeconfig `kubeconfig`
/// (opened, or just reported by the control plane).
pub fn access(cluster: ClusterRef, endpoint: &str, kubeconfig: Vec<u8>) -> Result<TenantAccess, StoreError> {
    let kubeconfig = String::from_utf8(kubeconfig).map_err(|_| {
        StoreError::Corrupt(format!("the admin kubeconfig of cluster {} is not UTF-8", cluster.cluster_id))
    })?;
    Ok(TenantAccess {
        cluster,
        endpoint: endpoint.trim_start_matches("https://").to_owned(),
        admin_kubeconfig: SecretString::new(kubeconfig),
    })
}

/// The credentials driver the API uses (`PADDOCK_KUBE_DRIVER`); shows nothing of itself.
#[derive(Clone)]
pub(crate) struct CredentialsDriver(pub(crate) Arc<dyn TenantCredentials>);

impl std::fmt::Debug for CredentialsDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialsDriver").finish_non_exhaustive()
    }
}

/// A tenant's kubeconfig, just issued.
#[derive(Debug)]
pub struct TenantKubeconfig {
    /// The kubeconfig (YAML).
    pub kubeconfig: SecretString,
    /// The token's lifetime.
    pub ttl_seconds: u64,
    /// When the token expires at the latest (computed before it was requested).
    pub expires_at: DateTime<Utc>,
}

/// Validates `ttl` (seconds; default 8 h, 600 to 86400: any integer out of range is a 422,
/// something that is not an integer a 400, like `limit`).
pub fn parse_ttl(ttl: Option<&str>) -> Result<u64> {
    let Some(text) = ttl else {
        return Ok(KUBECONFIG_TTL_DEFAULT);
    };
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::BadRequest {
            code: "invalid_parameter",
            message: format!("ttl must be an integer number of seconds, not {text:?}"),
        });
    }
    match text.parse::<u64>() {
        Ok(n) if (KUBECONFIG_TTL_MIN..=KUBECONFIG_TTL_MAX).contains(&n) => Ok(n),
        _ => {
            Err(Error::invalid("ttl", format!("must be between {KUBECONFIG_TTL_MIN} and {KUBECONFIG_TTL_MAX} seconds")))
        }
    }
}

impl Services {
    /// Sets the driver that issues tenant kubeconfigs (`PADDOCK_KUBE_DRIVER`); without one, a
    /// kubeconfig request is a 409 `driver_not_configured`.
    pub fn with_credentials(mut self, driver: Arc<dyn TenantCredentials>) -> Self {
        self.credentials = Some(CredentialsDriver(driver));
        self
    }

    /// Issues the tenant's kubeconfig of a cluster, its token valid for `ttl` seconds. Checks:
    /// 403 (only `tenant:admin` and `provider:admin`), 404 (missing or another tenant's), 409
    /// (`tenant_suspended` for a tenant caller while the tenant is suspended;
    /// `driver_not_configured`; `cluster_not_ready` until the control plane answers and its
    /// admin kubeconfig is stored, and while deleting), then `ttl` (400, 422).
    #[tracing::instrument(skip_all, fields(tenant.id = %tenant_id, cluster.id = %id))]
    pub async fn cluster_kubeconfig(
        &self,
        ctx: &Ctx,
        tenant_id: TenantId,
        id: ClusterId,
        ttl: Option<&str>,
    ) -> Result<TenantKubeconfig> {
        self.audited(ctx, "cluster.kubeconfig", "cluster", async |audit| {
            audit.target(id.uuid(), Some(tenant_id));
            let scope = ctx.actor.authorize_tenant(Permission::ClusterCredentials, tenant_id, "cluster")?;
            let (access, driver, ttl_seconds) = {
                let mut conn = self.store.conn().await?;
                let cluster =
                    cluster_store::get(&mut conn, tenant_id, id).await?.ok_or(Error::NotFound { kind: "cluster" })?;
                let t = tenant::get(&mut conn, tenant_id).await?.ok_or(Error::NotFound { kind: "cluster" })?;
                // Minting a credential is a write of the tenant's: refused while it is suspended,
                // like its other writes (docs/api.md); a provider admin still gets one.
                if matches!(scope, Scope::Tenant(_)) && t.state == TenantState::Suspended {
                    return Err(Error::conflict(
                        "tenant_suspended",
                        "the tenant is suspended; its clusters keep running but no new credentials are issued",
                    ));
                }
                let Some(driver) = &self.credentials else {
                    return Err(Error::conflict(
                        "driver_not_configured",
                        "no cluster driver is configured (PADDOCK_KUBE_DRIVER=none): kubeconfigs cannot be issued",
                    ));
                };
                let not_ready = |why: &str| Error::conflict("cluster_not_ready", format!("the cluster {why}"));
                if cluster.deleting {
                    return Err(not_ready("is being deleted"));
                }
                let control_plane_ready = cluster
                    .status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == CONTROL_PLANE_READY && c.status == ConditionStatus::True);
                if !control_plane_ready {
                    return Err(not_ready("has no ready control plane yet; try again once it is ready"));
                }
                let reference = ClusterRef {
                    tenant_id,
                    cluster_id: id,
                    tenant_name: t.spec.name,
                    cluster_name: cluster.spec.name.clone(),
                };
                let endpoint = cluster.status.endpoints.kubernetes_api.as_deref();
                let access = tenant_access(&mut conn, &self.cipher, reference, endpoint)
                    .await?
                    .ok_or_else(|| not_ready("has no API server endpoint or admin credentials yet"))?;
                let ttl_seconds = parse_ttl(ttl)?;
                // The connection goes back to the pool here: none is held across the driver call.
                (access, driver.0.clone(), ttl_seconds)
            };
            let ttl = Duration::seconds(i64::try_from(ttl_seconds).unwrap_or(i64::MAX));
            let expires_at = Utc::now() + ttl;
            let kubeconfig = driver.tenant_kubeconfig(&access, ttl_seconds).await.map_err(|e| {
                tracing::warn!(error = %e, "issuing a kubeconfig for cluster {id} failed");
                if e.is_transient() {
                    Error::conflict("cluster_unreachable", "the cluster's API server did not answer; try again shortly")
                } else {
                    Error::internal(e)
                }
            })?;
            // Nothing was written: the transaction holds only the success event.
            let tx = self.store.begin().await?;
            let details = json!({
                "ttl_seconds": ttl_seconds,
                "expires_at": expires_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            });
            tracing::info!("issued a kubeconfig for cluster {id}, valid for {ttl_seconds} s");
            Ok(Done::Commit { tx, value: TenantKubeconfig { kubeconfig, ttl_seconds, expires_at }, details })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_an_integer_within_bounds() {
        assert_eq!(parse_ttl(None).ok(), Some(28_800));
        assert_eq!(parse_ttl(Some("600")).ok(), Some(600));
        assert_eq!(parse_ttl(Some("86400")).ok(), Some(86_400));
        for out_of_range in ["599", "86401", "0", "-1", "99999999999999999999999"] {
            assert!(matches!(parse_ttl(Some(out_of_range)), Err(Error::Invalid(_))), "{out_of_range}");
        }
        for malformed in ["abc", "", "1.5", "-", "1h"] {
            assert!(matches!(parse_ttl(Some(malformed)), Err(Error::BadRequest { .. })), "{malformed}");
        }
    }
}
