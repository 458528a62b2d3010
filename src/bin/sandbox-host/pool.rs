//! The `process` backend: each sandbox is a local `sandbox-agent` process
//! with its own directory (workspace, unix sockets, log), started in its own
//! session so it outlives a host restart. A pool keeps `size` idle agents
//! warm; a released agent goes back to the pool (its Release already
//! cleared the workspace and stopped its servers) or is stopped when the
//! pool is full. Agents that die are dropped and replaced.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use sandbox_agent::proto;
use tokio::sync::Notify;
use tracing::{info, warn};

/// The state root of the shipped manifest (`packaging/servers.toml`).
const STATE_ROOT: &str = "/var/lib/sandbox-agent";

#[derive(Debug, Clone)]
pub struct Slot {
    pub id: String,
    pub dir: PathBuf,
    pub pid: u32,
}

impl Slot {
    pub fn agent_uri(&self) -> String {
        format!("unix://{}", self.dir.join("agent.sock").display())
    }
    pub fn mcp_socket(&self) -> PathBuf {
        self.dir.join("mcp.sock")
    }
    pub async fn client(&self) -> anyhow::Result<sandbox_agent::Client> {
        sandbox_agent::connect(&self.agent_uri())
            .await
            .with_context(|| format!("agent of slot {}", self.id))
    }
    /// Alive, and still our agent (not a reused pid).
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

pub struct PoolConfig {
    pub agent_bin: PathBuf,
    pub manifest: Option<PathBuf>,
    pub dir: PathBuf,
    pub size: usize,
}

pub struct Pool {
    cfg: PoolConfig,
    idle: Mutex<Vec<Slot>>,
    leased: Mutex<HashMap<String, Slot>>,
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
            refill: Notify::new(),
        }))
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<Slot>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn leased(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.leased.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After a host restart: agents still running are taken back (leased
    /// when a live sandbox names them, idle otherwise); the rest removed.
    /// Returns the slots that are gone.
    pub async fn recover(&self, in_use: &[String]) -> Vec<String> {
        let mut gone = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.cfg.dir) else {
            return gone;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            let dir = e.path();
            let pid = std::fs::read_to_string(dir.join("agent.pid"))
                .ok()
                .and_then(|p| p.trim().parse().ok());
            let slot = pid.map(|pid| Slot {
                id: id.clone(),
                dir: dir.clone(),
                pid,
            });
            match slot {
                Some(s) if s.alive() && in_use.contains(&id) => {
                    self.leased().insert(id, s);
                }
                Some(s) if s.alive() && self.idle().len() < self.cfg.size => {
                    // An agent nobody leases may still hold a lease of a
                    // sandbox released while the host was down.
                    if let Ok(c) = s.client().await {
                        let _ = c.agent().release(proto::ReleaseRequest::default()).await;
                    }
                    self.idle().push(s);
                }
                other => {
                    if let Some(s) = other {
                        stop(&s);
                    }
                    let _ = std::fs::remove_dir_all(&dir);
                    gone.push(id);
                }
            }
        }
        gone
    }

    /// A warm agent, or a new one when none is idle.
    pub async fn take(self: &Arc<Self>) -> anyhow::Result<Slot> {
        let warm = loop {
            let s = self.idle().pop();
            match s {
                Some(s) if s.alive() => break Some(s),
                Some(s) => {
                    let _ = std::fs::remove_dir_all(&s.dir);
                }
                None => break None,
            }
        };
        self.refill.notify_one();
        let slot = match warm {
            Some(s) => s,
            None => self.spawn().await?,
        };
        self.leased().insert(slot.id.clone(), slot.clone());
        Ok(slot)
    }

    pub fn leased_slot(&self, id: &str) -> Option<Slot> {
        self.leased().get(id).cloned()
    }

    /// A released agent: back to the pool, or stopped when it is full.
    pub fn give_back(&self, slot_id: &str) {
        let Some(slot) = self.leased().remove(slot_id) else {
            return;
        };
        let mut idle = self.idle();
        if slot.alive() && idle.len() < self.cfg.size {
            idle.push(slot);
        } else {
            drop(idle);
            discard(&slot);
        }
    }

    /// An agent that cannot be trusted any more (died, failed to release).
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

    /// Keeps `size` idle agents warm.
    pub async fn keep_warm(self: Arc<Self>) {
        loop {
            self.idle().retain(|s| {
                let ok = s.alive();
                if !ok {
                    let _ = std::fs::remove_dir_all(&s.dir);
                }
                ok
            });
            while self.idle().len() < self.cfg.size {
                match self.spawn().await {
                    Ok(s) => self.idle().push(s),
                    Err(e) => {
                        warn!(error = %format!("{e:#}"), "cannot start a pool agent");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        break;
                    }
                }
            }
            tokio::select! {
                _ = self.refill.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }

    /// Starts an agent in a new slot and waits until it serves.
    async fn spawn(&self) -> anyhow::Result<Slot> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = self.cfg.dir.join(&id);
        std::fs::create_dir_all(dir.join("ws"))
            .with_context(|| format!("creating {}", dir.display()))?;
        let log = std::fs::File::create(dir.join("agent.log"))?;
        let mut cmd = std::process::Command::new(&self.cfg.agent_bin);
        cmd.arg("--listen")
            .arg(format!("unix://{}", dir.join("agent.sock").display()))
            .arg("--mcp-listen")
            .arg(format!("unix://{}", dir.join("mcp.sock").display()))
            .arg("--workspace")
            .arg(dir.join("ws"))
            .arg("--name")
            .arg(&id)
            .env("SANDBOX_AGENT_CONFIG", "/dev/null")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(m) = &self.cfg.manifest {
            // Agents on one machine must not share server state: each gets
            // the manifest with the state root moved into its slot.
            let text =
                std::fs::read_to_string(m).with_context(|| format!("reading {}", m.display()))?;
            let own = text.replace(STATE_ROOT, &dir.join("state").display().to_string());
            let path = dir.join("servers.toml");
            std::fs::write(&path, own)?;
            cmd.arg("--manifest").arg(path);
        }
        // Its own session: a host restart (or its terminal closing) does
        // not take the agent down.
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid()
                    .map(|_| ())
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.cfg.agent_bin.display()))?;
        let pid = child.id();
        std::fs::write(dir.join("agent.pid"), pid.to_string())?;
        // Reap it when it exits (while this host runs).
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        let slot = Slot { id, dir, pid };
        let deadline = Instant::now() + Duration::from_secs(20);
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
                discard(&slot);
                anyhow::bail!("the agent did not start serving: {}", log.trim());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        info!(slot = %slot.id, pid, "agent started");
        Ok(slot)
    }

    /// Stops every idle agent (leased ones keep running for a restart).
    pub fn stop_idle(&self) {
        for s in self.idle().drain(..) {
            discard(&s);
        }
    }
}

/// SIGTERM (the agent stops its servers), SIGKILL after a grace.
fn stop(slot: &Slot) {
    use nix::sys::signal::{Signal, kill};
    let pid = nix::unistd::Pid::from_raw(slot.pid as i32);
    if !slot.alive() {
        return;
    }
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while slot.alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if slot.alive() {
        let _ = kill(pid, Signal::SIGKILL);
    }
}

fn discard(slot: &Slot) {
    stop(slot);
    let _ = std::fs::remove_dir_all(&slot.dir);
}

/// Where a slot's directory is, for the data dir layout.
pub fn slots_dir(data: &Path) -> PathBuf {
    data.join("slots")
}
