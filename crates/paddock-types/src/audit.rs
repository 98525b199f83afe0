//! Audit events: one per mutating call, successful or not.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::{AuditEventId, TenantId};

/// Whether the audited call did what it asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AuditOutcome {
    /// The change was made (or accepted, for asynchronous changes).
    Success,
    /// The call was refused; `code` says why.
    Failure,
}

/// Who made a call.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditActor {
    /// The token's subject.
    pub sub: String,
    /// The token's roles.
    pub roles: Vec<String>,
}

/// What a call acted on.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditTarget {
    /// Resource type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Resource id, when one is known.
    pub id: Option<Uuid>,
}

/// An audit event.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditEventView {
    /// Id (time-ordered).
    pub id: AuditEventId,
    /// When it happened.
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: AuditActor,
    /// Tenant concerned, if any.
    pub tenant_id: Option<TenantId>,
    /// What, e.g. `tenant.create`.
    pub action: String,
    /// On what.
    pub target: AuditTarget,
    /// The request's id: the client's `x-request-id` when it sent one, else the server's.
    pub request_id: String,
    /// The id the server gave the request, whatever the client sent (absent on events older
    /// than it).
    pub server_request_id: Option<Uuid>,
    /// Success or failure.
    pub outcome: AuditOutcome,
    /// The problem code of a failure.
    pub code: Option<String>,
    /// Extra facts (a maintenance reason, the fields changed); never secrets.
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// Filters of the audit lists.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditFilter {
    /// Only events of this tenant (provider list only).
    pub tenant_id: Option<TenantId>,
    /// Only this action, e.g. `tenant.create`.
    #[param(max_length = 100)]
    pub action: Option<String>,
    /// Only events about this object.
    pub target_id: Option<Uuid>,
    /// Only calls by this subject.
    #[param(max_length = 256)]
    pub actor: Option<String>,
    /// Only this outcome.
    pub outcome: Option<AuditOutcome>,
    /// Events at or after this time.
    pub from: Option<DateTime<Utc>>,
    /// Events before this time.
    pub to: Option<DateTime<Utc>>,
}
