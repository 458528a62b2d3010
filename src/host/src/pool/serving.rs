//! Waiting for a new slot's agent to serve, within the backend's start
//! deadline, each probe within the short-call deadline.

use std::time::{Duration, Instant};

use super::slot::tail;
use super::{Pool, PoolError, Slot};

impl Pool {
    /// Waits until a new slot's agent reports SERVING; discards it when it
    /// dies or the backend's deadline passes.
    pub(super) async fn wait_serving(&self, slot: &Slot) -> Result<(), PoolError> {
        let kind = slot.kind;
        let deadline = Instant::now() + self.start_deadline();
        loop {
            let within = self
                .cfg
                .deadlines
                .call
                .min(deadline.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(100));
            let last = match slot.client(within).await {
                Ok(c) => match c.serving().await {
                    Ok(true) => break,
                    Ok(false) => "its agent answers NOT_SERVING".to_owned(),
                    Err(s) => format!("its health check failed: {}", s.message()),
                },
                Err(e) => sandbox_client::error_chain(&e),
            };
            let exited = !slot.alive();
            let why = if exited {
                Some(format!("its process exited; last probe: {last}"))
            } else if Instant::now() > deadline {
                Some(format!(
                    "not serving within {} s; last probe: {last}",
                    self.start_deadline().as_secs()
                ))
            } else {
                None
            };
            if let Some(why) = why {
                let log = slot
                    .dir()
                    .and_then(|d| std::fs::read_to_string(d.join("agent.log")).ok())
                    .unwrap_or_default();
                self.reclaim.discard_off_runtime(slot.clone()).await;
                return Err(PoolError::NotServing {
                    backend: kind.name(),
                    why,
                    log: tail(&log, 2000).to_owned(),
                    exited,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}
