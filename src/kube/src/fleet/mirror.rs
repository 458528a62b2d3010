//! A watched copy of the claims, for the reaper.

use tracing::warn;

use super::{Fleet, LIST_PAGE};
use crate::crd::SandboxClaim;
use crate::lease::{self, Lease};

impl Fleet {
    /// A local copy of every claim hosts made, kept up to date by a watch
    /// (kube-runtime's reflector over a watcher: one list, then one
    /// long-lived watch, renewed every [`WATCH_SECONDS`]); what the reaper
    /// reads instead of listing every claim on every pass.
    pub fn mirror(&self) -> Mirror {
        use futures_util::StreamExt;
        use kube::runtime::{WatchStreamExt, reflector, watcher};
        let (reader, writer) = reflector::store();
        let cfg = watcher::Config::default()
            .labels(&format!("{}={}", lease::MANAGED_BY, lease::MANAGER))
            .page_size(LIST_PAGE)
            // Within the client's read timeout (`--kube-call-timeout`):
            // the server ends each watch first, and it is renewed from
            // where it stood.
            .timeout(WATCH_SECONDS);
        let stream = reflector(writer, watcher(self.claims.clone(), cfg)).default_backoff();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    warn!(error = %e, "the watch of the claims failed; it is started again");
                }
            }
        });
        Mirror { reader, task }
    }
}

/// How long one watch of the claims lasts before it is renewed (below
/// the host's `--kube-call-timeout` floor).
pub const WATCH_SECONDS: u32 = 25;

/// A watched copy of the claims ([`Fleet::mirror`]); the watch stops when
/// this is dropped.
pub struct Mirror {
    reader: kube::runtime::reflector::Store<SandboxClaim>,
    task: tokio::task::JoinHandle<()>,
}

impl Mirror {
    /// The leases the claims carry, acquiring ones included; `None` until
    /// the first list has been read.
    pub fn leases(&self) -> Option<Vec<Lease>> {
        use futures_util::FutureExt;
        self.reader.wait_until_ready().now_or_never()?.ok()?;
        let mut out: Vec<Lease> = self
            .reader
            .state()
            .iter()
            .filter_map(|c| match Lease::of_claim(c) {
                Ok(l) => l,
                Err(e) => {
                    warn!(error = %e, "skipping a claim");
                    None
                }
            })
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        Some(out)
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.task.abort();
    }
}
