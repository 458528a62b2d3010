//! The HTTP server of the REST API and the MCP URLs, with bounded
//! connections: at most `max_connections` at once (the next waits in the
//! kernel's backlog), each closed unless it sends its opening bytes and
//! then every request head within `header_timeout`. Silent or trickling
//! clients, which need no key to connect, so cannot hold every slot nor
//! every file descriptor of the host.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use sandbox_client::transport::Listener;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Connection limits (`--max-connections`, `--header-timeout-ms`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves; then stops
/// accepting, lets each connection finish its request in flight, and
/// returns once they are closed.
pub async fn serve(
    listener: Listener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let endpoint = listener.local_endpoint().clone();
    let (mut incoming, accept_task) =
        listener.incoming_within(limits.max_connections, Some(limits.header_timeout));
    let stop = CancellationToken::new();
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
        let svc = TowerToHyperService::new(app.clone());
        let stop = stop.clone();
        conns.spawn(async move {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(conn), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r {
                    debug!(error = %e, "connection ended with an error");
                },
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    if let Err(e) = conn.await {
                        debug!(error = %e, "connection ended with an error");
                    }
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
    drop(incoming);
    stop.cancel();
    while conns.join_next().await.is_some() {}
    let _ = tokio::time::timeout(Duration::from_secs(1), accept_task).await;
}
