//! Released sandboxes still being cleaned up, per owner: each counts
//! against its owner's `--max-sandboxes-per-key` until it is clean
//! (recycled, discarded or replaced), so an owner cannot leave more trash
//! behind than it may hold sandboxes. An Acquire that only they keep out
//! waits for one to be clean ([`OwnerCount::cleaned`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Per-owner counts, each unit held by a [`Counted`] until it drops.
#[derive(Default)]
pub struct OwnerCount {
    counts: Mutex<HashMap<String, usize>>,
    dropped: Notify,
}

impl OwnerCount {
    fn counts(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, who: &str) -> usize {
        self.counts().get(who).copied().unwrap_or(0)
    }

    /// One more for `who`, until the guard drops.
    pub fn count(self: &Arc<Self>, who: &str) -> Counted {
        *self.counts().entry(who.to_owned()).or_default() += 1;
        Counted {
            of: self.clone(),
            who: who.to_owned(),
        }
    }

    /// Resolves when any unit drops (enable it before looking at the
    /// counts, so none is missed).
    pub fn cleaned(&self) -> tokio::sync::futures::Notified<'_> {
        self.dropped.notified()
    }
}

/// One unit of an [`OwnerCount`].
pub struct Counted {
    of: Arc<OwnerCount>,
    who: String,
}

impl Drop for Counted {
    fn drop(&mut self) {
        {
            let mut counts = self.of.counts();
            if let Some(n) = counts.get_mut(&self.who) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&self.who);
                }
            }
        }
        self.of.dropped.notify_waiters();
    }
}
