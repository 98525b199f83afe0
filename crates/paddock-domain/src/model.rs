//! Domain records: what the store returns and the services work with. Each knows its view.

use chrono::{DateTime, Utc};
use paddock_types::health::MachineHealth;
use paddock_types::machine::{BmcView, LastError, MachineState, MachineView};
use paddock_types::machine_class::{MachineClassCreate, MachineClassView};
use paddock_types::tenant::{TenantCreate, TenantState, TenantView};
use paddock_types::{ClusterId, Labels, MachineClassId, MachineId, NodePoolId, TenantId};

/// The etag of a generation: `"<generation>"`.
pub fn etag(generation: i64) -> String {
    format!("\"{generation}\"")
}

/// A tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Id.
    pub id: TenantId,
    /// What the provider asked for.
    pub spec: TenantCreate,
    /// What it uses of its quotas.
    pub quota_use: paddock_types::tenant::QuotaUse,
    /// Active or suspended.
    pub state: TenantState,
    /// Spec generation.
    pub generation: i64,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl Tenant {
    /// The API view (it takes the tenant: its strings and labels move into the view).
    pub fn view(self) -> TenantView {
        TenantView {
            id: self.id,
            name: self.spec.name,
            display_name: self.spec.display_name,
            labels: self.spec.labels,
            quotas: self.spec.quotas,
            quota_use: self.quota_use,
            state: self.state,
            generation: self.generation,
            etag: etag(self.generation),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// A machine class.
#[derive(Debug, Clone)]
pub struct MachineClass {
    /// Id.
    pub id: MachineClassId,
    /// The hardware profile.
    pub spec: MachineClassCreate,
    /// Spec generation.
    pub generation: i64,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl MachineClass {
    /// The API view.
    pub fn view(&self) -> MachineClassView {
        let s = &self.spec;
        MachineClassView {
            id: self.id,
            name: s.name.clone(),
            cpu_cores: s.cpu_cores,
            memory_gib: s.memory_gib,
            gpu_model: s.gpu_model.clone(),
            gpu_count: s.gpu_count,
            description: s.description.clone(),
            price: s.price.clone(),
            acceptance: s.acceptance.clone(),
            generation: self.generation,
            etag: etag(self.generation),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

/// BMC access as stored: the password stays sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bmc {
    /// Redfish service URL.
    pub url: String,
    /// System `Id` or `UUID`.
    pub system_id: Option<String>,
    /// BMC user.
    pub username: String,
    /// The sealed password (see `secret`).
    pub password_enc: Vec<u8>,
    /// PEM CA certificate.
    pub ca_cert: Option<String>,
    /// Skip TLS verification.
    pub insecure_tls: bool,
    /// Plain `http` was explicitly allowed for this BMC.
    pub allow_insecure_http: bool,
}

/// A machine.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Id.
    pub id: MachineId,
    /// Unique name.
    pub name: String,
    /// Its class.
    pub machine_class_id: MachineClassId,
    /// Name of its class.
    pub machine_class: String,
    /// Labels.
    pub labels: Labels,
    /// Lifecycle state.
    pub state: MachineState,
    /// Most recent error.
    pub last_error: Option<LastError>,
    /// Holding tenant.
    pub tenant_id: Option<TenantId>,
    /// Holding cluster.
    pub cluster_id: Option<ClusterId>,
    /// Holding node pool.
    pub node_pool_id: Option<NodePoolId>,
    /// Node name in the tenant cluster.
    pub node_name: Option<String>,
    /// System UUID from the BMC.
    pub system_uuid: Option<String>,
    /// Inventory from the BMC.
    pub inventory: serde_json::Value,
    /// Why it is in maintenance.
    pub maintenance_reason: Option<String>,
    /// What its newest health report says, if one was recorded.
    pub health: Option<MachineHealth>,
    /// Whether an operator asked to retire it.
    pub retire_requested: bool,
    /// Why an operator asked to force the release of its tenancy, while that is pending.
    pub force_release_reason: Option<String>,
    /// The record that holds this machine's system UUID, when inspection found the server
    /// enrolled already (`duplicate_system`): this record may then only be retired.
    pub duplicate_of: Option<MachineId>,
    /// BMC access.
    pub bmc: Bmc,
    /// Spec generation.
    pub generation: i64,
    /// Status guard of the worker's writes.
    pub status_version: i64,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl Machine {
    /// The API view: never the password.
    pub fn view(&self) -> MachineView {
        MachineView {
            id: self.id,
            name: self.name.clone(),
            machine_class: self.machine_class.clone(),
            labels: self.labels.clone(),
            state: self.state,
            last_error: self.last_error.clone(),
            tenant_id: self.tenant_id,
            cluster_id: self.cluster_id,
            node_pool_id: self.node_pool_id,
            node_name: self.node_name.clone(),
            system_uuid: self.system_uuid.clone(),
            inventory: self.inventory.clone(),
            maintenance_reason: self.maintenance_reason.clone(),
            health: self.health.clone(),
            bmc: BmcView {
                url: self.bmc.url.clone(),
                system_id: self.bmc.system_id.clone(),
                username: self.bmc.username.clone(),
                insecure_tls: self.bmc.insecure_tls,
                has_ca_cert: self.bmc.ca_cert.is_some(),
            },
            generation: self.generation,
            etag: etag(self.generation),
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}
