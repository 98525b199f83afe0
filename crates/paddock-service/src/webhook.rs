//! Webhook subscriptions: the provider's (`/v1/webhooks`, provider:admin, every event) and a
//! tenant's (`/v1/tenants/{tenant_id}/webhooks`, tenant:admin, its own tenant's events only).
//! The signing secret is sealed at rest and shown only at creation and rotation.

use std::collections::BTreeSet;
use std::time::Duration;

use paddock_domain::cursor::PageRequest;
use paddock_domain::secret::Binding;
use paddock_domain::webhook::{new_secret, EVENTS, PROVIDER_ONLY};
use paddock_domain::{Error, Permission, Result, Scope};
use paddock_store::webhook::{self as store, delivery, WebhookRow};
use paddock_store::Tx;
use paddock_types::webhook::{DeliveryView, WebhookCreate, WebhookView, WebhookWithSecret};
use paddock_types::{TenantId, WebhookDeliveryId, WebhookId};
use serde_json::json;

use crate::{Body, Ctx, Done, Listed, Services};

const NOT_FOUND: Error = Error::NotFound { kind: "webhook" };

/// How long the secret before a rotation keeps signing beside the new one.
pub const ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 3600);

/// The longest URL accepted.
const MAX_URL: usize = 2048;

/// Whose subscriptions a call is about: the provider's (`None`) or a tenant's.
pub type Owner = Option<TenantId>;

/// The binding of a subscription's secrets (current and previous share it: a rotation moves the
/// sealed value from one column to the other).
pub fn secret_binding(id: uuid::Uuid) -> Binding<'static> {
    Binding { table: "webhook_subscriptions", column: "secret", row: id }
}

impl Services {
    /// 403 unless the caller may manage `owner`'s subscriptions; 404 for a foreign tenant.
    fn webhook_authorize(&self, ctx: &Ctx, owner: Owner) -> Result<()> {
        match owner {
            None => match ctx.actor.authorize(Permission::WebhookWrite)? {
                Scope::All => Ok(()),
                Scope::Tenant(_) => Err(Error::Forbidden(
                    "the provider's webhooks are provider:admin's; a tenant manages its own under /v1/tenants/{tenant_id}/webhooks"
                        .to_owned(),
                )),
            },
            Some(tenant) => ctx.actor.authorize_tenant(Permission::WebhookWrite, tenant, "tenant").map(|_| ()),
        }
    }

    async fn webhook_begin(&self, owner: Owner) -> Result<Tx> {
        let mut tx = self.store.begin().await?;
        if let Some(tenant) = owner {
            paddock_store::tenant::get(&mut tx, tenant).await?.ok_or(Error::NotFound { kind: "tenant" })?;
        }
        Ok(tx)
    }

    /// Creates a subscription; the answer carries its secret, shown this once.
    pub async fn webhook_create(&self, ctx: &Ctx, owner: Owner, body: &Body) -> Result<WebhookWithSecret> {
        self.audited(ctx, "webhook.create", "webhook", async |audit| {
            self.webhook_authorize(ctx, owner)?;
            let spec: WebhookCreate = body.decode()?;
            self.webhook_validate(owner, &spec)?;
            let id = WebhookId::new();
            audit.target(id.uuid(), owner);
            let secret = new_secret();
            let sealed = self.cipher.seal(secret.as_bytes(), secret_binding(id.uuid())).map_err(Error::internal)?;
            let mut tx = self.webhook_begin(owner).await?;
            let row = store::insert(&mut tx, owner, id, &spec, &sealed).await?;
            let value = WebhookWithSecret { webhook: row.view(), secret };
            let details = json!({ "url": spec.url, "events": spec.events, "enabled": spec.enabled });
            Ok(Done::Commit { tx, value, details })
        })
        .await
    }

    /// Lists `owner`'s subscriptions.
    pub async fn webhook_list(&self, ctx: &Ctx, owner: Owner, page: PageRequest) -> Result<Listed<WebhookView>> {
        self.webhook_authorize(ctx, owner)?;
        let mut tx = self.webhook_begin(owner).await?;
        let items: Vec<WebhookView> =
            store::list(&mut tx, owner, page.after, page.limit).await?.iter().map(WebhookRow::view).collect();
        let next_cursor = page.next_cursor(&items, |w| w.id.uuid());
        Ok(Listed { items, next_cursor })
    }

    /// Reads one subscription.
    pub async fn webhook_get(&self, ctx: &Ctx, owner: Owner, id: WebhookId) -> Result<WebhookView> {
        self.webhook_authorize(ctx, owner)?;
        let mut conn = self.store.conn().await?;
        Ok(store::get(&mut conn, owner, id).await?.ok_or(NOT_FOUND)?.view())
    }

    /// Applies a merge patch (url, events, description, enabled).
    pub async fn webhook_update(&self, ctx: &Ctx, owner: Owner, id: WebhookId, body: &Body) -> Result<WebhookView> {
        self.audited(ctx, "webhook.update", "webhook", async |audit| {
            self.webhook_authorize(ctx, owner)?;
            audit.target(id.uuid(), owner);
            let mut tx = self.store.begin().await?;
            let current = store::get_for_update(&mut tx, owner, id).await?.ok_or(NOT_FOUND)?;
            let patch = body.value()?;
            let spec = body.apply_patch(&spec_of(&current), &patch, &[])?;
            self.webhook_validate(owner, &spec)?;
            let value = store::update(&mut tx, id, &spec).await?.view();
            Ok(Done::Commit { tx, value, details: json!({ "patch": patch }) })
        })
        .await
    }

