//! The TTL reaper: releases sandboxes whose TTL passed, and marks those
//! whose agent died; the prober marks those whose agent went mute.

use std::collections::HashMap;
use std::time::Duration;

use tracing::{info, warn};

use super::{Shared, now_ms, release_in_background, timestamp};
use crate::store::Status;

/// The TTL reaper: releases sandboxes whose TTL passed.
pub async fn reap(h: Shared) {
    let tick = Duration::from_secs_f64((h.time_scale).clamp(0.05, 1.0));
    loop {
        tokio::time::sleep(tick).await;
        match h.store.expired(now_ms()).await {
            Ok(rows) => {
                for s in rows {
                    info!(sandbox = %s.id, "TTL expired");
                    release_in_background(&h, &s, true).await;
                }
            }
            Err(e) => warn!(error = %e, "TTL reaper"),
        }
        for slot in h.fleet.dead_leased() {
            end_slot(&h, slot, "its agent died; marked error").await;
        }
    }
}

/// Marks the sandboxes of `slot` error and replaces it.
async fn end_slot(h: &Shared, slot: String, why: &str) {
    if let Ok(rows) = h.store.list(None).await {
        for s in rows.iter().filter(|s| s.slot == slot) {
            warn!(sandbox = %s.id, "{why}");
            let _ = h.store.set_status(&s.id, Status::Error, &timestamp()).await;
        }
    }
    h.fleet.discard(slot).await;
}

/// Every `--agent-call-timeout`, asks each leased slot's agent whether it
/// serves, all at once, each bounded by that timeout. An agent that fails
/// two probes in a row (it takes the connection and never answers: a hung
/// VM, a stopped process) has its sandboxes marked `error` and its slot
/// replaced, instead of every later call waiting on it.
pub async fn probe(h: Shared) {
    let every = h.fleet.deadlines().call;
    let mut failed: HashMap<String, u32> = HashMap::new();
    loop {
        tokio::time::sleep(every).await;
        let slots = h.fleet.leased_slots();
        let answers = futures_util::future::join_all(slots.iter().map(|slot| async move {
            let ok = match slot.client(every).await {
                Ok(c) => c.serving().await.is_ok_and(|s| s),
                Err(_) => false,
            };
            (slot.id.clone(), ok)
        }))
        .await;
        let mut now = HashMap::new();
        for (id, ok) in answers {
            if ok {
                continue;
            }
            let n = failed.get(&id).copied().unwrap_or(0) + 1;
            if n >= 2 && h.fleet.is_leased(&id) {
                end_slot(&h, id, "its agent does not answer; marked error").await;
            } else {
                now.insert(id, n);
            }
        }
        failed = now;
    }
}
