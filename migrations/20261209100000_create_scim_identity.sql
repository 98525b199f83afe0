-- A tenant's people, pushed by its identity provider over SCIM 2.0 (docs/tenants.md, "People and
-- identity (SCIM)"): users, groups and their members, the POSIX ids paddock assigns them, and the
-- bearer tokens the identity provider authenticates with.

-- A tenant's SCIM bearer tokens: `pdk_scim_` and 32 random bytes (base64url), shown once at
-- creation and stored only as their SHA-256. Revoked tokens stay (the audit trail names them).
create table scim_tokens (
    id uuid primary key,
    tenant_id uuid not null references tenants (id) on delete cascade,
    description text not null default '',
    token_sha256 bytea not null unique,
    created_by text not null,
    created_at timestamptz not null default now(),
    revoked_at timestamptz
);
create index scim_tokens_tenant_idx on scim_tokens (tenant_id, id);

create table identity_users (
    id uuid primary key,
    tenant_id uuid not null references tenants (id) on delete cascade,
    -- SCIM `userName` (case-insensitive, unique within the tenant): the POSIX login name.
    user_name text not null,
    external_id text,
    display_name text,
    -- SCIM `name` and `emails` as the identity provider sent them (known sub-attributes only).
    name jsonb,
    emails jsonb not null default '[]',
    active boolean not null default true,
    uid_number integer not null,
    gid_number integer not null,
    login_shell text not null,
    ssh_public_keys text[] not null default '{}',
    -- Bumped by every change: the sync of clusters follows it.
    version bigint not null default 1,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);
create unique index identity_users_tenant_user_name_key on identity_users (tenant_id, lower(user_name));
create index identity_users_tenant_external_idx on identity_users (tenant_id, external_id);

create table identity_groups (
    id uuid primary key,
    tenant_id uuid not null references tenants (id) on delete cascade,
    -- SCIM `displayName` (case-insensitive, unique within the tenant): the POSIX group name.
    display_name text not null,
    external_id text,
    gid_number integer not null,
    version bigint not null default 1,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
);
create unique index identity_groups_tenant_display_name_key on identity_groups (tenant_id, lower(display_name));

create table identity_group_members (
    tenant_id uuid not null references tenants (id) on delete cascade,
    group_id uuid not null references identity_groups (id) on delete cascade,
    user_id uuid not null references identity_users (id) on delete cascade,
    primary key (group_id, user_id)
);
create index identity_group_members_user_idx on identity_group_members (user_id);

-- One POSIX id space per tenant: each user's uidNumber and each group's gidNumber is a number no
-- other user or group of the tenant holds (a user's private group shares its uid), so a number
-- never names two things on a cluster. A deleted user's or group's number stays, retired (no
-- owner): paddock never gives it to anyone else (files on the clusters may still carry it); only
-- the identity provider may name it again.
create table identity_numbers (
    tenant_id uuid not null references tenants (id) on delete cascade,
    number integer not null,
    user_id uuid references identity_users (id) on delete set null,
    group_id uuid references identity_groups (id) on delete set null,
    primary key (tenant_id, number),
    constraint identity_numbers_one_owner check (user_id is null or group_id is null)
);
create unique index identity_numbers_user_key on identity_numbers (user_id) where user_id is not null;
create unique index identity_numbers_group_key on identity_numbers (group_id) where group_id is not null;
