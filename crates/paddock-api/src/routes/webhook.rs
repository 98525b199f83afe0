//! `/v1/webhooks` (the provider's subscriptions, provider:admin) and
//! `/v1/tenants/{tenant_id}/webhooks` (a tenant's, tenant:admin: its own tenant's events only).

use axum::extract::State;
use axum::response::Response;
use paddock_domain::cursor::PageRequest;
use paddock_types::page::PageParams;
use paddock_types::webhook::{DeliveryView, WebhookCreate, WebhookUpdate, WebhookView, WebhookWithSecret};
use paddock_types::{TenantId, WebhookDeliveryId, WebhookId};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{JsonBody, Path, Query};
use crate::respond;
use crate::state::AppState;

fn location(tenant: Option<TenantId>, id: WebhookId) -> String {
    match tenant {
        None => format!("/v1/webhooks/{id}"),
        Some(tenant) => format!("/v1/tenants/{tenant}/webhooks/{id}"),
    }
}

/// Creates the provider's webhook subscription.
///
/// Subscribes a URL to events (provider:admin). The answer carries the signing secret (`whsec_...`), shown
/// this once; every delivery is signed with it (Standard Webhooks `webhook-signature`).
#[utoipa::path(post, path = "/v1/webhooks", operation_id = "webhook_create", tag = "webhooks",
    request_body = WebhookCreate,
    responses(
        (status = 201, description = "Created, with its secret", body = WebhookWithSecret,
            headers(("Location" = String, description = "The subscription")))))]
pub async fn webhook_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let created = s.services.webhook_create(&ctx, None, &body).await?;
    Ok(respond::created_untagged(&created, &location(None, created.webhook.id)))
}

/// Lists the provider's webhook subscriptions.
///
/// The subscriptions, a page at a time (provider:admin); never their secrets.
#[utoipa::path(get, path = "/v1/webhooks", operation_id = "webhook_list", tag = "webhooks",
    params(PageParams),
    responses(
        (status = 200, description = "A page of subscriptions", body = paddock_types::page::Page<WebhookView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn webhook_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.webhook_list(&ctx, None, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Reads a webhook subscription.
///
/// One subscription (provider:admin), without its secret.
#[utoipa::path(get, path = "/v1/webhooks/{webhook_id}", operation_id = "webhook_view", tag = "webhooks",
    params(("webhook_id" = WebhookId, Path, description = "Webhook id")),
    responses((status = 200, description = "The subscription", body = WebhookView)))]
pub async fn webhook_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<WebhookId>,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.webhook_get(&ctx, None, id).await?))
}

/// Changes a webhook subscription (JSON merge patch).
///
/// Changes its URL, events, description or `enabled` (provider:admin). Enabling a subscription paddock
/// disabled clears `disabled_reason` and sends its held events again, in order.
#[utoipa::path(patch, path = "/v1/webhooks/{webhook_id}", operation_id = "webhook_update", tag = "webhooks",
    request_body(content((WebhookUpdate = "application/merge-patch+json"), (WebhookUpdate = "application/json"))),
    params(("webhook_id" = WebhookId, Path, description = "Webhook id")),
    responses((status = 200, description = "The changed subscription", body = WebhookView)))]
pub async fn webhook_update(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<WebhookId>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.webhook_update(&ctx, None, id, &body).await?))
}

/// Deletes a webhook subscription.
///
/// Deletes the subscription and its deliveries (provider:admin); nothing more is sent to it.
#[utoipa::path(delete, path = "/v1/webhooks/{webhook_id}", operation_id = "webhook_delete", tag = "webhooks",
    params(("webhook_id" = WebhookId, Path, description = "Webhook id")),
    responses((status = 204, description = "Deleted")))]
pub async fn webhook_delete(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<WebhookId>,
) -> Result<Response, ApiError> {
    s.services.webhook_delete(&ctx, None, id).await?;
    Ok(respond::no_content())
}

