//! `--max-slots`: how many slots the pool runs (idle, starting and
//! leased together), and the room reserved for one being started.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::Pool;

/// Room for one slot being started (see [`Pool::reserve`]).
pub(super) struct Reservation(Arc<AtomicUsize>);

impl Drop for Reservation {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pool {
    /// Slots idle, leased and being started.
    fn running(&self) -> usize {
        self.idle().len() + self.leased().len() + self.opening.load(Ordering::SeqCst)
    }

    /// Whether the pool runs `max_slots` slots (never, without it).
    pub(super) fn at_bound(&self) -> bool {
        self.cfg.max_slots.is_some_and(|max| self.running() >= max)
    }

    /// Whether a slot is starting (it goes idle, or away, when done).
    pub(super) fn starting_any(&self) -> bool {
        self.opening.load(Ordering::SeqCst) > 0 || !self.starting().is_empty()
    }

    /// Room for one more slot under `max_slots` (always, without it),
    /// held until the new slot is placed; `None` when the pool is at its
    /// bound.
    pub(super) fn reserve(&self) -> Option<Reservation> {
        let _room = self.room.lock().unwrap_or_else(|p| p.into_inner());
        if self.at_bound() {
            return None;
        }
        self.opening.fetch_add(1, Ordering::SeqCst);
        Some(Reservation(self.opening.clone()))
    }
}
