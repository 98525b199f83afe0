//! A tiny HTTP server on 127.0.0.1 that the emulator downloads virtual media images from
//! (sushy-tools fetches the image on `InsertMedia`: 400 when it is missing, 500 when unreachable).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use paddock_redfish::Url;

/// A running image server; stops with the test's runtime.
pub struct ImageServer {
    base: Url,
    served: Arc<Served>,
}

/// What the server counts, and how slowly it answers for images.
#[derive(Default)]
struct Served {
    downloads: AtomicUsize,
    by_name: Mutex<HashMap<String, usize>>,
    image_delay: Mutex<Duration>,
}

impl ImageServer {
    /// Serves `GET /images/{name}.iso` with 64 KiB of bytes for any name; anything else is 404.
    pub async fn start() -> ImageServer {
        let served = Arc::new(Served::default());
        let app = Router::new()
            .route("/images/{name}", get(image))
            .route("/v1/agent/seed/{file}", get(seed))
            .with_state(served.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind image server");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ImageServer { base: Url::parse(&format!("http://{addr}/")).expect("url"), served }
    }

    /// The URL of image `name` (served when it ends with `.iso`).
    pub fn url(&self, name: &str) -> Url {
        self.base.join(&format!("images/{name}")).expect("image url")
    }

    /// A seed URL in the shape paddock hands out, `/v1/agent/seed/{seed_token}.iso` (served for
    /// any token).
    pub fn seed_url(&self, token: &str) -> Url {
        self.base.join(&format!("v1/agent/seed/{token}.iso")).expect("seed url")
    }

    /// How many images were downloaded.
    pub fn downloads(&self) -> usize {
        self.served.downloads.load(Ordering::SeqCst)
    }

    /// How many times image `name` was asked for (counted when asked, before any delay).
    pub fn downloads_of(&self, name: &str) -> usize {
        self.served.by_name.lock().expect("counts").get(name).copied().unwrap_or_default()
    }

    /// Answers for `/images/` only after `delay` from now on: a node OS image of a gigabyte
    /// behind a busy link, as the BMC that fetches it inside its insert request sees it.
    pub fn delay_images(&self, delay: Duration) {
        *self.served.image_delay.lock().expect("delay") = delay;
    }
}

async fn image(State(served): State<Arc<Served>>, Path(name): Path<String>) -> Result<Vec<u8>, StatusCode> {
    let delay = *served.image_delay.lock().expect("delay");
    let bytes = count(&served, &name)?;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    Ok(bytes)
}

async fn seed(State(served): State<Arc<Served>>, Path(file): Path<String>) -> Result<Vec<u8>, StatusCode> {
    // `{seed_token}.iso`: served like an image of that name, without the images' delay.
    count(&served, &file)
}

/// Counts a download of `name` and gives its bytes, for any name ending in `.iso`.
fn count(served: &Served, name: &str) -> Result<Vec<u8>, StatusCode> {
    if !name.ends_with(".iso") {
        return Err(StatusCode::NOT_FOUND);
    }
    served.downloads.fetch_add(1, Ordering::SeqCst);
    *served.by_name.lock().expect("counts").entry(name.to_owned()).or_default() += 1;
    Ok(vec![0x42; 64 * 1024])
}
