//! One slot: its directory, its agent's endpoints, and how it is stopped
//! (its whole process group) or discarded.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandbox_client::transport::Endpoint;

use super::*;

#[derive(Debug, Clone)]
pub struct Slot {
    pub id: String,
    pub kind: Kind,
    /// Where the slot runs: what only that backend has.
    pub place: Place,
}

/// A slot of this machine (process, qemu), or a claimed pod.
#[derive(Debug, Clone)]
pub enum Place {
    Local {
        /// The slot's directory under the data dir.
        dir: PathBuf,
        /// The slot's main process: the agent, or run-qemu.sh. It leads
        /// its own process group.
        pid: u32,
    },
    /// A sandbox of the kubernetes backend: its pod's agent over TCP;
    /// nothing of it runs here.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    Pod(Remote),
}

/// Where a claimed pod's agent listens, and the lease's token it admits.
#[derive(Debug, Clone)]
pub struct Remote {
    pub host: String,
    pub grpc_port: u16,
    pub mcp_port: u16,
    pub token: sandbox_client::auth::Token,
}

impl Slot {
    /// A claimed pod's sandbox: `id` is its claim.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub fn remote(id: String, remote: Remote) -> Slot {
        Slot {
            id,
            kind: Kind::Kubernetes,
            place: Place::Pod(remote),
        }
    }

    /// A slot of this machine: its directory and main process.
    pub fn local(id: String, kind: Kind, dir: PathBuf, pid: u32) -> Slot {
        Slot {
            id,
            kind,
            place: Place::Local { dir, pid },
        }
    }

    /// The slot's directory here (none for a claimed pod).
    pub fn dir(&self) -> Option<&std::path::Path> {
        match &self.place {
            Place::Local { dir, .. } => Some(dir),
            Place::Pod(_) => None,
        }
    }

    /// The claimed pod's agent (none for a slot of this machine).
    pub fn pod(&self) -> Option<&Remote> {
        match &self.place {
            Place::Pod(r) => Some(r),
            Place::Local { .. } => None,
        }
    }
}

/// How long the host waits for an agent's answer, per class of call
/// (`--agent-*-timeout`): a slot, VM or pod that takes the connection and
/// never answers makes an error within these, never a hang.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Short calls: the catalog, states, executions' status and logs, a
    /// new slot's serving probe, a token bind.
    pub call: Duration,
    /// Acquire, Narrow, Reset (they may start servers).
    pub acquire: Duration,
    /// Release (servers stopped; workspace, home and temp dirs deleted).
    pub release: Duration,
    /// Workspace and server-data transfers, execution uploads: until the
    /// agent's answer begins.
    pub transfer: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            call: Duration::from_secs(30),
            acquire: Duration::from_secs(300),
            release: Duration::from_secs(300),
            transfer: Duration::from_secs(3600),
        }
    }
}

impl Slot {
    pub fn agent_uri(&self) -> String {
        let dir = match &self.place {
            Place::Pod(r) => {
                return Endpoint::Tcp {
                    host: r.host.clone(),
                    port: r.grpc_port,
                }
                .to_string();
            }
            Place::Local { dir, .. } => dir,
        };
        match self.kind {
            Kind::Process => format!("unix://{}", dir.join("run/agent.sock").display()),
            Kind::Qemu | Kind::Kubernetes => format!(
                "hvsock://{}:{VM_AGENT_PORT}",
                dir.join("vsock.sock").display()
            ),
        }
    }
    /// The agent's MCP data plane.
    pub fn mcp_endpoint(&self) -> Endpoint {
        let dir = match &self.place {
            Place::Pod(r) => {
                return Endpoint::Tcp {
                    host: r.host.clone(),
                    port: r.mcp_port,
                };
            }
            Place::Local { dir, .. } => dir,
        };
        match self.kind {
            Kind::Process => Endpoint::Unix(dir.join("run/mcp.sock")),
            Kind::Qemu | Kind::Kubernetes => Endpoint::HybridVsock {
                path: dir.join("vsock.sock"),
                port: VM_MCP_PORT,
            },
        }
    }
    /// The data plane's bearer token (a claimed pod's lease token).
    pub fn mcp_token(&self) -> Option<&str> {
        self.pod().map(|r| r.token.expose())
    }
    /// A connection to the slot's agent whose calls fail when the agent
    /// has not begun to answer within `within` (see [`Deadlines`]).
    pub async fn client(
        &self,
        within: Duration,
    ) -> Result<sandbox_client::Client, super::PoolError> {
        let options = sandbox_client::ConnectOptions {
            token: self.pod().map(|r| r.token.clone()),
            request_timeout: Some(within),
            ..Default::default()
        };
        options
            .connect(&self.agent_uri())
            .await
            .map_err(|source| super::PoolError::Connect {
                slot: self.id.clone(),
                source,
            })
    }
    /// Alive, and still our process (not a reused pid). When that cannot
    /// be told (no file descriptor left to read /proc with), alive.
    pub fn alive(&self) -> bool {
        !self.dead()
    }

