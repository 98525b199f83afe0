//! The HTTP edge of paddock: the axum router, handlers, extractors, Problem answers and the
//! OpenAPI document. Routes and document come from one list (`api_routes`), so they cannot drift.
//! Errors are mapped to HTTP exactly once, in `error`.

pub mod auth;
pub mod console;
pub mod context;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod limits;
pub mod metrics;
pub mod respond;
pub mod routes;
pub mod scim;
pub mod shape;
pub mod state;

use std::sync::LazyLock;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::{header, HeaderName, HeaderValue, Method};
use tower::ServiceBuilder;
use tower_http::cors::{AllowOrigin, CorsLayer};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::OpenApi as OpenApiDoc;
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use state::{ApiConfig, AppState};

use paddock_types::problem::Problem;
use routes::doc::{self, Access};
use routes::{
    agent, audit, cluster, custody, health, isolation, machine, machine_class, operation, remediation, scim_token,
    tenant, usage, webhook,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "paddock",
        description = "Control plane for fully isolated managed Slurm and Kubernetes clusters on dedicated bare metal.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    paths(agent::agent_seed_view),
    modifiers(&BearerAuth),
    components(schemas(Problem)),
    tags(
        (name = "tenants", description = "The provider's customers"),
        (name = "clusters", description = "Tenant clusters and their node pools"),
        (name = "machine-classes", description = "Hardware profiles"),
        (name = "machines", description = "The bare-metal inventory"),
        (name = "operations", description = "Progress of asynchronous changes"),
        (name = "audit", description = "Who did what"),
        (name = "usage", description = "Metering: usage records, aggregates, exports, billing periods"),
        (name = "identity", description = "A tenant's people: the SCIM tokens its identity provider pushes users and groups with (SCIM 2.0 itself, under /v1/tenants/{tenant_id}/scim/v2/, is described by its own discovery endpoints)"),
        (name = "webhooks", description = "Signed event deliveries (CloudEvents bodies, Standard Webhooks signatures)"),
        (name = "agent", description = "Machine-facing endpoints of the wipe and provisioning agents (the run's seed token in the seed URL, its agent token as the bearer; no JWT)"),
        (name = "health", description = "Process endpoints")
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut OpenApiDoc) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut scheme = Http::new(HttpAuthScheme::Bearer);
        scheme.bearer_format = Some("JWT".to_owned());
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
        let mut agent = Http::new(HttpAuthScheme::Bearer);
        agent.bearer_format = Some("agent token (base64url, from the run's seed)".to_owned());
        agent.description = Some("The run's agent token, found in paddock/agent.json of its seed".to_owned());
        components.add_security_scheme("agent_token", SecurityScheme::Http(agent));
    }
}

/// The `/v1` routes, which need a bearer token.
fn v1_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(tenant::tenant_create, tenant::tenant_list))
        .routes(routes!(tenant::tenant_view, tenant::tenant_update, tenant::tenant_delete))
        .routes(routes!(tenant::tenant_suspend))
        .routes(routes!(tenant::tenant_resume))
        .routes(routes!(cluster::cluster_create, cluster::cluster_list))
        .routes(routes!(cluster::cluster_view, cluster::cluster_update, cluster::cluster_delete))
        .routes(routes!(cluster::cluster_event_list))
        .routes(routes!(cluster::cluster_kubeconfig))
        .routes(routes!(cluster::node_pool_create, cluster::node_pool_list))
        .routes(routes!(cluster::node_pool_view, cluster::node_pool_update, cluster::node_pool_delete))
        .routes(routes!(cluster::node_pool_machine_list))
        .routes(routes!(cluster::cluster_machine_list))
        .routes(routes!(cluster::cluster_machine_view))
        .routes(routes!(cluster::cluster_machine_health_report_list))
        .routes(routes!(remediation::cluster_machine_replace))
        .routes(routes!(remediation::cluster_machine_power_cycle))
        .routes(routes!(remediation::cluster_remediation_list))
        .routes(routes!(remediation::remediation_list))
        .routes(routes!(machine_class::machine_class_create, machine_class::machine_class_list))
        .routes(routes!(
            machine_class::machine_class_view,
            machine_class::machine_class_update,
            machine_class::machine_class_delete
        ))
        .routes(routes!(machine::machine_enroll, machine::machine_list))
        .routes(routes!(machine::machine_view, machine::machine_update, machine::machine_retire))
        .routes(routes!(machine::machine_maintenance_enter, machine::machine_maintenance_leave))
        .routes(routes!(machine::machine_force_release))
        .routes(routes!(machine::machine_custody_view))
        .routes(routes!(machine::machine_health_report_create, machine::machine_health_report_list))
        .routes(routes!(isolation::isolation_report_view))
        .routes(routes!(custody::custody_checkpoint_view))
        .routes(routes!(custody::custody_verify))
        .routes(routes!(operation::operation_list))
        .routes(routes!(operation::operation_view))
        .routes(routes!(operation::tenant_operation_list))
        .routes(routes!(operation::tenant_operation_view))
        .routes(routes!(audit::audit_event_list))
        .routes(routes!(audit::tenant_audit_event_list))
        .routes(routes!(usage::usage_record_list))
        .routes(routes!(usage::tenant_usage_record_list))
        .routes(routes!(usage::usage_aggregate_view))
        .routes(routes!(usage::tenant_usage_aggregate_view))
        .routes(routes!(usage::usage_export))
        .routes(routes!(usage::tenant_usage_export))
        .routes(routes!(usage::usage_period_view))
        .routes(routes!(usage::usage_period_close))
        .routes(routes!(usage::usage_signing_key_view))
        .routes(routes!(usage::usage_adjustment_create))
        .routes(routes!(webhook::webhook_create, webhook::webhook_list))
        .routes(routes!(webhook::webhook_view, webhook::webhook_update, webhook::webhook_delete))
        .routes(routes!(webhook::webhook_rotate_secret))
        .routes(routes!(webhook::webhook_delivery_list))
        .routes(routes!(webhook::webhook_redeliver))
        .routes(routes!(webhook::tenant_webhook_create, webhook::tenant_webhook_list))
        .routes(routes!(webhook::tenant_webhook_view, webhook::tenant_webhook_update, webhook::tenant_webhook_delete))
        .routes(routes!(webhook::tenant_webhook_rotate_secret))
        .routes(routes!(webhook::tenant_webhook_delivery_list))
        .routes(routes!(webhook::tenant_webhook_redeliver))
        .routes(routes!(scim_token::scim_token_create, scim_token::scim_token_list))
        .routes(routes!(scim_token::scim_token_revoke))
}