/// Rotates a webhook subscription's signing secret.
///
/// A new secret, shown this once (provider:admin); for 24 hours the old one signs too (the
/// `webhook-signature` header then carries both signatures), so receivers can switch at leisure.
#[utoipa::path(post, path = "/v1/webhooks/{webhook_id}/rotate-secret", operation_id = "webhook_rotate_secret", tag = "webhooks",
    params(("webhook_id" = WebhookId, Path, description = "Webhook id")),
    responses((status = 200, description = "The subscription with its new secret", body = WebhookWithSecret)))]
pub async fn webhook_rotate_secret(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<WebhookId>,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.webhook_rotate_secret(&ctx, None, id).await?))
}

/// Lists a webhook subscription's deliveries.
///
/// Each event fanned out to the subscription, oldest first (provider:admin): its state, tries, last status and
/// latency, and when it is tried next.
#[utoipa::path(get, path = "/v1/webhooks/{webhook_id}/deliveries", operation_id = "webhook_delivery_list", tag = "webhooks",
    params(("webhook_id" = WebhookId, Path, description = "Webhook id"), PageParams),
    responses(
        (status = 200, description = "A page of deliveries", body = paddock_types::page::Page<DeliveryView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn webhook_delivery_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(id): Path<WebhookId>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.webhook_deliveries(&ctx, None, id, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Sends a delivery again.
///
/// Puts the delivery back in the queue, due now (provider:admin); it goes out under the same `webhook-id`
/// once the subscription is enabled and the subject's earlier events are delivered.
#[utoipa::path(post, path = "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver", operation_id = "webhook_redeliver", tag = "webhooks",
    params(("webhook_id" = WebhookId, Path, description = "Webhook id"), ("delivery_id" = WebhookDeliveryId, Path, description = "Delivery id")),
    responses((status = 202, description = "Queued", body = DeliveryView)))]
pub async fn webhook_redeliver(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((id, delivery)): Path<(WebhookId, WebhookDeliveryId)>,
) -> Result<Response, ApiError> {
    let queued = s.services.webhook_redeliver(&ctx, None, id, delivery).await?;
    Ok(respond::queued(&queued))
}

/// Creates a tenant's webhook subscription.
///
/// Subscribes a URL to events (tenant:admin of the tenant, or provider:admin). The answer carries the signing secret (`whsec_...`), shown
/// this once; every delivery is signed with it (Standard Webhooks `webhook-signature`).
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/webhooks", operation_id = "tenant_webhook_create", tag = "webhooks",
    request_body = WebhookCreate,
    params(("tenant_id" = TenantId, Path, description = "Tenant id")),
    responses(
        (status = 201, description = "Created, with its secret", body = WebhookWithSecret,
            headers(("Location" = String, description = "The subscription")))))]
pub async fn tenant_webhook_create(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let created = s.services.webhook_create(&ctx, Some(tenant), &body).await?;
    Ok(respond::created_untagged(&created, &location(Some(tenant), created.webhook.id)))
}

/// Lists a tenant's webhook subscriptions.
///
/// The subscriptions, a page at a time (tenant:admin of the tenant, or provider:admin); never their secrets.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/webhooks", operation_id = "tenant_webhook_list", tag = "webhooks",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), PageParams),
    responses(
        (status = 200, description = "A page of subscriptions", body = paddock_types::page::Page<WebhookView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn tenant_webhook_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path(tenant): Path<TenantId>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.webhook_list(&ctx, Some(tenant), page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Reads a webhook subscription.
///
/// One subscription (tenant:admin of the tenant, or provider:admin), without its secret.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/webhooks/{webhook_id}", operation_id = "tenant_webhook_view", tag = "webhooks",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("webhook_id" = WebhookId, Path, description = "Webhook id")),
    responses((status = 200, description = "The subscription", body = WebhookView)))]
pub async fn tenant_webhook_view(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, WebhookId)>,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.webhook_get(&ctx, Some(tenant), id).await?))
}

