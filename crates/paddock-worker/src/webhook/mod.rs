//! Webhook deliveries: fans new events out to the subscriptions that want them, claims due
//! deliveries under a lease (`paddock_store::webhook::delivery`), and POSTs each as a CloudEvents
//! 1.0 structured JSON body signed the Standard Webhooks way. At least once, in order per
//! (subscription, subject): a killed worker's claim expires and another worker sends the event
//! again under the same `webhook-id`.

mod metrics;
mod resolve;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
pub use metrics::{DeliveryMetrics, OUTCOMES};
use paddock_domain::secret::Cipher;
use paddock_domain::webhook::{sign, AddressGuard};
use paddock_service::webhook::secret_binding;
use paddock_store::webhook::delivery::{self, Claimed, Recorded, Tried};
use paddock_store::{Store, StoreError};
pub use resolve::{GuardedResolver, Lookup, SystemLookup};

/// How deliveries are made.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    /// The CloudEvents `source`: the API's public URL (`PADDOCK_PUBLIC_URL`).
    pub source: String,
    /// This worker's id, on its claims.
    pub worker_id: String,
    /// Deliveries in flight at once.
    pub concurrency: u32,
    /// How long a claim lasts; longer than [`DeliveryConfig::attempt_timeout`].
    pub lease: Duration,
    /// The most one try may take (connect, send, answer).
    pub attempt_timeout: Duration,
    /// How often an idle deliverer looks for new events (one probe of an index of the events not
    /// yet fanned out): the longest a new event waits before it is fanned out and sent.
    pub event_poll: Duration,
    /// The longest an idle deliverer waits before it makes a whole round again (deliveries
    /// redelivered or re-enabled, claims that expired): the safety net. A retry is tried when it
    /// comes due.
    pub poll_interval: Duration,
    /// The first retry's delay; doubled per try, with jitter.
    pub retry_base: Duration,
    /// The longest delay between tries.
    pub retry_cap: Duration,
}

impl DeliveryConfig {
    /// The defaults, for `source` and `worker_id`.
    pub fn new(source: impl Into<String>, worker_id: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            worker_id: worker_id.into(),
            concurrency: 16,
            lease: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(15),
            event_poll: Duration::from_millis(500),
            poll_interval: Duration::from_secs(10),
            retry_base: Duration::from_secs(5),
            retry_cap: Duration::from_secs(3600),
        }
    }
}

/// Why the deliverer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DelivererError {
    /// The HTTP client could not be made.
    #[error("the webhook HTTP client could not be built")]
    Client(#[source] reqwest::Error),
}

/// Makes the deliveries.
#[derive(Clone)]
pub struct Deliverer {
    store: Store,
    cipher: Arc<Cipher>,
    guard: Arc<AddressGuard>,
    client: reqwest::Client,
    config: Arc<DeliveryConfig>,
    metrics: Arc<DeliveryMetrics>,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer").field("config", &self.config).finish_non_exhaustive()
    }
}

/// How often a running deliverer reads the backlog for its metrics.
const BACKLOG_EVERY: Duration = Duration::from_secs(5);

/// The largest answer body read from a receiver (the rest is dropped).
const MAX_ANSWER: usize = 4096;

