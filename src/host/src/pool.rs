//! Where sandboxes run, and the warm pool.
//!
//! A *slot* is one sandbox agent with its own directory under
//! `<data>/slots/<id>`. Two backends make slots:
//! - `process`: a local `sandbox-agent` process (workspace, unix sockets and
//!   log in the slot directory);
//! - `qemu`: a VM booted from the image of `packaging/vm` by `run-qemu.sh`,
//!   whose agent is reached over hybrid vsock (`vsock.sock` in the slot
//!   directory; gRPC on port 1024, the MCP data plane on 1025).
//!
//! Either way the slot's main process runs in its own session, so it
//! outlives a host restart (`recover` takes it back). The pool keeps `size`
//! idle slots; with a warm profile, idle slots also hold a *warm lease*: the
//! profile's servers already acquired, so an Acquire that asks for exactly
//! those is answered without starting anything. A released slot goes back
//! to the pool (its Release cleared the workspace and stopped its servers)
//! or is stopped when the pool is full. Slots that die are dropped and
//! replaced.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use sandbox_client::proto;
use sandbox_client::transport::Endpoint;
use tokio::sync::Notify;
use tracing::{info, warn};

/// The state root of the shipped manifest (`packaging/servers.toml`).
const STATE_ROOT: &str = "/var/lib/sandbox-agent";
/// The VM image's agent ports (`packaging/vm/build-initramfs.sh`).
const VM_AGENT_PORT: u32 = 1024;
const VM_MCP_PORT: u32 = 1025;

/// How slots are made.
#[derive(Debug, Clone)]
pub enum Backend {
    Process {
        agent_bin: PathBuf,
        manifest: Option<PathBuf>,
    },
    Qemu {
        /// `packaging/vm/run-qemu.sh`.
        run_script: PathBuf,
        /// An initramfs from `build-initramfs.sh` (its kernel beside it).
        image: PathBuf,
        memory_mib: u32,
        /// `kvm` or `tcg`, decided once (see [`probe_accel`]).
        accel: String,
    },
}

impl Backend {
    fn kind(&self) -> Kind {
        match self {
            Backend::Process { .. } => Kind::Process,
            Backend::Qemu { .. } => Kind::Qemu,
        }
    }
    /// How long a new slot may take to serve.
    fn start_deadline(&self) -> Duration {
        match self {
            Backend::Process { .. } => Duration::from_secs(20),
            // A VM under TCG boots in seconds, but slowly on a busy machine.
            Backend::Qemu { .. } => Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Process,
    Qemu,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Process => "process",
            Kind::Qemu => "qemu",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Slot {
    pub id: String,
    pub dir: PathBuf,
    /// The slot's main process: the agent, or run-qemu.sh. It leads its
    /// own process group.
    pub pid: u32,
    pub kind: Kind,
}

impl Slot {
    pub fn agent_uri(&self) -> String {
        match self.kind {
            Kind::Process => format!("unix://{}", self.dir.join("agent.sock").display()),
            Kind::Qemu => format!(
                "hvsock://{}:{VM_AGENT_PORT}",
                self.dir.join("vsock.sock").display()
            ),
        }
    }
    /// The agent's MCP data plane.
    pub fn mcp_endpoint(&self) -> Endpoint {
        match self.kind {
            Kind::Process => Endpoint::Unix(self.dir.join("mcp.sock")),
            Kind::Qemu => Endpoint::HybridVsock {
                path: self.dir.join("vsock.sock"),
                port: VM_MCP_PORT,
            },
        }
    }
    pub async fn client(&self) -> anyhow::Result<sandbox_client::Client> {
        sandbox_client::connect(&self.agent_uri())
            .await
            .with_context(|| format!("agent of slot {}", self.id))
    }
    /// Alive, and still our process (not a reused pid).
    pub fn alive(&self) -> bool {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
        if matches!(state, Some('Z') | Some('X') | None) {
            return false;
        }
        std::fs::read(format!("/proc/{}/cmdline", self.pid))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*self.dir.to_string_lossy()))
    }
}

/// The servers idle slots are pre-acquired with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmProfile {
    All,
    Servers(Vec<String>),
}

