//! Serving HTTP (1.1 or h2, told apart by the first bytes) on a
//! [`Listener`], with its connection cap, and every request head (the
//! opening bytes too) due within a timeout: the one server loop of the
//! agent's MCP data plane and of sandbox-host's API.

use std::future::Future;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio_stream::StreamExt;
use tracing::{Instrument, debug, warn};

use crate::listen::Listener;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bounds of an HTTP listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// The opening bytes, each request head once begun, and the wait for
    /// the next request of an idle connection: closed when exceeded.
    pub header_timeout: Duration,
    /// At shutdown, how long connections may finish their requests.
    pub drain: Duration,
}

/// Serves `svc` on `listener` until `shutdown` resolves; then stops
/// accepting and closes each connection after its request in flight
/// (waiting at most `limits.drain`).
pub async fn serve_http<S, B>(
    listener: Listener,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
    svc: S,
) where
    S: hyper::service::Service<hyper::Request<Incoming>, Response = hyper::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let endpoint = listener.local_endpoint().clone();
    let (mut incoming, accept_task) =
        listener.incoming_within(limits.max_connections, Some(limits.header_timeout));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let conn = tokio::select! {
            c = incoming.next() => match c {
                Some(Ok(c)) => c,
                Some(Err(e)) => {
                    warn!(%endpoint, error = %e, "accept failed");
                    continue;
                }
                None => break,
            },
            _ = &mut shutdown => break,
        };
        let svc = svc.clone();
        let stop = stop.clone();
        conns.spawn(
            async move {
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_timeout);
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(conn), svc);
                tokio::pin!(conn);
                let r = tokio::select! {
                    r = conn.as_mut() => r,
                    _ = stop.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(e) = r {
                    debug!(error = %e, "connection ended with an error");
                }
            }
            .in_current_span(),
        );
        while conns.try_join_next().is_some() {}
    }
    drop(incoming);
    stop.cancel();
    let _ = tokio::time::timeout(limits.drain, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), accept_task).await;
}
