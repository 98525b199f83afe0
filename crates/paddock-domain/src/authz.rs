//! Who may do what. A permission is granted to a role either for everything (`Scope::All`) or
//! only within the caller's own tenant (`Scope::Tenant`). Services check the permission before
//! any lookup (403), then scope every tenant-owned query; a foreign tenant's object is a 404.

use paddock_types::TenantId;

use crate::Error;

/// The five roles of docs/api.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Everything.
    ProviderAdmin,
    /// Read all; manage machines.
    ProviderOperator,
    /// Tenants and usage, read only.
    BillingReader,
    /// Own tenant: clusters, pools, credentials, usage, audit.
    TenantAdmin,
    /// Own tenant, read only, no credentials.
    TenantMember,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 5] =
        [Self::ProviderAdmin, Self::ProviderOperator, Self::BillingReader, Self::TenantAdmin, Self::TenantMember];

    /// The role's claim value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProviderAdmin => "provider:admin",
            Self::ProviderOperator => "provider:operator",
            Self::BillingReader => "billing:reader",
            Self::TenantAdmin => "tenant:admin",
            Self::TenantMember => "tenant:member",
        }
    }

    /// Parses a claim value; unknown roles are ignored by the caller.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether the role acts within one tenant only.
    pub fn is_tenant_role(self) -> bool {
        matches!(self, Self::TenantAdmin | Self::TenantMember)
    }
}

/// Something a caller may be allowed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Create, change, suspend, resume, delete tenants.
    TenantWrite,
    /// Read tenants.
    TenantRead,
    /// Create, change, delete machine classes.
    MachineClassWrite,
    /// Read machine classes.
    MachineClassRead,
    /// Enroll, change, maintain, retire machines.
    MachineWrite,
    /// Read the machine inventory (with BMC details, never passwords).
    MachineRead,
    /// Read operations.
    OperationRead,
    /// Read audit events.
    AuditRead,
    /// Create, change, scale and delete clusters and node pools.
    ClusterWrite,
    /// Read clusters, node pools, their machines and events.
    ClusterRead,
    /// Get a cluster's credentials (the tenant's kubeconfig).
    ClusterCredentials,
    /// Read usage records, aggregates, exports and billing periods.
    UsageRead,
    /// Close billing periods and record usage adjustments.
    UsageWrite,
    /// Create, change, rotate and delete webhook subscriptions, and read their deliveries.
    WebhookWrite,
    /// Manage a tenant's people over SCIM (users, groups) and its SCIM bearer tokens.
    IdentityWrite,
}

/// How far a granted permission reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every tenant, and provider-side objects.
    All,
    /// Only this tenant's objects.
    Tenant(TenantId),
}

impl Scope {
    /// Checks that `tenant` is within reach; a foreign tenant is `NotFound`, like a missing one.
    pub fn check(self, tenant: TenantId, kind: &'static str) -> Result<(), Error> {
        match self {
            Scope::All => Ok(()),
            Scope::Tenant(own) if own == tenant => Ok(()),
            Scope::Tenant(_) => Err(Error::NotFound { kind }),
        }
    }

    /// The tenant a query must be limited to, `None` for all.
    pub fn tenant(self) -> Option<TenantId> {
        match self {
            Scope::All => None,
            Scope::Tenant(t) => Some(t),
        }
    }
}

/// Whether `role` holds `permission`, and how far.
fn grant(role: Role, permission: Permission) -> Option<GrantReach> {
    use GrantReach::{All, OwnTenant};
    use Permission as P;
    use Role as R;
    match (role, permission) {
        (R::ProviderAdmin, _) => Some(All),
        (R::ProviderOperator, P::TenantRead | P::MachineClassRead | P::OperationRead) => Some(All),
        (R::ProviderOperator, P::MachineWrite | P::MachineRead | P::AuditRead) => Some(All),
        (R::BillingReader, P::TenantRead | P::MachineClassRead | P::UsageRead) => Some(All),
        (R::ProviderOperator, P::UsageRead) => Some(All),
        (R::TenantAdmin | R::TenantMember, P::UsageRead) => Some(OwnTenant),
        (R::TenantAdmin, P::TenantRead | P::OperationRead | P::AuditRead) => Some(OwnTenant),
        (R::TenantMember, P::TenantRead | P::OperationRead) => Some(OwnTenant),
        (R::TenantAdmin | R::TenantMember, P::MachineClassRead) => Some(All),
        (R::ProviderOperator, P::ClusterRead) => Some(All),
        (R::TenantAdmin, P::ClusterWrite | P::ClusterRead | P::ClusterCredentials) => Some(OwnTenant),
        (R::TenantMember, P::ClusterRead) => Some(OwnTenant),
        (R::TenantAdmin, P::WebhookWrite) => Some(OwnTenant),
        (R::TenantAdmin, P::IdentityWrite) => Some(OwnTenant),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrantReach {
    All,
    OwnTenant,
}

/// The authenticated caller.
#[derive(Clone, PartialEq, Eq)]
pub struct Actor {
    /// The token's `sub`.
    pub subject: String,
    /// Recognised roles.
    pub roles: Vec<Role>,
    /// The token's roles as given, unknown ones included (for the audit trail).
    pub raw_roles: Vec<String>,
    /// The tenant of tenant roles.
    pub tenant_id: Option<TenantId>,
}

impl std::fmt::Debug for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actor")
            .field("subject", &self.subject)
            .field("roles", &self.raw_roles)
            .field("tenant_id", &self.tenant_id)
            .finish()
    }
}

