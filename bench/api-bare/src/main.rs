//! `api-bare`: bench/api-load's baseline for paddock's API. The stack paddock's API is built on
//! (axum over hyper and tokio, sqlx, jsonwebtoken, serde), serving the two calls the benchmark
//! drives, and nothing else:
//!
//! - `GET /v1/tenants/{id}`: verifies the same HS256 JWT (signature, `exp`, `iat`, issuer,
//!   audience, lifetime), reads the tenant with paddock's statement (the row and its quota use)
//!   and answers the same `TenantView` with its `ETag`;
//! - `POST /v1/tenants`: verifies the token, decodes the same `TenantCreate` and runs paddock's
//!   one statement that inserts the tenant and its `tenant.create` audit event, answering 201
//!   with the view, `ETag` and `Location`.
//!
//! Same allocator (jemalloc) and pool settings as `paddock api` (`PADDOCK_DATABASE_MAX_CONNECTIONS`,
//! default 16; no ping before an acquire; `jit=off`; `statement_timeout` 30 s), same
//! multi-threaded tokio runtime.
//! What it leaves out is paddock's own request path: request ids and the request's task-local,
//! metrics, the in-flight bound and request timeout, the rate limit, the idempotency middleware,
//! the actor and permission model, name and label validation, failure audit events, and the
//! header-read timeout of paddock's server loop. That is what bench/api-load compares.
//!
//! Settings (environment): `PADDOCK_DATABASE_URL`, `PADDOCK_JWT_HS256_SECRET`,
//! `PADDOCK_JWT_ISSUER` and `PADDOCK_JWT_AUDIENCE` (default `paddock`),
//! `PADDOCK_DATABASE_MAX_CONNECTIONS` (default 16), `API_BARE_LISTEN` (default 127.0.0.1:6830).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::{header, HeaderMap, HeaderValue, StatusCode};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use paddock_types::tenant::{QuotaUse, Quotas, TenantCreate, TenantState, TenantView};
use paddock_types::{Labels, TenantId};
use serde::Deserialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

/// paddock-store's tenant columns (`tenant::COLUMNS`): the row and its quota use.
const COLUMNS: &str = "id, name, display_name, labels, max_clusters, max_nodes, max_gpus, \
    (select count(*) from clusters c where c.tenant_id = tenants.id and c.deleted_at is null \
       and c.deletion_requested_at is null) as use_clusters, \
    (select coalesce(sum(p.count), 0)::bigint from node_pools p join clusters c on c.id = p.cluster_id \
       where p.tenant_id = tenants.id and p.deleted_at is null and p.deletion_requested_at is null \
         and c.deletion_requested_at is null) as use_nodes, \
    (select coalesce(sum(p.count::bigint * mc.gpu_count), 0)::bigint from node_pools p \
       join machine_classes mc on mc.id = p.machine_class_id join clusters c on c.id = p.cluster_id \
       where p.tenant_id = tenants.id and p.deleted_at is null and p.deletion_requested_at is null \
         and c.deletion_requested_at is null) as use_gpus, \
    state, generation, created_at, updated_at";

/// The longest token lifetime paddock accepts by default (`PADDOCK_TOKEN_MAX_LIFETIME`).
const MAX_LIFETIME_SECS: i64 = 86_400;

#[derive(Clone)]
struct Bare {
    pool: PgPool,
    key: Arc<DecodingKey>,
    validation: Arc<Validation>,
    select_sql: Arc<str>,
    insert_sql: Arc<str>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    tenant_id: Option<Uuid>,
    exp: i64,
    iat: i64,
}

