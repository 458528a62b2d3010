//! The TTL reaper: releases sandboxes whose TTL passed, and marks those
//! whose agent died.

use std::time::Duration;

use tracing::{info, warn};

use super::Shared;
use super::common::{now_ms, timestamp};
use super::leases::release_in_background;
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
        for slot in h.pool.dead_leased() {
            if let Ok(rows) = h.store.list(None).await {
                for s in rows.iter().filter(|s| s.slot == slot) {
                    warn!(sandbox = %s.id, "its agent died; marked error");
                    let _ = h.store.set_status(&s.id, Status::Error, &timestamp()).await;
                }
            }
            let pool = h.pool.clone();
            let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&slot)).await;
        }
    }
}