/// Every route with its documentation; what each group's operations share (security, the
/// Problem answer, `Idempotency-Key`) is added here, once per group (`routes::doc`).
fn api_routes() -> OpenApiRouter<AppState> {
    let groups = [(v1_routes(), Access::Bearer), (agent_routes(), Access::Agent), (process_routes(), Access::Open)];
    // `ApiDoc`'s one path is the agents' seed.
    let mut base = ApiDoc::openapi();
    doc::document(&mut base, Access::Agent);
    groups.into_iter().fold(OpenApiRouter::with_openapi(base), |api, (mut group, access)| {
        doc::document(group.get_openapi_mut(), access);
        api.merge(group)
    })
}

/// Routes without a JWT: the agents' (the seed token in the seed URL, the agent token as their
/// bearer) and the process endpoints. The seed's route is documented through `ApiDoc` (its path
/// `{seed_token}.iso` has a suffix the router cannot match, see `agent::SEED_ROUTE`).
fn public_routes() -> OpenApiRouter<AppState> {
    agent_routes().merge(process_routes())
}

/// The machine agents' routes: the one-time token in the path is the credential.
fn agent_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(agent::agent_config_view))
        .route(agent::SEED_ROUTE, axum::routing::get(agent::agent_seed_view))
        .routes(routes!(agent::agent_report))
}

/// The process endpoints: health, metrics, the document itself.
fn process_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health::health_live))
        .routes(routes!(health::health_ready))
        .routes(routes!(health::metrics_view))
        .routes(routes!(health::openapi_view))
}

/// The OpenAPI document, generated from the routes.
pub fn openapi() -> OpenApiDoc {
    let mut doc = api_routes().into_openapi();
    doc::prune_unreferenced(&mut doc);
    doc::ray_catalogue(&mut doc);
    routes::links::add(&mut doc);
    // Relative: the document is served by the API itself (`/openapi.json`), so clients resolve
    // the paths against wherever they fetched it; `paddock dev` serves on http://127.0.0.1:8080.
    doc.servers = Some(vec![
        utoipa::openapi::ServerBuilder::new().url("/").description(Some("The API serving this document")).build(),
        utoipa::openapi::ServerBuilder::new().url("http://127.0.0.1:8080").description(Some("paddock dev")).build(),
    ]);
    doc
}

static OPENAPI_JSON: LazyLock<String> =
    LazyLock::new(|| openapi().to_pretty_json().unwrap_or_else(|_| "{}".to_owned()));

/// The OpenAPI document as served and committed (pretty JSON, trailing newline).
pub fn openapi_json() -> String {
    format!("{}\n", *OPENAPI_JSON)
}