impl WarmProfile {
    /// Parses `--warm-servers`: `ALL` or a comma-separated list.
    pub fn parse(s: &str) -> Option<WarmProfile> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        if s == "ALL" {
            return Some(WarmProfile::All);
        }
        let mut names: Vec<String> = s
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        names.dedup();
        Some(WarmProfile::Servers(names))
    }

    /// Does an Acquire of `servers` (None: ALL) without benchmark, email or
    /// auth data match this profile?
    pub fn matches(&self, servers: Option<&[String]>) -> bool {
        match (self, servers) {
            (WarmProfile::All, None) => true,
            (WarmProfile::Servers(want), Some(asked)) => {
                let mut asked = asked.to_vec();
                asked.sort();
                asked.dedup();
                &asked == want
            }
            _ => false,
        }
    }
}

/// A lease an idle slot already holds: its id (the future sandbox id) and
/// the servers it runs.
#[derive(Debug, Clone)]
pub struct WarmLease {
    pub lease_id: String,
    pub servers: Vec<String>,
}

/// What [`Pool::take`] hands out.
pub struct Taken {
    pub slot: Slot,
    pub warm: Option<WarmLease>,
}

struct Idle {
    slot: Slot,
    warm: Option<WarmLease>,
    /// A warm lease is being acquired on it: not for [`Pool::take`] yet.
    warming: bool,
}

impl Idle {
    fn bare(slot: Slot) -> Idle {
        Idle {
            slot,
            warm: None,
            warming: false,
        }
    }
}

pub struct PoolConfig {
    pub backend: Backend,
    pub dir: PathBuf,
    pub size: usize,
    pub warm: Option<WarmProfile>,
    /// What a released sandbox becomes.
    pub on_release: OnRelease,
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
    /// Set by [`Pool::close`] while it holds both `idle` and `starting`;
    /// read under the lock of the list a slot is about to join, so no slot
    /// joins one after close emptied it.
    closed: AtomicBool,
    /// The server names this backend's agents carry, learned from the
    /// first slot that serves (every slot runs the same manifest or image).
    catalog: Mutex<Option<Vec<String>>>,
    refill: Notify,
}

