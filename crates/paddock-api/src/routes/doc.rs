//! What every operation of a group of routes shares in the OpenAPI document, declared here once
//! instead of in each `#[utoipa::path]`: who may call it (the bearer token of the `/v1` routes
//! behind `auth::authenticate`, what an agent route declares, nothing for the process endpoints), the Problem answer of every failure,
//! and the `Idempotency-Key` every authenticated `POST` accepts (`idempotency::idempotency`).
//!
//! Every operation also lists the 4xx (and 503) answers it can give, each with the `code`s it
//! uses (in its description and as `x-problem-codes`): those that follow from the operation's
//! shape (a bearer token, a path parameter, a body, `If-Match`, a `POST`) are derived here, the
//! rest (conflicts of state) are [`conflicts`], one table. The API tests hold every answer they
//! see to this (`paddock_testkit::contract`).

use std::collections::BTreeMap;

use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::security::SecurityRequirement;
use utoipa::openapi::{ContentBuilder, ObjectBuilder, OpenApi, Ref, Required, ResponseBuilder, Type};

/// How a group of routes is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Behind the bearer-token middleware; failures are Problems; `POST` takes `Idempotency-Key`.
    Bearer,
    /// The agents': each route declares its own credential (the seed token in the path, or the
    /// run's agent token as a bearer: the `agent_token` scheme); failures are Problems.
    Agent,
    /// Without any credential (process endpoints); they answer no Problem.
    Open,
}

/// Applies what `access` means to every operation of `openapi`.
pub fn document(openapi: &mut OpenApi, access: Access) {
    for item in openapi.paths.paths.values_mut() {
        if let Some(op) = &mut item.post {
            apply(op, access, true);
        }
        for op in [&mut item.get, &mut item.put, &mut item.delete, &mut item.patch].into_iter().flatten() {
            apply(op, access, false);
        }
    }
}

/// A query parameter named like a path parameter (`tenant_id` of the shared usage and audit
/// queries under `/v1/tenants/{tenant_id}/...`) is the path's to set: it is not listed twice.
fn drop_shadowed(op: &mut Operation) {
    let Some(params) = &mut op.parameters else { return };
    let fixed: Vec<String> =
        params.iter().filter(|p| p.parameter_in == ParameterIn::Path).map(|p| p.name.clone()).collect();
    params.retain(|p| p.parameter_in != ParameterIn::Query || !fixed.contains(&p.name));
}

/// The failures of one operation: status -> the codes it answers with.
type Failures = BTreeMap<u16, Vec<&'static str>>;