#[derive(sqlx::FromRow)]
struct TenantRow {
    id: Uuid,
    name: String,
    display_name: String,
    labels: Json<Labels>,
    max_clusters: Option<i32>,
    max_nodes: Option<i32>,
    max_gpus: Option<i32>,
    use_clusters: i64,
    use_nodes: i64,
    use_gpus: i64,
    state: String,
    generation: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TenantRow {
    fn view(self) -> Option<TenantView> {
        let quota = |v: Option<i32>| v.and_then(|v| u32::try_from(v).ok());
        let count = |v: i64| u64::try_from(v).unwrap_or(0);
        let state = match self.state.as_str() {
            "active" => TenantState::Active,
            "suspended" => TenantState::Suspended,
            _ => return None,
        };
        Some(TenantView {
            id: TenantId(self.id),
            name: self.name,
            display_name: self.display_name,
            labels: self.labels.0,
            quotas: Quotas {
                max_clusters: quota(self.max_clusters),
                max_nodes: quota(self.max_nodes),
                max_gpus: quota(self.max_gpus),
            },
            quota_use: QuotaUse {
                clusters: count(self.use_clusters),
                nodes: count(self.use_nodes),
                gpus: count(self.use_gpus),
            },
            state,
            generation: self.generation,
            etag: format!("\"{}\"", self.generation),
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

fn problem(status: StatusCode, detail: &str) -> Response {
    let body = serde_json::json!({ "type": "about:blank", "status": status.as_u16(), "detail": detail });
    (status, [(header::CONTENT_TYPE, "application/problem+json")], body.to_string()).into_response()
}

fn answer(status: StatusCode, view: &TenantView, location: bool) -> Response {
    let Ok(body) = serde_json::to_vec(view) else {
        return problem(StatusCode::INTERNAL_SERVER_ERROR, "serialization failed");
    };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(etag) = HeaderValue::from_str(&view.etag) {
        headers.insert(header::ETAG, etag);
    }
    if let Some(Ok(location)) = location.then(|| HeaderValue::from_str(&format!("/v1/tenants/{}", view.id.0))) {
        headers.insert(header::LOCATION, location);
    }
    response
}

fn database_error(e: &sqlx::Error) -> Response {
    eprintln!("api-bare: database: {e}");
    problem(StatusCode::SERVICE_UNAVAILABLE, "database error")
}

impl Bare {
    /// The verified claims of the request's bearer token; `None` answers 401.
    fn verify(&self, headers: &HeaderMap) -> Option<Claims> {
        let token = headers.get(header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ")?;
        let claims = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).ok()?.claims;
        (!claims.sub.is_empty() && claims.exp.saturating_sub(claims.iat) <= MAX_LIFETIME_SECS).then_some(claims)
    }
}

fn unauthenticated() -> Response {
    problem(StatusCode::UNAUTHORIZED, "invalid or missing bearer token")
}

async fn tenant_view(State(bare): State<Bare>, headers: HeaderMap, Path(id): Path<Uuid>) -> Response {
    let Some(claims) = bare.verify(&headers) else {
        return unauthenticated();
    };
    let provider = claims.roles.iter().any(|r| r.starts_with("provider:"));
    if !provider && claims.tenant_id != Some(id) {
        return problem(StatusCode::NOT_FOUND, "no such tenant");
    }
    let row: Option<TenantRow> = match sqlx::query_as(&bare.select_sql).bind(id).fetch_optional(&bare.pool).await {
        Ok(row) => row,
        Err(e) => return database_error(&e),
    };
    match row.and_then(TenantRow::view) {
        Some(view) => answer(StatusCode::OK, &view, false),
        None => problem(StatusCode::NOT_FOUND, "no such tenant"),
    }
}

async fn tenant_create(State(bare): State<Bare>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(claims) = bare.verify(&headers) else {
        return unauthenticated();
    };
    if !claims.roles.iter().any(|r| r == "provider:admin") {
        return problem(StatusCode::FORBIDDEN, "provider:admin only");
    }
    let mut spec: TenantCreate = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if spec.display_name.trim().is_empty() {
        spec.display_name.clone_from(&spec.name);
    }
    let (id, request_id) = (Uuid::now_v7(), Uuid::now_v7());
    let quota = |v: Option<u32>| v.map(|v| i32::try_from(v).unwrap_or(i32::MAX));
    let row: Result<TenantRow, _> = sqlx::query_as(&bare.insert_sql)
        .bind(id)
        .bind(&spec.name)
        .bind(&spec.display_name)
        .bind(Json(&spec.labels))
        .bind(quota(spec.quotas.max_clusters))
        .bind(quota(spec.quotas.max_nodes))
        .bind(quota(spec.quotas.max_gpus))
        .bind(Uuid::now_v7())
        .bind(&claims.sub)
        .bind(&claims.roles)
        .bind(Some(id))
        .bind("tenant.create")
        .bind("tenant")
        .bind(Some(id))
        .bind(request_id.to_string())
        .bind(request_id)
        .bind("success")
        .bind(None::<&str>)
        .bind(serde_json::json!({ "name": spec.name }))
        .fetch_one(&bare.pool)
        .await;
    match row {
        Ok(row) => match row.view() {
            Some(view) => answer(StatusCode::CREATED, &view, true),
            None => problem(StatusCode::INTERNAL_SERVER_ERROR, "unknown state"),
        },
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => problem(StatusCode::CONFLICT, "name taken"),
        Err(e) => database_error(&e),
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_owned())
}

/// The pool as paddock-store's `Store::connect_lazy_with_timeout` makes it.
fn pool() -> anyhow::Result<PgPool> {
    let url = std::env::var("PADDOCK_DATABASE_URL").context("PADDOCK_DATABASE_URL")?;
    let max: u32 =
        env_or("PADDOCK_DATABASE_MAX_CONNECTIONS", "16").parse().context("PADDOCK_DATABASE_MAX_CONNECTIONS")?;
    let options: PgConnectOptions = url.parse().context("PADDOCK_DATABASE_URL")?;
    let options = options.options([("jit", "off")]).options([("statement_timeout", "30000")]);
    Ok(PgPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options.application_name("api-bare")))
}

fn state() -> anyhow::Result<Bare> {
    let secret = std::env::var("PADDOCK_JWT_HS256_SECRET").context("PADDOCK_JWT_HS256_SECRET")?;
    let mut validation = Validation::new(Algorithm::HS256);
    validation.leeway = 30;
    validation.set_issuer(&[env_or("PADDOCK_JWT_ISSUER", "paddock")]);
    validation.set_audience(&[env_or("PADDOCK_JWT_AUDIENCE", "paddock")]);
    validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    let audit: Vec<String> = (8..20).map(|i| format!("${i}")).collect();
    Ok(Bare {
        pool: pool()?,
        key: Arc::new(DecodingKey::from_secret(secret.as_bytes())),
        validation: Arc::new(validation),
        select_sql: format!("select {COLUMNS} from tenants where id = $1 and deleted_at is null").into(),
        insert_sql: format!(
            "with t as (insert into tenants (id, name, display_name, labels, max_clusters, max_nodes, max_gpus) \
             values ($1, $2, $3, $4, $5, $6, $7) returning {COLUMNS}), \
             e as (insert into audit_events (id, actor_sub, actor_roles, tenant_id, action, target_type, \
             target_id, request_id, server_request_id, outcome, code, details) values ({})) select * from t",
            audit.join(", ")
        )
        .into(),
    })
}

/// paddock's allocator (`crates/paddock/src/main.rs`): the baseline runs on the same stack.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    let listen = env_or("API_BARE_LISTEN", "127.0.0.1:6830");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        // The pool needs the runtime, even a lazy one.
        let app = Router::new()
            .route("/v1/tenants", axum::routing::post(tenant_create))
            .route("/v1/tenants/{id}", get(tenant_view))
            .with_state(state()?);
        let listener =
            tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listening on {listen}"))?;
        eprintln!("api-bare: listening on http://{listen}");
        axum::serve(listener, app).await.context("serving")
    })
}
