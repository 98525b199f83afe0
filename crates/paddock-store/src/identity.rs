//! A tenant's people as its identity provider pushed them over SCIM: users
//! (`identity_users`), groups (`identity_groups`), memberships (`identity_group_members`), and the
//! tenant's POSIX id space (`identity_numbers`: each number names one user or group, or is retired). Every
//! write of a tenant's people first takes the tenant's identity lock ([`lock`]), so the checks of
//! a write and the numbers it assigns never race another write of the same tenant.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use paddock_domain::scim::resource::{GroupRecord, UserInput, UserRecord};
use paddock_types::TenantId;
use serde_json::Value;
use uuid::Uuid;

use crate::{Conn, StoreError};

/// Serializes the writes of `tenant`'s people until the transaction ends.
pub async fn lock(conn: &mut Conn, tenant: TenantId) -> Result<(), StoreError> {
    sqlx::query("select pg_advisory_xact_lock(hashtextextended('paddock.identity:' || $1::text, 0))")
        .bind(tenant.uuid())
        .execute(conn)
        .await?;
    Ok(())
}

/// The lowest number of `[first, last]` that no user or group of `tenant` holds, skipping
/// `reserved`; `None` when the range is full.
pub async fn next_number(
    conn: &mut Conn,
    tenant: TenantId,
    first: i32,
    last: i32,
    reserved: &[i32],
) -> Result<Option<i32>, StoreError> {
    Ok(sqlx::query_scalar(
        "select c.s from ( \
             select $2::int as s \
             union all select number + 1 from identity_numbers \
                 where tenant_id = $1 and number >= $2 and number < $3 \
             union all select r + 1 from unnest($4::int[]) r where r < $3 \
         ) c \
         where c.s between $2 and $3 and c.s <> all($4::int[]) \
           and not exists (select 1 from identity_numbers n where n.tenant_id = $1 and n.number = c.s) \
         order by c.s limit 1",
    )
    .bind(tenant.uuid())
    .bind(first)
    .bind(last)
    .bind(reserved)
    .fetch_optional(conn)
    .await?)
}

/// Gives `number` to a user (`user`) or a group (`group`) of `tenant`, retiring the one it held;
/// a retired number (of a deleted user or group) may be named again. False (and nothing
/// changed) when another user or group of the tenant holds it.
pub async fn claim_number(
    conn: &mut Conn,
    tenant: TenantId,
    number: i32,
    user: Option<Uuid>,
    group: Option<Uuid>,
) -> Result<bool, StoreError> {
    let holder: Option<(Option<Uuid>, Option<Uuid>)> = sqlx::query_as(
        "select user_id, group_id from identity_numbers where tenant_id = $1 and number = $2 for update",
    )
    .bind(tenant.uuid())
    .bind(number)
    .fetch_optional(&mut *conn)
    .await?;
    match holder {
        Some(held) if held == (user, group) => return Ok(true),
        Some((None, None)) | None => {}
        Some(_) => return Ok(false),
    }
    sqlx::query(
        "update identity_numbers set user_id = null, group_id = null \
         where tenant_id = $1 and (user_id = $2 or group_id = $3)",
    )
    .bind(tenant.uuid())
    .bind(user)
    .bind(group)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "insert into identity_numbers (tenant_id, number, user_id, group_id) values ($1, $2, $3, $4) \
         on conflict (tenant_id, number) do update set user_id = excluded.user_id, group_id = excluded.group_id",
    )
    .bind(tenant.uuid())
    .bind(number)
    .bind(user)
    .bind(group)
    .execute(conn)
    .await?;
    Ok(true)
}

/// Pairs of (owner, item) grouped by owner.
fn by_owner(pairs: Vec<(Uuid, Uuid, String)>) -> HashMap<Uuid, Vec<(Uuid, String)>> {
    let mut map: HashMap<Uuid, Vec<(Uuid, String)>> = HashMap::new();
    for (owner, id, name) in pairs {
        map.entry(owner).or_default().push((id, name));
    }
    map
}