/// What the operation's shape says it can fail with (before `apply` adds `Idempotency-Key`).
fn derived(op: &Operation, access: Access, post: bool) -> Failures {
    let params = op.parameters.as_deref().unwrap_or_default();
    let has = |place: ParameterIn| params.iter().any(|p| p.parameter_in == place);
    let named = |name: &str| params.iter().any(|p| p.name == name);
    let mut f = Failures::new();
    let mut add = |status: u16, codes: &[&'static str]| f.entry(status).or_default().extend_from_slice(codes);
    match access {
        Access::Bearer => {
            add(401, &["missing_token", "invalid_token", "token_expired", "token_not_yet_valid"]);
            add(403, &["forbidden"]);
        }
        Access::Agent
            if op.security.as_ref().is_some_and(|s| s.iter().any(|r| *r != SecurityRequirement::default())) =>
        {
            add(401, &["missing_token", "invalid_token"]);
        }
        Access::Agent | Access::Open => {}
    }
    // The edge's limits (`limits`) hold for every route.
    add(429, &["rate_limited"]);
    add(503, &["overloaded", "request_timeout"]);
    if access == Access::Open {
        return f;
    }
    add(503, &["unavailable"]);
    if has(ParameterIn::Path) {
        // A malformed id is as unknown as a foreign one (`extract::Path`).
        add(404, &["not_found"]);
    }
    if has(ParameterIn::Query) {
        add(400, &["invalid_parameter"]);
    }
    if has(ParameterIn::Query) || access == Access::Bearer {
        // An unknown query parameter, on any authenticated operation (`extract::Query`).
        add(422, &["validation_failed"]);
    }
    if named("cursor") {
        add(400, &["invalid_cursor"]);
    }
    if op.request_body.is_some() {
        add(400, &["malformed_body"]);
        add(413, &["payload_too_large"]);
        add(415, &["unsupported_media_type"]);
        add(422, &["validation_failed"]);
    }
    if named("If-Match") {
        add(412, &["precondition_failed"]);
    }
    if access == Access::Bearer && post {
        add(400, &["invalid_idempotency_key"]);
        add(409, &["idempotency_in_flight"]);
        add(422, &["idempotency_key_reused"]);
    }
    f
}

/// The conflicts of state (and other failures no shape implies), per operation id.
fn conflicts(operation_id: &str) -> &'static [(u16, &'static [&'static str])] {
    const SUSPENDED: &str = "tenant_suspended";
    const NOT_FOUND: &str = "not_found";
    const INVALID: &str = "validation_failed";
    match operation_id {
        "tenant_create" => &[(409, &["tenant_name_taken"])],
        "tenant_update" => &[(409, &["tenant_name_taken"])],
        "tenant_delete" => &[(409, &["tenant_not_empty"])],
        "machine_class_create" => &[(409, &["machine_class_name_taken"])],
        "machine_class_update" | "machine_class_delete" => &[(409, &["machine_class_in_use"])],
        "machine_enroll" => &[(409, &["machine_name_taken", "machine_already_enrolled"])],
        "machine_update" => {
            &[(409, &["machine_name_taken", "machine_already_enrolled", "duplicate_system", "machine_retired"])]
        }
        "machine_retire" => &[(409, &["retire_pending", "machine_busy", "machine_retired"])],
        "machine_force_release" => {
            &[(409, &["machine_not_in_tenancy", "force_release_pending", "duplicate_system", "machine_retired"])]
        }
        "machine_health_report_create" => &[(409, &["machine_retired"])],
        "cluster_machine_power_cycle" => &[(409, &[SUSPENDED, "cluster_deleting", "machine_not_active"])],
        "cluster_machine_replace" => &[(409, &[SUSPENDED, "cluster_deleting", "remediation_open", "machine_leaving"])],
        "machine_maintenance_enter" => &[(409, &["already_in_maintenance", "duplicate_system", "machine_retired"])],
        "machine_maintenance_leave" => &[(409, &["not_in_maintenance", "duplicate_system", "machine_retired"])],
        "cluster_create" => &[
            (409, &[SUSPENDED, "cluster_name_taken", "quota_exceeded", "insufficient_capacity"]),
            (
                422,
                &[
                    "system_pool_required",
                    "system_pool_duplicate",
                    "system_pool_empty",
                    "system_pool_unsupported",
                    "system_pool_autoscaled",
                    "autoscaling_unsupported",
                    "slurm_account_duplicate",
                    "slurm_account_group_unknown",
                ],
            ),
        ],
        "cluster_update" => &[
            (409, &[SUSPENDED, "cluster_deleting", "quota_exceeded", "insufficient_capacity"]),
            (422, &["slurm_account_duplicate", "slurm_account_group_unknown"]),
        ],
        "cluster_delete" => &[(409, &[SUSPENDED, "cluster_deleting"])],
        "node_pool_create" => &[
            (409, &[SUSPENDED, "cluster_deleting", "node_pool_name_taken", "quota_exceeded", "insufficient_capacity"]),
            (422, &["system_pool_duplicate", "system_pool_unsupported", "autoscaling_unsupported"]),
        ],
        "node_pool_update" => &[
            (
                409,
                &[
                    SUSPENDED,
                    "cluster_deleting",
                    "node_pool_deleting",
                    "quota_exceeded",
                    "insufficient_capacity",
                    "autoscaled_count",
                ],
            ),
            (422, &["system_pool_shrink", "system_pool_autoscaled", "ray_head_pool_empty", "autoscaling_unsupported"]),
        ],
        // A Slurm cluster's system pool goes only with its cluster: deleting it is 422.
        "node_pool_delete" => &[
            (409, &[SUSPENDED, "cluster_deleting", "node_pool_deleting"]),
            (422, &["system_pool_undeletable", "ray_head_pool_undeletable"]),
        ],
        "cluster_kubeconfig" => {
            &[(409, &[SUSPENDED, "driver_not_configured", "cluster_not_ready", "cluster_unreachable"])]
        }
        // Past its exports running at once, a caller is refused (429 with Retry-After).
        "usage_export" => &[
            (404, &[NOT_FOUND]),
            (409, &["price_missing", "billing_provider_name_missing"]),
            (429, &["too_many_exports"]),
        ],
        "tenant_usage_export" => {
            &[(409, &["price_missing", "billing_provider_name_missing"]), (429, &["too_many_exports"])]
        }
        "usage_period_close" => &[
            (400, &["idempotency_key_required"]),
            (409, &["period_not_closable", "signing_key_missing", "usage_overflow"]),
            (422, &[INVALID]),
        ],
        "usage_signing_key_view" | "custody_checkpoint_view" | "custody_verify" => &[(409, &["signing_key_missing"])],
        // An unknown agent token is 404, like an unknown seed token.
        "agent_config_view" | "agent_report" | "agent_seed_view" => {
            &[(404, &[NOT_FOUND]), (409, &["agent_token_used"]), (410, &["agent_token_expired"])]
        }
        "usage_period_view" => &[(422, &[INVALID])],
        // A new SCIM token is a tenant's write; revoking one is allowed while it is suspended.
        "scim_token_create" => &[(409, &[SUSPENDED])],
        // A `tenant_id` filter naming a tenant the caller cannot read is 404.
        "usage_record_list" | "operation_list" => &[(404, &[NOT_FOUND])],
        // Sums past 64 bits are refused, never wrapped.
        "usage_aggregate_view" => &[(404, &[NOT_FOUND]), (409, &["usage_overflow"])],
        "tenant_usage_aggregate_view" => &[(409, &["usage_overflow"])],
        // A cluster that is not the tenant's is a field error.
        "usage_adjustment_create" => &[(404, &[NOT_FOUND]), (422, &[INVALID])],
        _ => &[],
    }
}

/// Adds one response per failure status, each naming its codes.
fn add_failures(op: &mut Operation, mut failures: Failures) {
    let id = op.operation_id.clone().unwrap_or_default();
    for (status, codes) in conflicts(&id) {
        failures.entry(*status).or_default().extend_from_slice(codes);
    }
    for (status, mut codes) in failures {
        codes.sort_unstable();
        codes.dedup();
        op.responses.responses.entry(status.to_string()).or_insert_with(|| failure(status, &codes).into());
    }
}

/// A failure's answer: its title, its codes in the description and as `x-problem-codes`.
fn failure(status: u16, codes: &[&str]) -> utoipa::openapi::Response {
    let title = http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Problem");
    let listed: Vec<String> = codes.iter().map(|c| format!("`{c}`")).collect();
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build();
    ResponseBuilder::new()
        .description(format!("{title}: {}", listed.join(", ")))
        .content("application/problem+json", content)
        .extensions(Some(ExtensionsBuilder::new().add("x-problem-codes", codes.to_vec()).build()))
        .build()
}

fn apply(op: &mut Operation, access: Access, post: bool) {
    drop_shadowed(op);
    let failures = derived(op, access, post);
    add_failures(op, failures);
    match access {
        Access::Bearer => op.security = Some(vec![SecurityRequirement::new("bearer", Vec::<String>::new())]),
        Access::Agent => {
            op.security.get_or_insert_with(|| vec![SecurityRequirement::default()]);
        }
        Access::Open => op.security = Some(vec![SecurityRequirement::default()]),
    }
    if access != Access::Open {
        // An operation may describe its own failures more precisely.
        op.responses.responses.entry("default".to_owned()).or_insert_with(|| problem().into());
    }
    if access == Access::Bearer && post {
        // Closing a billing period requires one (400 `idempotency_key_required`).
        let required = conflicts(op.operation_id.as_deref().unwrap_or_default())
            .iter()
            .any(|(_, codes)| codes.contains(&"idempotency_key_required"));
        op.parameters.get_or_insert_with(Vec::new).push(idempotency_key(required));
    }
}

/// The answer of every failure: `application/problem+json`.
fn problem() -> utoipa::openapi::Response {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build();
    ResponseBuilder::new().description("Problem").content("application/problem+json", content).build()
}

fn idempotency_key(required: bool) -> Parameter {
    // What `idempotency::idempotency` accepts: 1 to 255 visible ASCII characters.
    let key = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(255))
        .pattern(Some("^[\\x21-\\x7e]+$"));
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .description(Some("Replays the first answer for 24 h"))
        .required(if required { Required::True } else { Required::False })
        .schema(Some(key))
        .build()
}

