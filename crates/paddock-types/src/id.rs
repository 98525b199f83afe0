//! Typed ids. Every id is a UUID (v7 when paddock creates it); the newtypes keep a tenant id from
//! being passed where a machine id is expected.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! typed_id {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
                 utoipa::ToSchema)]
        #[serde(transparent)]
        #[schema(value_type = String, format = Uuid)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A new time-ordered (v7) id.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// The underlying UUID, for the store's bind parameters.
            pub fn uuid(self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    )*};
}

typed_id!(
    /// Id of a tenant.
    TenantId,
    /// Id of a machine class.
    MachineClassId,
    /// Id of a machine.
    MachineId,
    /// Id of an operation.
    OperationId,
    /// Id of an audit event.
    AuditEventId,
    /// Id of a tenant cluster.
    ClusterId,
    /// Id of a node pool.
    NodePoolId,
    /// Id of a job of the worker's queue.
    JobId,
    /// Id of an entry of the custody ledger.
    CustodyEntryId,
    /// Id of a verified wipe of a machine.
    CleanId,
    /// Id of a machine's allocation to a tenant cluster.
    AllocationId,
    /// Id of a webhook subscription.
    WebhookId,
    /// Id of one event's delivery to one webhook subscription.
    WebhookDeliveryId,
    /// Id of a tenant's SCIM bearer token.
    ScimTokenId,
);
