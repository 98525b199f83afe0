//! A tenant's SCIM bearer tokens (table `scim_tokens`): only their SHA-256 is stored.

use chrono::{DateTime, Utc};
use paddock_types::scim::ScimTokenView;
use paddock_types::{ScimTokenId, TenantId};
use uuid::Uuid;

use crate::{Conn, StoreError};

#[derive(Debug, sqlx::FromRow)]
struct Row {
    id: Uuid,
    tenant_id: Uuid,
    description: String,
    created_by: String,
    created_at: DateTime<Utc>,
    revoked_at: Option<DateTime<Utc>>,
}

impl Row {
    fn view(self) -> ScimTokenView {
        ScimTokenView {
            id: ScimTokenId(self.id),
            tenant_id: TenantId(self.tenant_id),
            description: self.description,
            created_by: self.created_by,
            created_at: self.created_at,
            revoked_at: self.revoked_at,
        }
    }
}

const COLUMNS: &str = "id, tenant_id, description, created_by, created_at, revoked_at";

/// Inserts a token of `tenant` by its hash.
pub async fn insert(
    conn: &mut Conn,
    tenant: TenantId,
    id: ScimTokenId,
    description: &str,
    token_sha256: &[u8],
    created_by: &str,
) -> Result<ScimTokenView, StoreError> {
    let row: Row = sqlx::query_as(&format!(
        "insert into scim_tokens (id, tenant_id, description, token_sha256, created_by) \
         values ($1, $2, $3, $4, $5) returning {COLUMNS}"
    ))
    .bind(id.uuid())
    .bind(tenant.uuid())
    .bind(description)
    .bind(token_sha256)
    .bind(created_by)
    .fetch_one(conn)
    .await?;
    Ok(row.view())
}

/// The tokens of `tenant`, a page after `after`, oldest first.
pub async fn list(
    conn: &mut Conn,
    tenant: TenantId,
    after: Option<Uuid>,
    limit: u32,
) -> Result<Vec<ScimTokenView>, StoreError> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "select {COLUMNS} from scim_tokens where tenant_id = $1 and ($2::uuid is null or id > $2) \
         order by id limit $3"
    ))
    .bind(tenant.uuid())
    .bind(after)
    .bind(i64::from(limit))
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(Row::view).collect())
}

/// Revokes a token of `tenant` (a revoked one stays revoked at its first time); `None` when the
/// tenant has no such token.
pub async fn revoke(conn: &mut Conn, tenant: TenantId, id: ScimTokenId) -> Result<Option<ScimTokenView>, StoreError> {
    let row: Option<Row> = sqlx::query_as(&format!(
        "update scim_tokens set revoked_at = coalesce(revoked_at, now()) \
         where tenant_id = $1 and id = $2 returning {COLUMNS}"
    ))
    .bind(tenant.uuid())
    .bind(id.uuid())
    .fetch_optional(conn)
    .await?;
    Ok(row.map(Row::view))
}

/// The valid (not revoked) token with this hash, of a tenant that is not deleted.
pub async fn find(conn: &mut Conn, token_sha256: &[u8]) -> Result<Option<(ScimTokenId, TenantId)>, StoreError> {
    let found: Option<(Uuid, Uuid)> = sqlx::query_as(
        "select s.id, s.tenant_id from scim_tokens s join tenants t on t.id = s.tenant_id \
         where s.token_sha256 = $1 and s.revoked_at is null and t.deleted_at is null",
    )
    .bind(token_sha256)
    .fetch_optional(conn)
    .await?;
    Ok(found.map(|(id, tenant)| (ScimTokenId(id), TenantId(tenant))))
}