/// Drops the component schemas nothing refers to: those registered for a generic's parameter
/// that the generic inlines (`Page<T>`'s items). Repeated until none is left, since a dropped
/// schema may have been the only one to refer to another.
pub fn prune_unreferenced(openapi: &mut OpenApi) {
    loop {
        let text = serde_json::to_string(&*openapi).unwrap_or_default();
        let Some(components) = &mut openapi.components else { return };
        let before = components.schemas.len();
        components.schemas.retain(|name, _| text.contains(&format!("\"#/components/schemas/{name}\"")));
        if components.schemas.len() == before {
            return;
        }
    }
}

/// The Ray catalogue of the stacks this release carries, in the document: `RaySpec.version`'s
/// `enum` is every Ray version of any stack, and `RaySpec` carries `x-ray-catalogue`, per stack
/// version its Ray releases with their images (pinned by tag) and its default. Which stack a
/// cluster runs (`stack_version`) decides which of them its `ray.version` may name.
pub fn ray_catalogue(openapi: &mut OpenApi) {
    use utoipa::openapi::{RefOr, Schema};
    let stacks: Vec<&paddock_domain::stack::StackDefinition> =
        paddock_domain::stack::definitions().filter(|d| d.ray.is_some()).collect();
    let mut versions: Vec<&str> = stacks.iter().filter_map(|d| d.ray.as_ref()).flat_map(|r| r.versions()).collect();
    versions.sort_unstable();
    versions.dedup();
    let catalogue: Vec<serde_json::Value> = stacks
        .iter()
        .filter_map(|d| Some((d, d.ray.as_ref()?)))
        .map(|(d, ray)| {
            let releases: Vec<serde_json::Value> = ray
                .releases
                .iter()
                .map(|r| serde_json::json!({"version": r.version, "image": ray.image(r, false), "gpu_image": ray.image(r, true)}))
                .collect();
            serde_json::json!({"stack_version": d.version, "default": ray.default_version(), "releases": releases})
        })
        .collect();
    let Some(RefOr::T(Schema::Object(spec))) = openapi.components.as_mut().and_then(|c| c.schemas.get_mut("RaySpec"))
    else {
        return;
    };
    if let Some(RefOr::T(Schema::Object(version))) = spec.properties.get_mut("version") {
        version.enum_values = Some(versions.into_iter().map(serde_json::Value::from).collect());
    }
    let extension = ExtensionsBuilder::new().add("x-ray-catalogue", catalogue).build();
    match &mut spec.extensions {
        Some(existing) => existing.merge(extension),
        None => spec.extensions = Some(extension),
    }
}