impl Pool {
    pub fn new(cfg: PoolConfig) -> anyhow::Result<Arc<Pool>> {
        std::fs::create_dir_all(&cfg.dir)
            .with_context(|| format!("creating {}", cfg.dir.display()))?;
        Ok(Arc::new(Pool {
            cfg,
            idle: Mutex::new(Vec::new()),
            leased: Mutex::new(HashMap::new()),
            starting: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            catalog: Mutex::new(None),
            refill: Notify::new(),
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
        Ok(())
    }

    pub fn warm_profile(&self) -> Option<&WarmProfile> {
        self.cfg.warm.as_ref()
    }

    pub fn on_release(&self) -> OnRelease {
        self.cfg.on_release
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

    /// Records the server names of a slot that serves, once.
    async fn learn_catalog(&self, slot: &Slot) {
        if self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return;
        }
        let listed = match slot.client().await {
            Ok(c) => c.servers().list(proto::ListServersRequest {}).await,
            Err(_) => return,
        };
        if let Ok(r) = listed {
            let names: Vec<String> = r.into_inner().servers.into_iter().map(|s| s.name).collect();
            info!(servers = %names.join(","), "the sandboxes carry these servers");
            *self.catalog.lock().unwrap_or_else(|p| p.into_inner()) = Some(names);
        }
    }

    /// After a host restart: slots still running are taken back (leased
    /// when a live sandbox names them, idle otherwise, after releasing any
    /// lease they hold); the rest are removed. Returns the slots that are
    /// gone.
    pub async fn recover(&self, in_use: &[String]) -> Vec<String> {
        let mut gone = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.cfg.dir) else {
            return gone;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let dir = e.path();
            let kind = match std::fs::read_to_string(dir.join("backend")).as_deref() {
                Ok("qemu") => Kind::Qemu,
                _ => Kind::Process,
            };
            let pid = std::fs::read_to_string(dir.join("agent.pid"))
                .ok()
                .and_then(|p| p.trim().parse().ok());
            let slot = pid.map(|pid| Slot {
                id: id.clone(),
                dir: dir.clone(),
                pid,
                kind,
            });
            match slot {
                Some(s) if s.alive() && in_use.contains(&id) => {
                    self.leased().insert(id, s);
                }
                Some(s)
                    if s.alive()
                        && s.kind == self.cfg.backend.kind()
                        && self.idle().len() < self.cfg.size =>
                {
                    // An agent nobody leases may still hold a warm lease, or
                    // the lease of a sandbox released while the host was
                    // down.
                    if let Ok(c) = s.client().await {
                        let _ = c.agent().release(proto::ReleaseRequest::default()).await;
                    }
                    if let Err(s) = self.put_idle(Idle::bare(s)) {
                        let _ = tokio::task::spawn_blocking(move || discard(&s)).await;
                        gone.push(id);
                    }
                }
                other => {
                    if let Some(s) = other {
                        let _ = tokio::task::spawn_blocking(move || stop(&s)).await;
                    }
                    let _ = std::fs::remove_dir_all(&dir);
                    gone.push(id);
                }
            }
        }
        gone
    }

    /// An idle slot, or a new one when none is. `matches_warm` says whether
    /// the Acquire asks for exactly the warm profile: then a slot holding a
    /// warm lease is preferred (and handed out with it); otherwise a bare
    /// slot is, and a warm lease handed out with a non-matching request is
    /// for the caller to release first.
    pub async fn take(self: &Arc<Self>, matches_warm: bool) -> anyhow::Result<Taken> {
        let picked = {
            let mut idle = self.idle();
            idle.retain(|i| {
                let ok = i.slot.alive();
                if !ok {
                    let _ = std::fs::remove_dir_all(&i.slot.dir);
                }
                ok
            });
            let pos = idle
                .iter()
                .position(|i| !i.warming && i.warm.is_some() == matches_warm)
                .or_else(|| idle.iter().position(|i| !i.warming));
            pos.map(|p| idle.remove(p))
        };
        self.refill.notify_one();
        let taken = match picked {
            Some(i) => Taken {
                slot: i.slot,
                warm: i.warm,
            },
            None => Taken {
                slot: self.spawn().await?,
                warm: None,
            },
        };
        self.leased()
            .insert(taken.slot.id.clone(), taken.slot.clone());
        Ok(taken)
    }

    pub fn leased_slot(&self, id: &str) -> Option<Slot> {
        self.leased().get(id).cloned()
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
            Err(slot) => discard(&slot),
        }
    }

    /// A slot that cannot be trusted any more (died, failed to release).
    /// Blocking.
    pub fn drop_slot(&self, slot_id: &str) {
        if let Some(slot) = self.leased().remove(slot_id) {
            discard(&slot);
        }
        self.refill.notify_one();
    }

    /// Leased slots whose agent is gone.
    pub fn dead_leased(&self) -> Vec<String> {
        self.leased()
            .values()
            .filter(|s| !s.alive())
            .map(|s| s.id.clone())
            .collect()
    }

    /// Keeps `size` idle slots, each holding a warm lease when a profile is
    /// set, until the pool is closed.
    pub async fn keep_warm(self: Arc<Self>) {
        while !self.is_closed() {
            let short = self.idle().len() < self.cfg.size;
            if short {
                match self.spawn().await {
                    Ok(slot) => {
                        // A slot given back while this one started may have
                        // filled the pool already, or the pool closed.
                        if let Err(surplus) = self.put_idle(Idle::bare(slot)) {
                            let _ = tokio::task::spawn_blocking(move || discard(&surplus)).await;
                        }
                    }
                    Err(_) if self.is_closed() => return,
                    Err(e) => {
                        warn!(error = %format!("{e:#}"), "cannot start a pool sandbox");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                }
                continue;
            }
            if let Some(profile) = self.cfg.warm.clone() {
                // The slot stays in the pool while its lease is acquired
                // (marked, so Acquire passes it over), so a close stops it.
                let bare = self
                    .idle()
                    .iter_mut()
                    .find(|i| i.warm.is_none() && !i.warming)
                    .map(|i| {
                        i.warming = true;
                        i.slot.clone()
                    });
                if let Some(slot) = bare {
                    let lease = pre_acquire(&slot, &profile).await;
                    let failed = {
                        let mut idle = self.idle();
                        // Gone: closed, or found dead by a sweep.
                        let entry = idle.iter_mut().find(|i| i.slot.id == slot.id);
                        match (lease, entry) {
                            (Ok(w), Some(i)) => {
                                info!(slot = %slot.id, lease = %w.lease_id, "warm lease ready");
                                i.warm = Some(w);
                                i.warming = false;
                                false
                            }
                            (Ok(_), None) => false,
                            (Err(e), entry) => {
                                warn!(slot = %slot.id, error = %format!("{e:#}"), "cannot pre-acquire the warm servers; the slot stays bare");
                                if let Some(i) = entry {
                                    i.warming = false;
                                }
                                true
                            }
                        }
                    };
                    if failed {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    continue;
                }
            }
            tokio::select! {
                _ = self.refill.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {
                    self.idle().retain(|i| {
                        let ok = i.slot.alive();
                        if !ok {
                            let _ = std::fs::remove_dir_all(&i.slot.dir);
                        }
                        ok
                    });
                }
            }
        }
    }

    /// Starts a slot and waits until its agent serves.
    async fn spawn(&self) -> anyhow::Result<Slot> {
        anyhow::ensure!(!self.is_closed(), "the host is stopping");
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = self.cfg.dir.join(&id);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let kind = self.cfg.backend.kind();
        std::fs::write(dir.join("backend"), kind.name())?;
        let log = std::fs::File::create(dir.join("agent.log"))?;
        let mut cmd = match &self.cfg.backend {
            Backend::Process {
                agent_bin,
                manifest,
            } => process_command(&dir, &id, agent_bin, manifest.as_deref())?,
            Backend::Qemu {
                run_script,
                image,
                memory_mib,
                accel,
            } => {
                let mut c = std::process::Command::new(run_script);
                c.arg("--initramfs")
                    .arg(image)
                    .arg("--vsock-uds")
                    .arg(dir.join("vsock.sock"))
                    .arg("--memory")
                    .arg(memory_mib.to_string())
                    .env("SANDBOX_AGENT_ACCEL", accel);
                c
            }
        };
        cmd.stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own session (and process group): a host restart (or its
        // terminal closing) does not take the slot down, and a stop reaches
        // every process of it.
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let pid = child.id();
        std::fs::write(dir.join("agent.pid"), pid.to_string())?;
        // Reap it when it exits (while this host runs).
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        let slot = Slot { id, dir, pid, kind };
        {
            let mut starting = self.starting();
            if self.is_closed() {
                drop(starting);
                let s = slot.clone();
                let _ = tokio::task::spawn_blocking(move || discard(&s)).await;
                anyhow::bail!("the host is stopping");
            }
            starting.insert(slot.id.clone(), slot.clone());
        }
        // From here until it leaves `starting`, a close stops it; after
        // that the caller places it (idle or leased) without awaiting.
        let ready = self.wait_serving(&slot).await;
        if ready.is_ok() {
            self.learn_catalog(&slot).await;
        }
        let still_ours = self.starting().remove(&slot.id).is_some();
        ready?;
        anyhow::ensure!(still_ours, "the host is stopping");
        info!(slot = %slot.id, pid, backend = kind.name(), "sandbox started");
        Ok(slot)
    }

    fn starting(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.starting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until a new slot's agent reports SERVING; discards it when it
    /// dies or the backend's deadline passes.
    async fn wait_serving(&self, slot: &Slot) -> anyhow::Result<()> {
        let kind = slot.kind;
        let deadline = Instant::now() + self.cfg.backend.start_deadline();
        loop {
            if let Ok(c) = slot.client().await
                && let Ok(r) = c
                    .health()
                    .check(proto::health::HealthCheckRequest::default())
                    .await
                && r.into_inner().status == 1
            {
                break;
            }
            if !slot.alive() || Instant::now() > deadline {
                let log = std::fs::read_to_string(slot.dir.join("agent.log")).unwrap_or_default();
                let s = slot.clone();
                let _ = tokio::task::spawn_blocking(move || discard(&s)).await;
                anyhow::bail!(
                    "the {} sandbox did not start serving: {}",
                    kind.name(),
                    tail(&log, 2000)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
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
        std::thread::scope(|scope| {
            for slot in &slots {
                scope.spawn(move || discard(slot));
            }
        });
        slots.len()
    }
}

/// The command line of a local agent in slot `dir`.
fn process_command(
    dir: &Path,
    id: &str,
    agent_bin: &Path,
    manifest: Option<&Path>,
) -> anyhow::Result<std::process::Command> {
    std::fs::create_dir_all(dir.join("ws"))?;
    let mut cmd = std::process::Command::new(agent_bin);
    cmd.arg("--listen")
        .arg(format!("unix://{}", dir.join("agent.sock").display()))
        .arg("--mcp-listen")
        .arg(format!("unix://{}", dir.join("mcp.sock").display()))
        .arg("--workspace")
        .arg(dir.join("ws"))
        .arg("--name")
        .arg(id)
        .env("SANDBOX_AGENT_CONFIG", "/dev/null");
    if let Some(m) = manifest {
        // Agents on one machine must not share server state: each gets the
        // manifest with the state root moved into its slot.
        let text =
            std::fs::read_to_string(m).with_context(|| format!("reading {}", m.display()))?;
        let own = text.replace(STATE_ROOT, &dir.join("state").display().to_string());
        let path = dir.join("servers.toml");
        std::fs::write(&path, own)?;
        cmd.arg("--manifest").arg(path);
    }
    Ok(cmd)
}

/// Acquires the warm profile's servers on an idle slot, under the id its
/// sandbox will have.
async fn pre_acquire(slot: &Slot, profile: &WarmProfile) -> anyhow::Result<WarmLease> {
    let lease_id = uuid::Uuid::new_v4().to_string();
    let (names, all) = match profile {
        WarmProfile::All => (Vec::new(), true),
        WarmProfile::Servers(n) => (n.clone(), false),
    };
    let r = slot
        .client()
        .await?
        .agent()
        .acquire(proto::AcquireRequest {
            lease_id: lease_id.clone(),
            server_names: names,
            all_servers: all,
            // The host's reaper owns TTLs.
            ttl_seconds: Some(0),
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    Ok(WarmLease {
        lease_id,
        servers: r.servers.into_iter().map(|s| s.name).collect(),
    })
}

/// The last `max` bytes of a log, on a character boundary.
fn tail(s: &str, max: usize) -> &str {
    let s = s.trim();
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// SIGTERM to the slot's process (the agent stops its servers; run-qemu.sh
/// stops QEMU and vhost-device-vsock), SIGKILL to its whole process group
/// after a grace.
fn stop(slot: &Slot) {
    use nix::sys::signal::{Signal, kill, killpg};
    let pid = nix::unistd::Pid::from_raw(slot.pid as i32);
    if !slot.alive() {
        return;
    }
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while slot.alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if slot.alive() {
        let _ = killpg(pid, Signal::SIGKILL);
    }
}

fn discard(slot: &Slot) {
    stop(slot);
    let _ = std::fs::remove_dir_all(&slot.dir);
}

/// Where the slots' directories are, in the data dir.
pub fn slots_dir(data: &Path) -> PathBuf {
    data.join("slots")
}

/// Which accelerator the VMs get: `kvm` when a guest kernel really boots
/// under it, else `tcg` (run-qemu.sh's probe, run once for the whole pool
/// instead of once per VM).
pub fn probe_accel(run_script: &Path, image: &Path) -> anyhow::Result<String> {
    let out = std::process::Command::new(run_script)
        .arg("--probe-accel")
        .arg("--initramfs")
        .arg(image)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {}", run_script.display()))?;
    let accel = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    anyhow::ensure!(
        out.status.success() && (accel == "kvm" || accel == "tcg"),
        "{} --probe-accel failed: {}",
        run_script.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(accel)
}
