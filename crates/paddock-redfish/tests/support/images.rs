//! A tiny HTTP server on 127.0.0.1 that the emulator downloads virtual media images from
//! (sushy-tools fetches the image on `InsertMedia`: 400 when it is missing, 500 when unreachable).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use paddock_redfish::Url;

/// A running image server; stops with the test's runtime.
pub struct ImageServer {
    base: Url,
    downloads: Arc<AtomicUsize>,
}

impl ImageServer {
    /// Serves `GET /images/{name}.iso` with 64 KiB of bytes for any name; anything else is 404.
    pub async fn start() -> ImageServer {
        let downloads = Arc::new(AtomicUsize::new(0));
        let app = Router::new()
            .route("/images/{name}", get(image))
            .route("/v1/agent/seed/{file}", get(seed))
            .with_state(downloads.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind image server");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ImageServer { base: Url::parse(&format!("http://{addr}/")).expect("url"), downloads }
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
        self.downloads.load(Ordering::SeqCst)
    }
}

async fn image(State(downloads): State<Arc<AtomicUsize>>, Path(name): Path<String>) -> Result<Vec<u8>, StatusCode> {
    if !name.ends_with(".iso") {
        return Err(StatusCode::NOT_FOUND);
    }
    downloads.fetch_add(1, Ordering::SeqCst);
    Ok(vec![0x42; 64 * 1024])
}

async fn seed(State(downloads): State<Arc<AtomicUsize>>, Path(file): Path<String>) -> Result<Vec<u8>, StatusCode> {
    // `{seed_token}.iso`: served like an image of that name.
    image(State(downloads), Path(file)).await
}
