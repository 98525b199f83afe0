//! The HTTP server loop under the API and metrics listeners: hyper's connection builder with a
//! header-read timeout (HTTP/1.1, all paddock speaks; `axum::serve` installs no timer, so a client sending its headers a byte
//! at a time held its connection for ever), each request told its client's address (the rate
//! limit's key without a token), and a graceful shutdown that lets requests in flight finish.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1::Builder;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Serves `app` on `listener` until `stop` completes, then waits for the connections' requests in
/// flight (the caller bounds that wait). A connection whose request headers are not complete
/// within `header_read_timeout` is closed.
pub async fn serve(listener: TcpListener, app: Router, header_read_timeout: Duration, stop: impl Future<Output = ()>) {
    let mut builder = Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(error = &e as &dyn std::error::Error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo::<SocketAddr>(addr));
            app.clone().oneshot(req.map(axum::body::Body::new))
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = &e as &dyn std::error::Error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