    /// Replaces the secret; the old one keeps signing beside it for [`ROTATION_OVERLAP`].
    pub async fn webhook_rotate_secret(&self, ctx: &Ctx, owner: Owner, id: WebhookId) -> Result<WebhookWithSecret> {
        self.audited(ctx, "webhook.rotate_secret", "webhook", async |audit| {
            self.webhook_authorize(ctx, owner)?;
            audit.target(id.uuid(), owner);
            let mut tx = self.store.begin().await?;
            store::get_for_update(&mut tx, owner, id).await?.ok_or(NOT_FOUND)?;
            let secret = new_secret();
            let sealed = self.cipher.seal(secret.as_bytes(), secret_binding(id.uuid())).map_err(Error::internal)?;
            let row = store::rotate(&mut tx, id, &sealed, ROTATION_OVERLAP).await?;
            let value = WebhookWithSecret { webhook: row.view(), secret };
            Ok(Done::Commit { tx, value, details: json!({}) })
        })
        .await
    }

    /// Deletes a subscription and its deliveries.
    pub async fn webhook_delete(&self, ctx: &Ctx, owner: Owner, id: WebhookId) -> Result<()> {
        self.audited(ctx, "webhook.delete", "webhook", async |audit| {
            self.webhook_authorize(ctx, owner)?;
            audit.target(id.uuid(), owner);
            let mut tx = self.store.begin().await?;
            let current = store::get_for_update(&mut tx, owner, id).await?.ok_or(NOT_FOUND)?;
            store::delete(&mut tx, id).await?;
            Ok(Done::Commit { tx, value: (), details: json!({ "url": current.url }) })
        })
        .await
    }

    /// Lists a subscription's deliveries, oldest first.
    pub async fn webhook_deliveries(
        &self,
        ctx: &Ctx,
        owner: Owner,
        id: WebhookId,
        page: PageRequest,
    ) -> Result<Listed<DeliveryView>> {
        self.webhook_authorize(ctx, owner)?;
        let mut conn = self.store.conn().await?;
        store::get(&mut conn, owner, id).await?.ok_or(NOT_FOUND)?;
        let items = delivery::list(&mut conn, id, page.after, page.limit).await?;
        let next_cursor = page.next_cursor(&items, |d| d.id.uuid());
        Ok(Listed { items, next_cursor })
    }

    /// Puts a delivery back in the queue, due now (it is sent when the subscription is enabled
    /// and the subject's earlier events are delivered).
    pub async fn webhook_redeliver(
        &self,
        ctx: &Ctx,
        owner: Owner,
        id: WebhookId,
        delivery_id: WebhookDeliveryId,
    ) -> Result<DeliveryView> {
        self.audited(ctx, "webhook.redeliver", "webhook", async |audit| {
            self.webhook_authorize(ctx, owner)?;
            audit.target(id.uuid(), owner);
            let mut tx = self.store.begin().await?;
            store::get_for_update(&mut tx, owner, id).await?.ok_or(NOT_FOUND)?;
            let value =
                delivery::redeliver(&mut tx, id, delivery_id).await?.ok_or(Error::NotFound { kind: "delivery" })?;
            Ok(Done::Commit { tx, value, details: json!({ "delivery_id": delivery_id }) })
        })
        .await
    }

    fn webhook_validate(&self, owner: Owner, spec: &WebhookCreate) -> Result<()> {
        let mut errors = Vec::new();
        if spec.url.len() > MAX_URL {
            errors.push(field("url", format!("must be at most {MAX_URL} characters")));
        } else if let Err(why) = self.webhook_guard.check_url(&spec.url) {
            errors.push(field("url", why));
        }
        if spec.events.is_empty() || spec.events.len() > 20 {
            errors.push(field("events", "must name 1 to 20 events".to_owned()));
        }
        let mut seen = BTreeSet::new();
        for (i, event) in spec.events.iter().enumerate() {
            if !EVENTS.contains(&event.as_str()) {
                errors.push(field(&format!("events[{i}]"), format!("{event:?} is not one of {}", EVENTS.join(", "))));
            } else if owner.is_some() && PROVIDER_ONLY.contains(&event.as_str()) {
                errors.push(field(&format!("events[{i}]"), format!("{event} is the provider's only")));
            } else if !seen.insert(event) {
                errors.push(field(&format!("events[{i}]"), format!("{event} is named twice")));
            }
        }
        if spec.description.chars().count() > 1000 {
            errors.push(field("description", "must be at most 1000 characters".to_owned()));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Invalid(errors))
        }
    }
}

fn field(name: &str, message: String) -> paddock_types::problem::FieldError {
    paddock_types::problem::FieldError { field: name.to_owned(), message }
}

fn spec_of(row: &WebhookRow) -> WebhookCreate {
    WebhookCreate {
        url: row.url.clone(),
        events: row.events.clone(),
        description: row.description.clone(),
        enabled: row.enabled,
    }
}
