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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::pool::{AgentEnv, Backend, Idle, Kind, OnRelease, Pool, PoolConfig, Slot, Want};

    /// A pool of one slot at most, holding one idle slot (this process
    /// stands in for its agent: alive, never started or stopped here).
    fn pool_of_one(dir: &std::path::Path) -> Arc<Pool> {
        let pool = Pool::new(PoolConfig {
            backend: Backend::Process {
                agent_bin: "/nonexistent/sandbox-agent".into(),
                manifest: None,
            },
            dir: dir.to_path_buf(),
            size: 1,
            warm: vec![],
            on_release: OnRelease::Recycle,
            recycle_max_inodes: 20_000,
            isolation: None,
            start_timeout: None,
            agent_env: AgentEnv::default(),
            max_slots: Some(1),
            deadlines: Default::default(),
            discovery: None,
        })
        .expect("pool");
        let slot = Slot::local(
            "only".into(),
            Kind::Process,
            dir.join("only"),
            std::process::id(),
        );
        pool.put_idle(Idle::bare(slot))
            .map_err(|_| ())
            .expect("idle");
        pool
    }

    /// The slot an Acquire takes from the idle list counts against
    /// `--max-slots` from the moment it leaves the list: the refill (on
    /// another thread) never finds room for a second slot meanwhile. It
    /// once did, between the idle list and the leased one, and a host of
    /// `--max-slots 1` ran two agents.
    #[test]
    fn a_slot_being_taken_keeps_the_pool_at_its_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = pool_of_one(dir.path());
        assert!(pool.at_bound());
        let want = Want {
            servers: Some(vec!["terminal".into()]),
            benchmark: None,
        };
        let (picked, _) = pool.pick(&want);
        let picked = picked.expect("the idle slot is picked");
        assert_eq!(picked.0.slot.id, "only");
        assert!(pool.reserve().is_none(), "room for a second slot");
        assert!(pool.leased_slot("only").is_some());
    }
}