/// Why claims do not make an actor.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ActorError {
    /// A tenant role without a `tenant_id` claim.
    #[error("tenant roles need a tenant_id claim")]
    MissingTenant,
}

impl Actor {
    /// Builds an actor from verified claims. Unknown roles grant nothing; a `tenant_id` claim
    /// without a tenant role is dropped (it scopes nothing, and must not file the caller's calls
    /// under that tenant).
    pub fn from_claims(
        subject: String,
        raw_roles: Vec<String>,
        tenant_id: Option<TenantId>,
    ) -> Result<Self, ActorError> {
        let mut roles: Vec<Role> = raw_roles.iter().filter_map(|r| Role::parse(r)).collect();
        roles.dedup();
        let tenant_roles = roles.iter().any(|r| r.is_tenant_role());
        if tenant_id.is_none() && tenant_roles {
            return Err(ActorError::MissingTenant);
        }
        let tenant_id = tenant_id.filter(|_| tenant_roles);
        Ok(Self { subject, roles, raw_roles, tenant_id })
    }

    /// The tenant this actor acts for when it holds tenant roles only: a caller with any
    /// provider or billing role acts for the provider, whatever its token's `tenant_id` says.
    pub fn home_tenant(&self) -> Option<TenantId> {
        self.tenant_id.filter(|_| self.roles.iter().all(|r| r.is_tenant_role()))
    }

    /// Whether the actor holds `role`.
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// Checks `permission` before any lookup: 403 when no role grants it, else the widest scope.
    pub fn authorize(&self, permission: Permission) -> Result<Scope, Error> {
        let mut reach = None;
        for role in &self.roles {
            match grant(*role, permission) {
                Some(GrantReach::All) => return Ok(Scope::All),
                Some(GrantReach::OwnTenant) => reach = Some(GrantReach::OwnTenant),
                None => {}
            }
        }
        match (reach, self.tenant_id) {
            (Some(GrantReach::OwnTenant), Some(tenant)) => Ok(Scope::Tenant(tenant)),
            _ => Err(Error::Forbidden(format!("the roles of this token may not {}", describe(permission)))),
        }
    }

    /// Checks `permission` for one tenant: 403 without the permission, 404 for a foreign tenant.
    pub fn authorize_tenant(
        &self,
        permission: Permission,
        tenant: TenantId,
        kind: &'static str,
    ) -> Result<Scope, Error> {
        let scope = self.authorize(permission)?;
        scope.check(tenant, kind)?;
        Ok(scope)
    }
}

fn describe(permission: Permission) -> &'static str {
    match permission {
        Permission::TenantWrite => "change tenants",
        Permission::TenantRead => "read tenants",
        Permission::MachineClassWrite => "change machine classes",
        Permission::MachineClassRead => "read machine classes",
        Permission::MachineWrite => "change machines",
        Permission::MachineRead => "read machines",
        Permission::OperationRead => "read operations",
        Permission::AuditRead => "read audit events",
        Permission::ClusterWrite => "change clusters",
        Permission::ClusterRead => "read clusters",
        Permission::ClusterCredentials => "get cluster credentials",
        Permission::UsageRead => "read usage",
        Permission::UsageWrite => "close billing periods or adjust usage",
        Permission::WebhookWrite => "manage webhooks",
        Permission::IdentityWrite => "manage the tenant's people (SCIM) or its SCIM tokens",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(role: Role, tenant: Option<TenantId>) -> Actor {
        Actor::from_claims("u".into(), vec![role.as_str().into()], tenant).expect("valid actor")
    }

    #[test]
    fn tenant_roles_without_tenant_claim_are_refused() {
        let err = Actor::from_claims("u".into(), vec!["tenant:admin".into()], None);
        assert_eq!(err, Err(ActorError::MissingTenant));
    }

    #[test]
    fn tenant_admin_reads_only_its_own_tenant() {
        let own = TenantId::new();
        let a = actor(Role::TenantAdmin, Some(own));
        assert!(a.authorize_tenant(Permission::TenantRead, own, "tenant").is_ok());
        let foreign = a.authorize_tenant(Permission::TenantRead, TenantId::new(), "tenant");
        assert!(matches!(foreign, Err(Error::NotFound { .. })));
        assert!(matches!(a.authorize(Permission::TenantWrite), Err(Error::Forbidden(_))));
    }

    #[test]
    fn operator_manages_machines_but_not_tenants() {
        let a = actor(Role::ProviderOperator, None);
        assert_eq!(a.authorize(Permission::MachineWrite).ok(), Some(Scope::All));
        assert!(a.authorize(Permission::TenantWrite).is_err());
        assert!(a.authorize(Permission::MachineClassWrite).is_err());
    }

    #[test]
    fn only_admins_get_cluster_credentials() {
        let own = TenantId::new();
        let p = Permission::ClusterCredentials;
        assert_eq!(actor(Role::ProviderAdmin, None).authorize(p).ok(), Some(Scope::All));
        assert_eq!(actor(Role::TenantAdmin, Some(own)).authorize(p).ok(), Some(Scope::Tenant(own)));
        for role in [Role::ProviderOperator, Role::BillingReader, Role::TenantMember] {
            let tenant = role.is_tenant_role().then_some(own);
            assert!(matches!(actor(role, tenant).authorize(p), Err(Error::Forbidden(_))), "{role:?}");
        }
    }

    #[test]
    fn unknown_roles_grant_nothing() {
        let a = Actor::from_claims("u".into(), vec!["root".into()], None).expect("actor");
        assert!(a.authorize(Permission::MachineClassRead).is_err());
    }
}