/// The application: routes, the operator console (`console`), fallbacks and the middleware
/// stack. The agents' routes are left out
/// when they have a listener of their own ([`AppState::with_agent_routes`], [`agent_router`]).
pub fn router(state: AppState) -> Router {
    let (v1, _) = OpenApiRouter::<AppState>::new().merge(v1_routes()).split_for_parts();
    // SCIM answers in its own terms (`scim`); it is not in the document.
    let v1 = v1.merge(scim::router());
    let public = if state.agents_here { public_routes() } else { process_routes() };
    let (public, _) = public.split_for_parts();
    // The console is no API: not in the document, no token (its page sends the user's to `/v1`).
    let console = console::router(&state.config.console);
    assemble(state, [(v1, Group::V1), (public, Group::Public), (console, Group::Public)])
}

/// The agents' routes alone, for the listener of their own (`PADDOCK_AGENT_LISTEN`, on the
/// provisioning network): nothing else of the API answers there, its document included (404).
pub fn agent_router(state: AppState) -> Router {
    let (agents, _) = agent_routes().split_for_parts();
    assemble(state, [(agents, Group::Public)])
}

/// `routes` with their groups' middleware, and the 404 of the paths none matches.
///
/// Every route has one middleware layer, [`edge`], with the steps its group needs; a layer costs
/// each request a clone of the boxed route below it, a boxed `Next` and a boxed future, so the
/// steps are one function rather than one layer each. The 405 of a known path with another method
/// and the 404 of an unknown path go through their group's steps too.
fn assemble<const N: usize>(state: AppState, routes: [(Router<AppState>, Group); N]) -> Router {
    let layer = |group| {
        ServiceBuilder::new()
            .layer(from_fn_with_state((state.clone(), group), edge))
            .option_layer(cors(&state.config.cors_origins))
            .layer(DefaultBodyLimit::max(extract::BODY_LIMIT))
    };
    let unmatched = Router::new().fallback(extract::route_not_found).layer(layer(Group::Unmatched));
    routes
        .into_iter()
        .fold(unmatched, |app, (group_routes, group)| {
            app.merge(group_routes.method_not_allowed_fallback(extract::method_not_allowed).layer(layer(group)))
        })
        .with_state(state)
}

/// The routes that share one set of middleware steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    /// `/v1`: the caller is authenticated, rate limited, and its idempotency key honoured.
    V1,
    /// The agents' and the process's own routes: rate limited by address, or by agent token once
    /// a route has accepted it.
    Public,
    /// No route: the 404, rate limited by address.
    Unmatched,
}

/// The middleware of every route, outermost first: the request's id and path (`context`), its
/// count and time (`metrics`), the process's bound on requests in flight and on their time
/// (`limits`), then the group's [`steps`].
async fn edge(State((state, group)): State<(AppState, Group)>, req: Request, next: Next) -> Response {
    context::in_context(req, async |req| {
        metrics::tracked(&state.metrics, req, async |req| {
            // Boxed: each wrapper above holds (and so moves) the future it runs, and the steps'
            // future is the largest of them (the token check's). One allocation is cheaper than
            // copying it at every level (it made the whole future 15 kB).
            limits::within_bounds(&state.edge, Box::pin(steps(&state, group, req, next))).await
        })
        .await
    })
    .await
}

/// The steps of a route group: for `/v1` authentication (`auth`), the caller's rate limit (after
/// authentication, so a subject is a verified one) and idempotency keys (`idempotency`); for the
/// other routes and the 404 the rate limit, and on the agents' routes the vouching for a token
/// the route accepted.
async fn steps(state: &AppState, group: Group, mut req: Request, next: Next) -> Response {
    if group == Group::V1 {
        auth::identify(&state.verifier, &mut req).await;
    }
    if let Err(refused) = limits::admit(&state.edge, &req) {
        return refused.into_response();
    }
    if group == Group::V1 && idempotency::applies(&req) {
        // Boxed: its kilobytes of state are for these requests only.
        return Box::pin(idempotency::idempotency(state, req, next)).await;
    }
    let agent = limits::agent_key(&req);
    let response = next.run(req).await;
    if let Some(key) = agent {
        limits::vouch(&state.edge, key, &response);
    }
    response
}

/// CORS for the portal's origins; none configured, no CORS headers at all.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    let origins: Vec<HeaderValue> = origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
    if origins.is_empty() {
        return None;
    }
    let request_id = context::REQUEST_ID.clone();
    let idempotency_key = idempotency::IDEMPOTENCY_KEY.clone();
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([Method::GET, Method::POST, Method::PATCH, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::IF_MATCH,
                idempotency_key,
                request_id.clone(),
            ])
            .expose_headers([
                header::ETAG,
                header::LINK,
                header::LOCATION,
                header::RETRY_AFTER,
                request_id,
                HeaderName::from_static(routes::cluster::EXPIRES_AT),
            ])
            .max_age(Duration::from_secs(600)),
    )
}