#[derive(Debug, sqlx::FromRow)]
struct UserRow {
    id: Uuid,
    user_name: String,
    external_id: Option<String>,
    display_name: Option<String>,
    name: Option<Value>,
    emails: Value,
    active: bool,
    uid_number: i32,
    gid_number: i32,
    login_shell: String,
    ssh_public_keys: Vec<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl UserRow {
    fn record(self, groups: Vec<(Uuid, String)>) -> UserRecord {
        UserRecord {
            id: self.id,
            input: UserInput {
                user_name: self.user_name,
                external_id: self.external_id,
                display_name: self.display_name,
                name: self.name,
                emails: self.emails,
                active: self.active,
                uid_number: Some(self.uid_number),
                gid_number: Some(self.gid_number),
                login_shell: self.login_shell,
                ssh_public_keys: self.ssh_public_keys,
            },
            uid_number: self.uid_number,
            gid_number: self.gid_number,
            groups,
            created_at: self.created_at,
            updated_at: self.updated_at,
        }
    }
}

const USER_COLUMNS: &str = "id, user_name, external_id, display_name, name, emails, active, uid_number, \
    gid_number, login_shell, ssh_public_keys, created_at, updated_at";

/// Inserts a user of `tenant` with its numbers (claimed by the caller).
pub async fn user_insert(
    conn: &mut Conn,
    tenant: TenantId,
    id: Uuid,
    u: &UserInput,
    uid: i32,
    gid: i32,
) -> Result<(), StoreError> {
    sqlx::query(
        "insert into identity_users (id, tenant_id, user_name, external_id, display_name, name, emails, \
             active, uid_number, gid_number, login_shell, ssh_public_keys) \
         values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(id)
    .bind(tenant.uuid())
    .bind(&u.user_name)
    .bind(&u.external_id)
    .bind(&u.display_name)
    .bind(&u.name)
    .bind(&u.emails)
    .bind(u.active)
    .bind(uid)
    .bind(gid)
    .bind(&u.login_shell)
    .bind(&u.ssh_public_keys)
    .execute(conn)
    .await?;
    Ok(())
}

/// Replaces a user's attributes and numbers; false when `tenant` has no such user.
pub async fn user_update(
    conn: &mut Conn,
    tenant: TenantId,
    id: Uuid,
    u: &UserInput,
    uid: i32,
    gid: i32,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update identity_users set user_name = $3, external_id = $4, display_name = $5, name = $6, emails = $7, \
             active = $8, uid_number = $9, gid_number = $10, login_shell = $11, ssh_public_keys = $12, \
             version = version + 1, updated_at = now() \
         where tenant_id = $1 and id = $2",
    )
    .bind(tenant.uuid())
    .bind(id)
    .bind(&u.user_name)
    .bind(&u.external_id)
    .bind(&u.display_name)
    .bind(&u.name)
    .bind(&u.emails)
    .bind(u.active)
    .bind(uid)
    .bind(gid)
    .bind(&u.login_shell)
    .bind(&u.ssh_public_keys)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Deletes a user (its memberships and number with it); false when `tenant` has no such user.
pub async fn user_delete(conn: &mut Conn, tenant: TenantId, id: Uuid) -> Result<bool, StoreError> {
    let done = sqlx::query("delete from identity_users where tenant_id = $1 and id = $2")
        .bind(tenant.uuid())
        .bind(id)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Which field a lookup compares (`filter=<attr> eq "<value>"` served by an index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// Every one of the tenant's.
    All,
    /// By id.
    Id(Uuid),
    /// By `userName` or a group's `displayName`, without regard to case.
    Name(&'a str),
    /// By `externalId`, exactly.
    ExternalId(&'a str),
}

/// The users of `tenant` that `lookup` selects, ordered by creation, with their groups.
pub async fn users(conn: &mut Conn, tenant: TenantId, lookup: Lookup<'_>) -> Result<Vec<UserRecord>, StoreError> {
    let (clause, text, id) = match lookup {
        Lookup::All => ("true", None, None),
        Lookup::Id(id) => ("id = $3", None, Some(id)),
        Lookup::Name(n) => ("lower(user_name) = lower($2)", Some(n), None),
        Lookup::ExternalId(e) => ("external_id = $2", Some(e), None),
    };
    let rows: Vec<UserRow> = sqlx::query_as(&format!(
        "select {USER_COLUMNS} from identity_users where tenant_id = $1 and {clause} order by id"
    ))
    .bind(tenant.uuid())
    .bind(text)
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let memberships: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
        "select m.user_id, g.id, g.display_name from identity_group_members m \
         join identity_groups g on g.id = m.group_id \
         where m.tenant_id = $1 and m.user_id = any($2) order by g.id",
    )
    .bind(tenant.uuid())
    .bind(&ids)
    .fetch_all(conn)
    .await?;
    let mut memberships = by_owner(memberships);
    Ok(rows
        .into_iter()
        .map(|row| {
            let groups = memberships.remove(&row.id).unwrap_or_default();
            row.record(groups)
        })
        .collect())
}

/// Which of `ids` are users of `tenant`.
pub async fn users_existing(conn: &mut Conn, tenant: TenantId, ids: &[Uuid]) -> Result<Vec<Uuid>, StoreError> {
    Ok(sqlx::query_scalar("select id from identity_users where tenant_id = $1 and id = any($2)")
        .bind(tenant.uuid())
        .bind(ids)
        .fetch_all(conn)
        .await?)
}

#[derive(Debug, sqlx::FromRow)]
struct GroupRow {
    id: Uuid,
    display_name: String,
    external_id: Option<String>,
    gid_number: i32,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// Inserts a group of `tenant` with its number (claimed by the caller).
pub async fn group_insert(
    conn: &mut Conn,
    tenant: TenantId,
    id: Uuid,
    display_name: &str,
    external_id: Option<&str>,
    gid: i32,
) -> Result<(), StoreError> {
    sqlx::query(
        "insert into identity_groups (id, tenant_id, display_name, external_id, gid_number) \
         values ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(tenant.uuid())
    .bind(display_name)
    .bind(external_id)
    .bind(gid)
    .execute(conn)
    .await?;
    Ok(())
}

/// Replaces a group's attributes; false when `tenant` has no such group.
pub async fn group_update(
    conn: &mut Conn,
    tenant: TenantId,
    id: Uuid,
    display_name: &str,
    external_id: Option<&str>,
    gid: i32,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "update identity_groups set display_name = $3, external_id = $4, gid_number = $5, \
             version = version + 1, updated_at = now() \
         where tenant_id = $1 and id = $2",
    )
    .bind(tenant.uuid())
    .bind(id)
    .bind(display_name)
    .bind(external_id)
    .bind(gid)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Makes `members` (users of `tenant`, checked by the caller) the group's members.
pub async fn members_set(conn: &mut Conn, tenant: TenantId, group: Uuid, members: &[Uuid]) -> Result<(), StoreError> {
    sqlx::query("delete from identity_group_members where tenant_id = $1 and group_id = $2 and user_id <> all($3)")
        .bind(tenant.uuid())
        .bind(group)
        .bind(members)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "insert into identity_group_members (tenant_id, group_id, user_id) \
         select $1, $2, u from unnest($3::uuid[]) u on conflict do nothing",
    )
    .bind(tenant.uuid())
    .bind(group)
    .bind(members)
    .execute(conn)
    .await?;
    Ok(())
}

/// Deletes a group (its memberships and number with it); false when `tenant` has no such group.
pub async fn group_delete(conn: &mut Conn, tenant: TenantId, id: Uuid) -> Result<bool, StoreError> {
    let done = sqlx::query("delete from identity_groups where tenant_id = $1 and id = $2")
        .bind(tenant.uuid())
        .bind(id)
        .execute(conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The groups of `tenant` that `lookup` selects, ordered by creation, with their members.
pub async fn groups(conn: &mut Conn, tenant: TenantId, lookup: Lookup<'_>) -> Result<Vec<GroupRecord>, StoreError> {
    let (clause, text, id) = match lookup {
        Lookup::All => ("true", None, None),
        Lookup::Id(id) => ("id = $3", None, Some(id)),
        Lookup::Name(n) => ("lower(display_name) = lower($2)", Some(n), None),
        Lookup::ExternalId(e) => ("external_id = $2", Some(e), None),
    };
    let rows: Vec<GroupRow> = sqlx::query_as(&format!(
        "select id, display_name, external_id, gid_number, created_at, updated_at from identity_groups \
         where tenant_id = $1 and {clause} order by id"
    ))
    .bind(tenant.uuid())
    .bind(text)
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let members: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
        "select m.group_id, u.id, u.user_name from identity_group_members m \
         join identity_users u on u.id = m.user_id \
         where m.tenant_id = $1 and m.group_id = any($2) order by u.id",
    )
    .bind(tenant.uuid())
    .bind(&ids)
    .fetch_all(conn)
    .await?;
    let mut members = by_owner(members);
    Ok(rows
        .into_iter()
        .map(|g| GroupRecord {
            members: members.remove(&g.id).unwrap_or_default(),
            id: g.id,
            display_name: g.display_name,
            external_id: g.external_id,
            gid_number: g.gid_number,
            created_at: g.created_at,
            updated_at: g.updated_at,
        })
        .collect())
}

/// A group of the tenant as a Slurm cluster maps it: its name and its members' login names, each
/// with whether the user is active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedGroup {
    /// The group's `displayName`.
    pub display_name: String,
    /// Its members: (`userName`, `active`), by creation.
    pub members: Vec<(String, bool)>,
}

/// The groups of `tenant` whose `displayName` is one of `names` (without regard to case), with
/// their members. Another tenant's group of the same name is never among them.
pub async fn mapped_groups(
    conn: &mut Conn,
    tenant: TenantId,
    names: &[String],
) -> Result<Vec<MappedGroup>, StoreError> {
    let lowered: Vec<String> = names.iter().map(|n| n.to_lowercase()).collect();
    let rows: Vec<(Uuid, String, Option<String>, Option<bool>)> = sqlx::query_as(
        "select g.id, g.display_name, u.user_name, u.active from identity_groups g \
         left join identity_group_members m on m.group_id = g.id and m.tenant_id = g.tenant_id \
         left join identity_users u on u.id = m.user_id and u.tenant_id = g.tenant_id \
         where g.tenant_id = $1 and lower(g.display_name) = any($2) order by g.id, u.id",
    )
    .bind(tenant.uuid())
    .bind(&lowered)
    .fetch_all(conn)
    .await?;
    let mut groups: Vec<(Uuid, MappedGroup)> = Vec::new();
    for (id, display_name, user, active) in rows {
        if groups.last().is_none_or(|(last, _)| *last != id) {
            groups.push((id, MappedGroup { display_name, members: Vec::new() }));
        }
        if let (Some(user), Some(active), Some((_, group))) = (user, active, groups.last_mut()) {
            group.members.push((user, active));
        }
    }
    Ok(groups.into_iter().map(|(_, g)| g).collect())
}
