//! `/v1/machine-classes`.

use axum::extract::State;
use axum::response::Response;
use paddock_domain::cursor::PageRequest;
use paddock_types::machine_class::{MachineClassCreate, MachineClassUpdate, MachineClassView};
use paddock_types::page::PageParams;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{IfMatchHeader, JsonBody, Path, Query};
use crate::respond;
use crate::state::AppState;

/// Creates a machine class.
///
/// Defines a machine class (`provider:admin`): the hardware a pool asks for (CPU, memory, GPUs) and
/// optionally its prices, which the FOCUS export uses.
#[utoipa::path(post, path = "/v1/machine-classes", operation_id = "machine_class_create", tag = "machine-classes",
    request_body = MachineClassCreate,
    responses(
        (status = 201, description = "Created", body = MachineClassView,
            headers(("ETag" = String, description = "Generation etag"), ("Location" = String, description = "The class")))))]
pub async fn machine_class_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let class = s.services.machine_class_create(&ctx, &body).await?.view();
    Ok(respond::created(&class, &class.etag, &format!("/v1/machine-classes/{}", class.name)))
}

/// Lists machine classes.
///
/// Every machine class, a page at a time; readable by every role (a tenant chooses from them).
#[utoipa::path(get, path = "/v1/machine-classes", operation_id = "machine_class_list", tag = "machine-classes",
    params(PageParams),
    responses(
        (status = 200, description = "A page of classes", body = paddock_types::page::Page<MachineClassView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn machine_class_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.machine_class_list(&ctx, page).await?;
    Ok(respond::page(listed.items.iter().map(|c| c.view()).collect(), listed.next_cursor))
}

/// Reads a machine class.
///
/// One machine class, by name.
#[utoipa::path(get, path = "/v1/machine-classes/{name}", operation_id = "machine_class_view", tag = "machine-classes",
    params(("name" = String, Path, description = "Class name")),
    responses(
        (status = 200, description = "The class", body = MachineClassView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn machine_class_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let class = s.services.machine_class_get(&ctx, &name).await?.view();
    Ok(respond::object(&class, &class.etag))
}

/// Changes a machine class (JSON merge patch).
///
/// Changes a machine class with a JSON merge patch (`provider:admin`): its description, labels or prices;
/// what machines of the class are may not change while any is enrolled (409 `machine_class_in_use`).
#[utoipa::path(patch, path = "/v1/machine-classes/{name}", operation_id = "machine_class_update", tag = "machine-classes",
    request_body(content((MachineClassUpdate = "application/merge-patch+json"), (MachineClassUpdate = "application/json"))),
    params(("name" = String, Path, description = "Class name"),
        ("If-Match" = Option<String>, Header, description = "Etag the class must still have")),
    responses(
        (status = 200, description = "The changed class", body = MachineClassView, headers(("ETag" = String, description = "Generation etag")))))]
pub async fn machine_class_update(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(name): Path<String>,
    IfMatchHeader(if_match): IfMatchHeader,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let class = s.services.machine_class_update(&ctx, &name, &body, &if_match).await?.view();
    Ok(respond::object(&class, &class.etag))
}

/// Deletes a machine class; 409 while machines use it.
///
/// Deletes a machine class that no machine uses (`provider:admin`; 409 `machine_class_in_use` otherwise).
#[utoipa::path(delete, path = "/v1/machine-classes/{name}", operation_id = "machine_class_delete", tag = "machine-classes",
    params(("name" = String, Path, description = "Class name"),
        ("If-Match" = Option<String>, Header, description = "Etag the class must still have")),
    responses(
        (status = 204, description = "Deleted")))]
pub async fn machine_class_delete(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(name): Path<String>,
    IfMatchHeader(if_match): IfMatchHeader,
) -> Result<Response, ApiError> {
    s.services.machine_class_delete(&ctx, &name, &if_match).await?;
    Ok(respond::no_content())
}
