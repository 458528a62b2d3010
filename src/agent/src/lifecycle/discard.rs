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
    /// A Release that becomes a discard when, once the lease's processes
    /// are ended (so none can add more), the workspace's file system holds
    /// more than `over` entries (`0`: never). Returns the message and
    /// whether it became one.
    pub async fn release_or_discard(
        &self,
        lease_id: &str,
        is_ttl: bool,
        over: u64,
    ) -> Result<(String, bool), LcError> {
        if over > 0
            && self
                .entries_once_ended(lease_id)
                .await?
                .is_some_and(|n| n > over)
        {
            let m = self.release_for_discard(lease_id, is_ttl).await?;
            return Ok((m, true));
        }
        Ok((self.release(lease_id, is_ttl).await?, false))
    }

    /// Ends what lease `lease_id` runs (executions, servers, mail, the
    /// tenant's processes), as its Release would first, and counts the
    /// entries of the workspace's file system then (`None`: unknown, or no
    /// lease: the Release decides).
    async fn entries_once_ended(&self, lease_id: &str) -> Result<Option<u64>, LcError> {
        let _op = self.op.lock().await;
        let cur = self.current().as_ref().map(|c| c.lease.id.clone());
        let Some(cur_id) = cur else { return Ok(None) };
        if !lease_id.is_empty() && lease_id != cur_id {
            return Err(LcError::NoSuchLease {
                asked: lease_id.to_owned(),
                current: Some(cur_id),
            });
        }
        self.end_processes().await;
        let root = self.ws.path().to_owned();
        let counted = tokio::task::spawn_blocking(move || {
            let s = nix::sys::statvfs::statvfs(&root).ok()?;
            Some((s.files() as u64).saturating_sub(s.files_free() as u64))
        })
        .await;
        Ok(counted.ok().flatten())
    }

    /// Ends the lease's executions, servers, mail and every tenant process;
    /// returns what failed (logged).
    async fn end_processes(&self) -> Vec<String> {
        if let Some(op) = self.ws.cancel_transfers() {
            info!(op, "stopping a workspace transfer for the release");
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
            warn!(error = %f, "ending the lease's processes");
        }
        failed
    }

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
            self.end_processes().await;
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
