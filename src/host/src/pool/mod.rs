//! Where sandboxes run, and the warm pool.
//!
//! A *slot* is one sandbox agent with its own directory under
//! `<data>/slots/<id>`. Two backends make slots:
//! - `process`: a local `sandbox-agent` process (workspace, unix sockets and
//!   log in the slot directory), by default PID 1 of its own namespaces
//!   with its tenants unprivileged (`isolate`);
//! - `qemu`: a VM booted from the image of `packaging/vm` by `run-qemu.sh`,
//!   whose agent is reached over hybrid vsock (`vsock.sock` in the slot
//!   directory; gRPC on port 1024, the MCP data plane on 1025).
//!
//! Either way the slot's main process runs in its own session, so it
//! outlives a host restart (`recover` takes it back). The pool keeps `size`
//! idle slots; each warm profile keeps `count` of them holding a *warm
//! lease*: the profile's servers already acquired, so an Acquire of any
//! subset of them (same benchmark) is answered by narrowing that lease,
//! without starting anything. A released slot goes back
//! to the pool (its Release cleared the workspace and stopped its servers)
//! or is stopped when the pool is full. Slots that die are dropped and
//! replaced.
//!
//! - `backend`: how a slot's agent is started (process, isolated or not, or QEMU VM).
//! - `isolate`: the process backend's namespaces, ids, cgroups and network.
//! - `slot`: one running sandbox and how it is stopped.
//! - `warm`: warm profiles and the task that keeps idle slots warm.

mod agent_env;
mod backend;
mod bound;
mod discovery;
mod error;
pub mod isolate;
mod reclaim;
mod recover;
mod serving;
mod slot;
mod start;
mod warm;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandbox_client::proto;
use tokio::sync::Notify;
use tracing::info;

pub use agent_env::{API_KEY_ENV, AgentEnv, manifest_pass_env};
pub use backend::{Backend, Kind, probe_accel, slots_dir};
use backend::{VM_AGENT_PORT, VM_MCP_PORT};
pub use discovery::{CatalogMode, Discovery};
pub use error::PoolError;
use reclaim::Reclaim;
#[cfg(feature = "kubernetes")]
pub use slot::Remote;
pub use slot::{Deadlines, Slot};
pub use warm::{ServerStart, Want, WarmLease, WarmProfile};

/// What [`Pool::take`] hands out.
pub struct Taken {
    pub slot: Slot,
    /// The warm lease the slot holds, if any. With `covers`, narrowing it
    /// answers the Acquire; otherwise the caller ends it first.
    pub warm: Option<WarmLease>,
    pub covers: bool,
    /// Why no covering warm lease was found (`None` on a hit).
    pub miss: Option<Miss>,
}

/// Why an Acquire was not answered from a warm lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// No profile warms what was asked for.
    Uncovered,
    /// A profile does, but none of its slots was ready.
    Empty,
    /// The agent refused to narrow the lease (a server not ready, ...).
    Refused,
}

impl Miss {
    pub fn name(self) -> &'static str {
        match self {
            Miss::Uncovered => "uncovered",
            Miss::Empty => "empty",
            Miss::Refused => "refused",
        }
    }
}

struct Idle {
    slot: Slot,
    warm: Option<WarmLease>,
    /// A warm lease of this profile is being acquired on it: not for
    /// [`Pool::take`] yet.
    warming: Option<usize>,
}

impl Idle {
    fn bare(slot: Slot) -> Idle {
        Idle {
            slot,
            warm: None,
            warming: None,
        }
    }
}

/// How many slots are in each state, for metrics.
#[derive(Debug, Clone, Default)]
pub struct PoolCounts {
    /// Per profile (in the pool's order): warm leases ready, and warming.
    pub warm: Vec<(usize, usize)>,
    pub bare: usize,
    pub starting: usize,
    pub leased: usize,
}

