//! Release for a sandbox the host discards right after (its file system
//! dropped whole: a slot's own tmpfs unmounted). What the lease started
//! ends as at any Release (executions, servers, mail, every process of the
//! tenant, what it loaded into shared outside accounts), but nothing it
//! left in files is deleted one by one: a tenant that made 1.5 M entries
//! costs its host an unmount, not minutes of unlinking while it holds a
//! slot. The lease stays, marked broken, so nothing leases the sandbox
//! again.

use std::time::Instant;

use tracing::{Instrument, info, warn};

use super::{LcError, Lifecycle};

impl Lifecycle {
    /// Ends lease `lease_id` (empty: the current one) for a discard.
    /// Returns the message to show.
    pub async fn release_for_discard(
        &self,
        lease_id: &str,
        is_ttl: bool,
    ) -> Result<String, LcError> {
        let _op = self.op.lock().await;
        let cur = self
            .current()
            .as_ref()
            .map(|c| (c.lease.id.clone(), c.outside.clone()));
        let Some((cur_id, outside)) = cur else {
            return Ok("the sandbox is idle; nothing to end before its discard".into());
        };
        if !lease_id.is_empty() && lease_id != cur_id {
            return Err(LcError::NoSuchLease {
                asked: lease_id.to_owned(),
                current: Some(cur_id),
            });
        }
        let span = tracing::info_span!("release", lease = %cur_id, is_ttl, discard = true);
        let started = Instant::now();
        let undeleted = async {
            if let Some(op) = self.ws.cancel_transfers() {
                info!(op, "stopping a workspace transfer for the discard");
            }
            let mut failed = self.exec.close().await.failed;
            self.sup.stop_all().await;
            self.stop_mail().await;
            let tenant = self.sup.tenant().clone();
            match tokio::task::spawn_blocking(move || tenant.kill_all()).await {
                Ok(Ok(_)) => {}
                Ok(Err(killed)) => failed.push(format!(
                    "tenant processes were still appearing after every kill round ({killed} killed)"
                )),
                Err(e) => failed.push(format!("the task ending tenant processes failed: {e}")),
            }
            for f in &failed {
                warn!(error = %f, "ending the lease before its discard");
            }
            self.clean_outside(&outside).await
        }
        .instrument(span.clone())
        .await;
        if let Some(c) = self.current().as_mut() {
            c.broken = Some("the lease ended for the sandbox's discard".into());
            c.ttl.cancel();
        }
        let ms = started.elapsed().as_millis() as u64;
        span.in_scope(|| info!(ms, "lease ended; the sandbox is discarded"));
        let mut msg = format!("lease {cur_id} ended; the sandbox is discarded with its files");
        if !undeleted.is_empty() {
            msg.push_str(&format!(
                "; could not delete what the lease loaded into the shared account of {}",
                undeleted.join("; ")
            ));
        }
        Ok(msg)
    }
}