    /// Gone for certain: no such process, a zombie, or a reused pid. A
    /// transient failure to look (EMFILE under a connection flood) is never
    /// taken for death, which would mark a live sandbox `error` and drop
    /// its slot.
    pub fn dead(&self) -> bool {
        use nix::sys::signal::kill;
        let Some(pid) = local_pid(self) else {
            // A pod's end is the API server's to tell (its claim).
            return false;
        };
        if kill(pid, None) == Err(nix::errno::Errno::ESRCH) {
            return true;
        }
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => {
                let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
                if matches!(state, Some('Z') | Some('X')) {
                    return true;
                }
            }
            Err(e) => return gone(&e),
        }
        // Its command line names the slot (the agent's --name, or
        // run-qemu.sh's socket path in the slot directory).
        match std::fs::read(format!("/proc/{pid}/cmdline")) {
            Ok(c) => !String::from_utf8_lossy(&c).contains(&self.id),
            Err(e) => gone(&e),
        }
    }
}

/// The last `max` bytes of a log, on a character boundary.
pub(super) fn tail(s: &str, max: usize) -> &str {
    let s = s.trim();
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// SIGTERM to the slot's process (the agent stops its servers; run-qemu.sh
/// stops QEMU and vhost-device-vsock), SIGKILL to its whole process group
/// after a grace; then whatever an isolated slot had left (its cgroups,
/// its pasta): as the agent is PID 1 of its pid namespace, its death ends
/// every process there.
pub(super) fn stop(slot: &Slot) {
    let Some(dir) = slot.dir() else {
        // A claimed pod: nothing of it runs here (its end is its claim's).
        return;
    };
    stop_main(slot);
    super::isolate::teardown(&slot.id, dir);
}

/// The slot's own process here, if it has one: never for a claimed pod,
/// and never pid 0 (a signal to 0 reaches the host's own process group).
fn local_pid(slot: &Slot) -> Option<nix::unistd::Pid> {
    let Place::Local { pid, .. } = slot.place else {
        return None;
    };
    let pid = i32::try_from(pid).ok().filter(|p| *p > 0)?;
    Some(nix::unistd::Pid::from_raw(pid))
}

fn stop_main(slot: &Slot) {
    use nix::sys::signal::{Signal, kill, killpg};
    let Some(pid) = local_pid(slot) else {
        return;
    };
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
        let _ = kill(pid, Signal::SIGKILL);
    }
}

#[cfg(test)]
mod signals {
    use super::*;

    /// A claimed pod's slot names no process here (`pid` 0): stopping it
    /// must signal nothing, as a signal to pid 0 (or its group) would
    /// reach the host's own process group.
    #[test]
    fn a_remote_slot_or_pid_zero_is_never_signalled() {
        let token = sandbox_client::auth::Token::new("0123456789abcdef0123456789abcdef", "t")
            .expect("token");
        let remote = Slot::remote(
            "sbx-1".to_owned(),
            Remote {
                host: "10.0.0.1".to_owned(),
                grpc_port: 7070,
                mcp_port: 7071,
                token,
            },
        );
        assert_eq!(local_pid(&remote), None);
        let zero = Slot::local("s".to_owned(), Kind::Process, "/nonexistent".into(), 0);
        assert_eq!(local_pid(&zero), None);
        let local = Slot::local("s".to_owned(), Kind::Process, "/nonexistent".into(), 4242);
        assert_eq!(local_pid(&local), Some(nix::unistd::Pid::from_raw(4242)));
        // Stopping either returns without a signal (this test's process
        // group would otherwise get SIGTERM).
        stop(&remote);
        stop_main(&zero);
    }
}