pub struct PoolConfig {
    pub backend: Backend,
    pub dir: PathBuf,
    pub size: usize,
    /// Warm profiles, their counts within `size`.
    pub warm: Vec<WarmProfile>,
    /// What a released sandbox becomes.
    pub on_release: OnRelease,
    /// A released slot whose own file system holds more entries is
    /// discarded whole rather than emptied and recycled.
    pub recycle_max_inodes: u64,
    /// How the process backend confines its slots (`None`: it does not,
    /// `--isolation none`).
    pub isolation: Option<Arc<isolate::Isolation>>,
    /// How long a new slot may take to serve (`--slot-start-timeout`;
    /// `None`: the backend's default, see [`Backend::start_deadline`]).
    pub start_timeout: Option<Duration>,
    /// The only environment the slots' main processes get.
    pub agent_env: AgentEnv,
    /// At most this many slots at once, idle, starting and leased
    /// (`--max-slots`; `None`: no bound but `size` and the leases).
    pub max_slots: Option<usize>,
    /// How long calls to the agents may take, per class.
    pub deadlines: Deadlines,
    /// Discovery catalogs for every agent (`None`: `--catalogs off`).
    pub discovery: Option<Arc<Discovery>>,
}

/// What happens to a sandbox once its tenant released it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnRelease {
    /// The agent's Release (servers stopped, workspace and state paths
    /// cleared) and back to the pool: fast.
    Recycle,
    /// Stopped (the whole VM or agent) and a fresh one started in its
    /// place: nothing a tenant left outside the cleared paths (say in /tmp,
    /// through the terminal server) can reach the next tenant.
    Replace,
}

pub struct Pool {
    cfg: PoolConfig,
    idle: Mutex<Vec<Idle>>,
    leased: Mutex<HashMap<String, Slot>>,
    /// Slots still starting (stopped with the idle ones at shutdown).
    starting: Mutex<HashMap<String, Slot>>,
    /// Slots being started and not yet placed (idle or leased): counted
    /// against `max_slots` from before the start until the placement.
    opening: Arc<std::sync::atomic::AtomicUsize>,
    /// Serializes the `max_slots` checks.
    room: Mutex<()>,
    /// Set by [`Pool::close`] while it holds both `idle` and `starting`;
    /// read under the lock of the list a slot is about to join, so no slot
    /// joins one after close emptied it.
    closed: AtomicBool,
    /// The server names this backend's agents carry, learned from the
    /// first slot that serves (every slot runs the same manifest or image).
    catalog: Mutex<Option<Vec<String>>>,
    refill: Notify,
    /// Slot directories to remove again, and the orphans' bookkeeping.
    reclaim: Arc<Reclaim>,
    /// Woken when a slot stops warming (ready, failed, gone) or comes idle.
    warmed: Notify,
}