/// Changes a webhook subscription (JSON merge patch).
///
/// Changes its URL, events, description or `enabled` (tenant:admin of the tenant, or provider:admin). Enabling a subscription paddock
/// disabled clears `disabled_reason` and sends its held events again, in order.
#[utoipa::path(patch, path = "/v1/tenants/{tenant_id}/webhooks/{webhook_id}", operation_id = "tenant_webhook_update", tag = "webhooks",
    request_body(content((WebhookUpdate = "application/merge-patch+json"), (WebhookUpdate = "application/json"))),
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("webhook_id" = WebhookId, Path, description = "Webhook id")),
    responses((status = 200, description = "The changed subscription", body = WebhookView)))]
pub async fn tenant_webhook_update(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, WebhookId)>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.webhook_update(&ctx, Some(tenant), id, &body).await?))
}

/// Deletes a webhook subscription.
///
/// Deletes the subscription and its deliveries (tenant:admin of the tenant, or provider:admin); nothing more is sent to it.
#[utoipa::path(delete, path = "/v1/tenants/{tenant_id}/webhooks/{webhook_id}", operation_id = "tenant_webhook_delete", tag = "webhooks",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("webhook_id" = WebhookId, Path, description = "Webhook id")),
    responses((status = 204, description = "Deleted")))]
pub async fn tenant_webhook_delete(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, WebhookId)>,
) -> Result<Response, ApiError> {
    s.services.webhook_delete(&ctx, Some(tenant), id).await?;
    Ok(respond::no_content())
}

/// Rotates a webhook subscription's signing secret.
///
/// A new secret, shown this once (tenant:admin of the tenant, or provider:admin); for 24 hours the old one signs too (the
/// `webhook-signature` header then carries both signatures), so receivers can switch at leisure.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/webhooks/{webhook_id}/rotate-secret", operation_id = "tenant_webhook_rotate_secret", tag = "webhooks",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("webhook_id" = WebhookId, Path, description = "Webhook id")),
    responses((status = 200, description = "The subscription with its new secret", body = WebhookWithSecret)))]
pub async fn tenant_webhook_rotate_secret(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, WebhookId)>,
) -> Result<Response, ApiError> {
    Ok(respond::ok(&s.services.webhook_rotate_secret(&ctx, Some(tenant), id).await?))
}

/// Lists a webhook subscription's deliveries.
///
/// Each event fanned out to the subscription, oldest first (tenant:admin of the tenant, or provider:admin): its state, tries, last status and
/// latency, and when it is tried next.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/webhooks/{webhook_id}/deliveries", operation_id = "tenant_webhook_delivery_list", tag = "webhooks",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("webhook_id" = WebhookId, Path, description = "Webhook id"), PageParams),
    responses(
        (status = 200, description = "A page of deliveries", body = paddock_types::page::Page<DeliveryView>,
            headers(("Link" = String, description = "The next page, rel=\"next\"")))))]
pub async fn tenant_webhook_delivery_list(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id)): Path<(TenantId, WebhookId)>,
    Query(q): Query<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::parse(q.limit.as_deref(), q.cursor.as_deref())?;
    let listed = s.services.webhook_deliveries(&ctx, Some(tenant), id, page).await?;
    Ok(respond::page(listed.items, listed.next_cursor))
}

/// Sends a delivery again.
///
/// Puts the delivery back in the queue, due now (tenant:admin of the tenant, or provider:admin); it goes out under the same `webhook-id`
/// once the subscription is enabled and the subject's earlier events are delivered.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver", operation_id = "tenant_webhook_redeliver", tag = "webhooks",
    params(("tenant_id" = TenantId, Path, description = "Tenant id"), ("webhook_id" = WebhookId, Path, description = "Webhook id"), ("delivery_id" = WebhookDeliveryId, Path, description = "Delivery id")),
    responses((status = 202, description = "Queued", body = DeliveryView)))]
pub async fn tenant_webhook_redeliver(
    State(s): State<AppState>,
    Caller(ctx): Caller,
    Path((tenant, id, delivery)): Path<(TenantId, WebhookId, WebhookDeliveryId)>,
) -> Result<Response, ApiError> {
    let queued = s.services.webhook_redeliver(&ctx, Some(tenant), id, delivery).await?;
    Ok(respond::queued(&queued))
}