impl Deliverer {
    /// A deliverer whose connections go only to addresses `guard` allows, as `lookup` resolves
    /// them (checked at every connect: no redirect is followed, no proxy used).
    pub fn new(
        store: Store,
        cipher: Arc<Cipher>,
        guard: Arc<AddressGuard>,
        lookup: Arc<dyn Lookup>,
        config: DeliveryConfig,
    ) -> Result<Self, DelivererError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver::new(lookup, guard.clone())))
            .timeout(config.attempt_timeout)
            .connect_timeout(config.attempt_timeout)
            .user_agent("paddock-webhooks/1")
            .build()
            .map_err(DelivererError::Client)?;
        let (config, metrics) = (Arc::new(config), Arc::default());
        Ok(Self { store, cipher, guard, client, config, metrics })
    }

    /// This deliverer's metrics (see `docs/webhooks.md`).
    pub fn metrics(&self) -> Arc<DeliveryMetrics> {
        self.metrics.clone()
    }

    /// Delivers until `shutdown` completes (a delivery in flight then is dropped; its claim
    /// expires and another worker sends it again).
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()> + Send) {
        tokio::pin!(shutdown);
        let mut last_expiry = Instant::now() - Duration::from_secs(3600);
        let mut last_backlog = last_expiry;
        loop {
            if last_backlog.elapsed() >= BACKLOG_EVERY {
                last_backlog = Instant::now();
                self.read_backlog().await;
            }
            if last_expiry.elapsed() >= Duration::from_secs(600) {
                last_expiry = Instant::now();
                if let Err(e) = self.expire().await {
                    tracing::warn!(error = &e as &dyn std::error::Error, "old webhook events could not be deleted");
                }
            }
            let busy = match self.tick().await {
                Ok(n) => n > 0,
                Err(e) => {
                    tracing::warn!(error = &e as &dyn std::error::Error, "webhook deliveries could not be claimed");
                    false
                }
            };
            if busy {
                tokio::select! {
                    () = &mut shutdown => return,
                    () = tokio::task::yield_now() => {}
                }
            } else {
                let idle = self.idle_wait().await;
                tokio::select! {
                    () = &mut shutdown => return,
                    () = self.new_event(idle) => {}
                }
            }
        }
    }

    /// How long to wait idle: until the next retry is due, at most the poll interval.
    async fn idle_wait(&self) -> Duration {
        let poll = self.config.poll_interval;
        let next = async {
            let mut conn = self.store.conn().await?;
            delivery::next_due(&mut conn).await
        };
        match next.await {
            Ok(Some(due)) => (due - chrono::Utc::now()).to_std().unwrap_or_default().min(poll),
            Ok(None) => poll,
            Err(e) => {
                tracing::debug!(error = &e as &dyn std::error::Error, "the next webhook retry could not be read");
                poll
            }
        }
    }

    /// Returns once an event not yet fanned out is found, looking every
    /// [`DeliveryConfig::event_poll`], or after `idle`. Events are found by looking, not announced:
    /// a notification sent by the transaction that writes an event would take PostgreSQL's notify
    /// lock at its commit and hold it through the commit's flush, so every commit that changes a
    /// subscribed resource would wait for the one before it (docs/webhooks.md).
    async fn new_event(&self, idle: Duration) {
        let until = Instant::now() + idle;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(self.config.event_poll.min(left)).await;
            let found = async {
                let mut conn = self.store.conn().await?;
                delivery::new_events(&mut conn).await
            };
            match found.await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(error = &e as &dyn std::error::Error, "new webhook events could not be looked for")
                }
            }
        }
    }

    /// Reads the backlog into the metrics (kept as it was when the database does not answer).
    pub async fn read_backlog(&self) {
        let read = async {
            let mut conn = self.store.conn().await?;
            delivery::backlog(&mut conn).await
        };
        match read.await {
            Ok(backlog) => self.metrics.backlog(&backlog),
            Err(e) => tracing::debug!(error = &e as &dyn std::error::Error, "the webhook backlog could not be read"),
        }
    }

    async fn expire(&self) -> Result<u64, StoreError> {
        let mut conn = self.store.conn().await?;
        delivery::expire(&mut conn).await
    }

    /// One round: fans new events out, claims what is due and delivers it. Returns the events
    /// fanned out plus the tries made (0: nothing to do).
    pub async fn tick(&self) -> Result<u64, StoreError> {
        let mut conn = self.store.conn().await?;
        let fanned = delivery::fan_out(&mut conn, 500).await?;
        let claimed =
            delivery::claim(&mut conn, &self.config.worker_id, self.config.lease, self.config.concurrency).await?;
        drop(conn);
        let tries = claimed.len() as u64;
        for result in join_all(claimed.iter().map(|c| self.deliver(c))).await {
            result?;
        }
        Ok(fanned + tries)
    }

    async fn deliver(&self, claimed: &Claimed) -> Result<Recorded, StoreError> {
        let tried = self.attempt(claimed).await;
        if let Some(error) = &tried.error {
            tracing::info!(delivery.id = %claimed.id, webhook.id = %claimed.subscription_id, status = tried.status,
                "webhook delivery failed: {error}");
        }
        let mut conn = self.store.conn().await?;
        let recorded = delivery::record(
            &mut conn,
            claimed.id,
            &self.config.worker_id,
            &tried,
            self.config.retry_base,
            self.config.retry_cap,
        )
        .await?;
        self.metrics.attempt(recorded, tried.latency);
        if recorded == Recorded::Disabled {
            tracing::warn!(webhook.id = %claimed.subscription_id, "webhook subscription disabled after its deliveries failed");
        }
        Ok(recorded)
    }

    /// One try; never an error: what went wrong is in [`Tried::error`].
    async fn attempt(&self, claimed: &Claimed) -> Tried {
        let started = Instant::now();
        let failed =
            |error: String| Tried { status: None, latency: started.elapsed(), error: Some(error), gone: false };
        if let Err(why) = self.literal_allowed(&claimed.url) {
            return failed(why);
        }
        let body = match serde_json::to_vec(&self.cloud_event(claimed)) {
            Ok(body) => body,
            Err(e) => return failed(format!("the event could not be encoded: {e}")),
        };
        let id = claimed.event_id.to_string();
        let timestamp = chrono::Utc::now().timestamp();
        let signature = match self.signature(claimed, &id, timestamp, &body) {
            Ok(signature) => signature,
            Err(why) => return failed(why),
        };
        let sent = self
            .client
            .post(&claimed.url)
            .header("content-type", "application/cloudevents+json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let mut answer = match sent {
            Ok(answer) => answer,
            Err(e) => return failed(describe(&e)),
        };
        let status = answer.status();
        // Read a little of the answer (so the connection can be reused), never all of it.
        let mut read = 0;
        while read < MAX_ANSWER {
            match answer.chunk().await {
                Ok(Some(chunk)) => read += chunk.len(),
                _ => break,
            }
        }
        let error = (!status.is_success()).then(|| format!("the receiver answered {status}"));
        Tried {
            status: Some(status.as_u16()),
            latency: started.elapsed(),
            error,
            gone: status == reqwest::StatusCode::GONE,
        }
    }

    /// A URL naming an address is connected to without a lookup: check it here.
    fn literal_allowed(&self, url: &str) -> Result<(), String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("the URL is not valid: {e}"))?;
        let ip = match parsed.host() {
            Some(url::Host::Ipv4(ip)) => std::net::IpAddr::V4(ip),
            Some(url::Host::Ipv6(ip)) => std::net::IpAddr::V6(ip),
            _ => return Ok(()),
        };
        if self.guard.allows(ip) {
            Ok(())
        } else {
            Err(format!("{ip} is not an address webhooks may go to"))
        }
    }

    fn cloud_event(&self, claimed: &Claimed) -> serde_json::Value {
        serde_json::json!({
            "specversion": "1.0",
            "id": claimed.event_id.to_string(),
            "source": self.config.source,
            "type": claimed.event_type,
            "subject": claimed.subject,
            "time": claimed.time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "datacontenttype": "application/json",
            "data": claimed.data,
        })
    }

    /// `v1,<sig>` with the current secret, and with the previous one while it still signs.
    fn signature(&self, claimed: &Claimed, id: &str, timestamp: i64, body: &[u8]) -> Result<String, String> {
        let binding = secret_binding(claimed.subscription_id);
        let mut signatures = Vec::new();
        for sealed in std::iter::once(&claimed.secret_enc).chain(claimed.previous_secret_enc.as_ref()) {
            let secret =
                self.cipher.open(sealed, binding).map_err(|e| format!("the secret could not be opened: {e}"))?;
            let secret = String::from_utf8(secret).map_err(|_| "the secret is not text".to_owned())?;
            signatures.push(sign(&secret, id, timestamp, body).ok_or("the secret is not a whsec_ secret")?);
        }
        Ok(signatures.join(" "))
    }
}

/// A failed request in a few words: its kind and the innermost cause (a refused address says so).
fn describe(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "the request failed"
    };
    let mut source: &dyn std::error::Error = e;
    while let Some(next) = source.source() {
        source = next;
    }
    format!("{kind}: {source}")
}