impl Pool {
    pub fn new(cfg: PoolConfig) -> Result<Arc<Pool>, PoolError> {
        std::fs::create_dir_all(&cfg.dir)
            .map_err(PoolError::io(format!("creating {}", cfg.dir.display())))?;
        Ok(Arc::new(Pool {
            cfg,
            idle: Mutex::new(Vec::new()),
            leased: Mutex::new(HashMap::new()),
            starting: Mutex::new(HashMap::new()),
            opening: Default::default(),
            room: Mutex::new(()),
            closed: AtomicBool::new(false),
            catalog: Mutex::new(None),
            refill: Notify::new(),
            reclaim: Default::default(),
            warmed: Notify::new(),
        }))
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn leased(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.leased.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Keeps a slot idle, unless the pool is full or closed: then the slot
    /// comes back, for the caller to discard.
    fn put_idle(&self, i: Idle) -> Result<(), Slot> {
        let mut idle = self.idle();
        if self.is_closed() || idle.len() >= self.cfg.size {
            return Err(i.slot);
        }
        idle.push(i);
        drop(idle);
        // A taker may be waiting for a slot at the --max-slots bound.
        self.warmed.notify_waiters();
        Ok(())
    }

    /// How long calls to the agents may take, per class.
    pub fn deadlines(&self) -> Deadlines {
        self.cfg.deadlines
    }

    pub fn profiles(&self) -> &[WarmProfile] {
        &self.cfg.warm
    }

    /// Slots per state, at this moment.
    pub fn counts(&self) -> PoolCounts {
        let mut c = PoolCounts {
            warm: vec![(0, 0); self.cfg.warm.len()],
            ..Default::default()
        };
        for i in self.idle().iter() {
            match (&i.warm, i.warming) {
                (Some(w), _) => c.warm[w.profile].0 += 1,
                (None, Some(k)) => c.warm[k].1 += 1,
                (None, None) => c.bare += 1,
            }
        }
        c.starting = self.starting().len();
        c.leased = self.leased().len();
        c
    }

    /// Drops idle slots whose agent died (their directories are removed in
    /// the background, off the runtime).
    fn sweep(&self) {
        let mut gone = Vec::new();
        self.idle().retain(|i| {
            let ok = i.slot.alive();
            if !ok {
                gone.push(i.slot.clone());
            }
            ok
        });
        if !gone.is_empty() {
            for slot in gone {
                let r = self.reclaim.clone();
                tokio::spawn(async move { r.discard_off_runtime(slot).await });
            }
            // A taker may be waiting for one of them to finish warming.
            self.warmed.notify_waiters();
        }
    }

    /// The asked names that the backend's agents do not carry, with the
    /// names they do; `None` while no slot has served yet (the agent then
    /// decides). Lets an Acquire of a missing server fail before it takes
    /// a slot, ends a warm lease, or boots a VM.
    pub fn missing_servers(&self, asked: &[String]) -> Option<(Vec<String>, Vec<String>)> {
        let catalog = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
        let known = catalog.as_ref()?;
        let missing: Vec<String> = asked
            .iter()
            .filter(|n| !known.contains(n))
            .cloned()
            .collect();
        (!missing.is_empty()).then(|| (missing, known.clone()))
    }

    /// The servers this host's sandboxes carry, once a slot has served.
    pub fn servers(&self) -> Option<Vec<String>> {
        self.catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the server names of a slot that serves, once.
    pub async fn learn_catalog(&self, slot: &Slot) {
        if self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return;
        }
        let listed = match slot.client(self.cfg.deadlines.call).await {
            Ok(c) => c.servers().list(proto::ListServersRequest {}).await,
            Err(_) => return,
        };
        if let Ok(r) = listed {
            let names: Vec<String> = r.into_inner().servers.into_iter().map(|s| s.name).collect();
            info!(servers = %names.join(","), "the sandboxes carry these servers");
            *self.catalog.lock().unwrap_or_else(|p| p.into_inner()) = Some(names);
        }
    }

    /// A slot for an Acquire of `want`: the idle one whose warm lease
    /// covers it with the fewest servers to spare (`covers`), else a bare
    /// idle one, else one with a warm lease that does not cover it (for
    /// the caller to end), else a new one. While every idle slot is still
    /// warming, it waits for one: that takes at most the warm servers'
    /// start, a new slot its whole start (a VM boot) and then the Acquire.
    pub async fn take(self: &Arc<Self>, want: &Want) -> Result<Taken, PoolError> {
        self.sweep();
        let picked = loop {
            let warmed = self.warmed.notified();
            tokio::pin!(warmed);
            warmed.as_mut().enable();
            let (picked, warming) = self.pick(want);
            // At the --max-slots bound, a slot still starting will be idle
            // soon: wait for it rather than refuse.
            let coming = warming || (self.at_bound() && self.starting_any());
            if picked.is_some() || !coming || self.is_closed() {
                break picked;
            }
            let wait = self.start_deadline();
            if tokio::time::timeout(wait, warmed).await.is_err() {
                break None;
            }
        };
        self.refill.notify_one();
        let miss = |covers: bool| {
            (!covers).then(|| {
                if self.cfg.warm.iter().any(|p| p.could_cover(want)) {
                    Miss::Empty
                } else {
                    Miss::Uncovered
                }
            })
        };
        let taken = match picked {
            Some((i, covers)) => Taken {
                slot: i.slot,
                warm: i.warm,
                covers,
                miss: miss(covers),
            },
            None => {
                let room = self
                    .reserve()
                    .ok_or(PoolError::Full(self.cfg.max_slots.unwrap_or(0)))?;
                let slot = self.spawn().await?;
                self.leased().insert(slot.id.clone(), slot.clone());
                drop(room);
                return Ok(Taken {
                    slot,
                    warm: None,
                    covers: false,
                    miss: miss(false),
                });
            }
        };
        Ok(taken)
    }

    /// Moves the best idle slot for `want` (see [`Pool::take`]) to the
    /// leased ones, and says whether the slot covers it; also whether any
    /// idle slot is warming. The move happens under the idle list's lock,
    /// so the slot counts against `--max-slots` at every moment: between
    /// the two lists the refill would see room for one more slot.
    fn pick(&self, want: &Want) -> (Option<(Idle, bool)>, bool) {
        {
            let mut idle = self.idle();
            let ready = |i: &Idle| i.warming.is_none();
            let covering = idle
                .iter()
                .enumerate()
                .filter(|(_, i)| ready(i))
                .filter_map(|(k, i)| {
                    let w = i.warm.as_ref()?;
                    w.covers(&self.cfg.warm[w.profile], want)
                        .then_some((k, w.servers.len()))
                })
                .min_by_key(|&(_, n)| n)
                .map(|(k, _)| k);
            let pos = covering
                .or_else(|| idle.iter().position(|i| ready(i) && i.warm.is_none()))
                .or_else(|| idle.iter().position(ready));
            let warming = idle.iter().any(|i| i.warming.is_some());
            let picked = pos.map(|p| idle.remove(p));
            if let Some(i) = &picked {
                self.leased().insert(i.slot.id.clone(), i.slot.clone());
            }
            (picked.map(|i| (i, covering.is_some())), warming)
        }
    }

    pub fn leased_slot(&self, id: &str) -> Option<Slot> {
        self.leased().get(id).cloned()
    }

    /// Every leased slot, at this moment.
    pub fn leased_slots(&self) -> Vec<Slot> {
        self.leased().values().cloned().collect()
    }

    /// A released slot: back to the pool, or stopped when it is full.
    /// Blocking (it may wait for a process to stop).
    pub fn give_back(&self, slot_id: &str) {
        let Some(slot) = self.leased().remove(slot_id) else {
            return;
        };
        let kept = if slot.alive() {
            self.put_idle(Idle::bare(slot))
        } else {
            Err(slot)
        };
        match kept {
            Ok(()) => self.refill.notify_one(),
            Err(slot) => self.reclaim.discard(&slot),
        }
    }

    /// A slot that cannot be trusted any more (died, failed to release).
    /// Blocking.
    pub fn drop_slot(&self, slot_id: &str) {
        // Out of the list first: stopping it may block, with no lock held.
        let gone = self.leased().remove(slot_id);
        if let Some(slot) = gone {
            self.reclaim.discard(&slot);
        }
        self.refill.notify_one();
    }

    /// The process backend's isolation, if its slots are isolated.
    pub fn isolation(&self) -> Option<&Arc<isolate::Isolation>> {
        self.cfg.isolation.as_ref()
    }

    /// Leased slots whose agent is gone.
    pub fn dead_leased(&self) -> Vec<String> {
        self.leased()
            .values()
            .filter(|s| s.dead())
            .map(|s| s.id.clone())
            .collect()
    }

    fn start_deadline(&self) -> Duration {
        self.cfg
            .start_timeout
            .unwrap_or_else(|| self.cfg.backend.start_deadline())
    }

    fn starting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.starting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the pool: from now on nothing is started or kept idle, and
    /// every idle or starting slot is stopped, all at once. Leased slots
    /// keep running for the next start. Returns how many were stopped.
    /// Blocking (each stop may take its grace).
    pub fn close(&self) -> usize {
        let slots: Vec<Slot> = {
            let mut idle = self.idle();
            let mut starting = self.starting();
            self.closed.store(true, Ordering::SeqCst);
            idle.drain(..)
                .map(|i| i.slot)
                .chain(starting.drain().map(|(_, s)| s))
                .collect()
        };
        self.warmed.notify_waiters();
        std::thread::scope(|scope| {
            for slot in &slots {
                scope.spawn(move || self.reclaim.discard(slot));
            }
        });
        slots.len()
    }
}
