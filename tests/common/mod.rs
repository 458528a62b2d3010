//! Test harness: starts the real `sandbox-agent` and `sandboxctl` binaries.
#![allow(dead_code)]

pub mod bench_data;
pub mod bins;
pub mod host;
pub mod mcp;
pub mod servers;
pub mod slots;
pub mod standin;
pub mod tool_surface;
pub mod vm;
pub mod ws;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use bins::{AGENT, CTL, HOST};
pub const TOKEN: &str = "test-token-0123456789abcdef";

/// Lines a child wrote to stderr, shared with the reader thread.
#[derive(Clone, Default)]
pub struct Lines(Arc<(Mutex<Vec<String>>, Condvar)>);

impl Lines {
    /// Waits until a line satisfies `pred` and returns it.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.0;
        let mut lines = lock.lock().unwrap();
        loop {
            if let Some(l) = lines.iter().find(|l| pred(l)) {
                return Some(l.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            lines = cv.wait_timeout(lines, deadline - now).unwrap().0;
        }
    }

    pub fn all(&self) -> String {
        self.0.0.lock().unwrap().join("\n")
    }
}

/// A running agent; killed (and reaped) when dropped.
pub struct Agent {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub stderr: Lines,
    pub socket: PathBuf,
}

impl Agent {
    /// Starts an agent with a unix listener at `<dir>/agent.sock`, workspace
    /// `<dir>/ws`, and `extra` arguments; waits until it logs "serving".
    pub fn start(extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        Agent::start_in(dir, extra, &[])
    }

    pub fn start_in(dir: tempfile::TempDir, extra: &[&str], env: &[(&str, &str)]) -> Agent {
        Agent::start_as(None, dir, extra, env)
    }

    /// As [`Agent::start_in`], as the user `uid` (through `setpriv`) when
    /// given: `dir` is then handed to that user.
    pub fn start_as(
        uid: Option<u32>,
        dir: tempfile::TempDir,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        let cmd = match uid {
            Some(uid) => {
                let d = dir.path();
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
                nix::unistd::chown(d, Some(uid.into()), Some(uid.into())).expect("chown");
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .args(["--clear-groups", "--"])
                    .arg(&*AGENT)
                    .env("HOME", d);
                c
            }
            None => {
                // A root agent runs its tenants as uid 1000, which must
                // pass through to the workspace and state below `dir`.
                std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
                    .expect("chmod");
                Command::new(&*AGENT)
            }
        };
        Agent::start_cmd(cmd, dir, extra, env)
    }

    /// An agent as root and PID 1 of its own pid, IPC, mount and uts
    /// namespaces (util-linux `unshare`), as in a VM or the host's process
    /// backend: what it does only as PID 1 runs. As PID 1 it mounts a
    /// tmpfs on /tmp and /run: `dir` must be elsewhere.
    pub fn start_pid1(dir: tempfile::TempDir, extra: &[&str]) -> Agent {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        // Without cgroups: this agent shares the host's cgroup hierarchy
        // (no cgroup namespace here) but not its pids, and would take the
        // other test agents' groups for stale ones.
        let config = dir.path().join("pid1.toml");
        // Nor the machine's kernel settings: this agent is not its init.
        std::fs::write(
            &config,
            "[supervisor]\ncgroup = \"off\"\n\n[init]\nprotect_links = false\n",
        )
        .expect("config");
        let config = config.display().to_string();
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--pid",
            "--fork",
            "--kill-child",
            "--ipc",
            "--uts",
            "--mount",
        ])
        .args(["--mount-proc", "--propagation", "private", "--"])
        // The agent, as PID 1, takes a temporary directory that is a mount
        // point for the sandbox's own and empties it at Release: this
        // machine's /dev/shm (a mount point) must not be that one. `sh`
        // execs the agent, which stays PID 1.
        .args([
            "/bin/sh",
            "-c",
            "mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm && exec \"$0\" \"$@\"",
        ])
        .arg(&*AGENT);
        let mut all = vec!["--config", &config];
        all.extend_from_slice(extra);
        Agent::start_cmd(cmd, dir, &all, &[])
    }

    /// `cmd` (the agent, however launched) with the tests' arguments.
    fn start_cmd(
        mut cmd: Command,
        dir: tempfile::TempDir,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        let socket = dir.path().join("agent.sock");
        if !extra.contains(&"--mcp-listen") {
            // Not the default vsock://any:1025: tests run agents in parallel.
            cmd.arg("--mcp-listen")
                .arg(format!("unix://{}", dir.path().join("mcp.sock").display()));
        }
        let config_sets_it = extra
            .iter()
            .position(|a| *a == "--config")
            .and_then(|i| extra.get(i + 1))
            .and_then(|c| std::fs::read_to_string(c).ok())
            .is_some_and(|t| t.lines().any(|l| l.trim_start().starts_with("state_root")));
        if !extra.contains(&"--state-root") && !config_sets_it {
            // Not the shared default under /var/lib: one per agent (the
            // tenant's home is there).
            cmd.arg("--state-root").arg(dir.path().join("state"));
        }
        if !extra.contains(&"--exec-root") {
            // Not the shared default under /var/lib: one per agent.
            cmd.arg("--exec-root").arg(dir.path().join("exec"));
        }
        cmd.arg("--listen")
            .arg(format!("unix://{}", socket.display()))
            .arg("--workspace")
            .arg(dir.path().join("ws"))
            .args(extra)
            .env_remove("SANDBOX_AGENT_TOKEN")
            .env_remove("SANDBOX_AGENT_LISTEN")
            .env_remove("SANDBOX_AGENT_CONFIG")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Agent::spawn(cmd, dir, socket)
    }

    /// Spawns `cmd` (an agent, however launched, its environment as the
    /// caller set it), owning `dir`, and waits until it logs "serving";
    /// `socket` is its control-plane socket.
    pub fn spawn(mut cmd: Command, dir: tempfile::TempDir, socket: PathBuf) -> Agent {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn sandbox-agent");
        let stderr = capture(child.stderr.take().unwrap());
        let agent = Agent {
            child,
            dir,
            stderr,
            socket,
        };
        if agent
            .stderr
            .wait_for(Duration::from_secs(20), |l| {
                l.contains(" serving ") || l.contains("\"message\":\"serving\"")
            })
            .is_none()
        {
            panic!(
                "agent did not start serving; stderr:\n{}",
                agent.stderr.all()
            );
        }
        agent
    }

    /// The MCP data plane's unix socket (unless a test chose its own).
    pub fn mcp_socket(&self) -> PathBuf {
        self.dir.path().join("mcp.sock")
    }

    pub fn unix_uri(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The endpoint a "listening" log line reports for `scheme`.
    pub fn listening(&self, scheme: &str) -> String {
        let line = self
            .stderr
            .wait_for(Duration::from_secs(5), |l| {
                l.contains("listening") && l.contains(&format!("endpoint={scheme}://"))
            })
            .unwrap_or_else(|| panic!("no {scheme} listener; stderr:\n{}", self.stderr.all()));
        let start = line.find("endpoint=").unwrap() + "endpoint=".len();
        line[start..].split_whitespace().next().unwrap().to_owned()
    }

    /// SIGKILLs the agent and hands back its directory (for a restart).
    pub fn kill9(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap())
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal(self.child.id(), nix::sys::signal::Signal::SIGTERM);
        eventually(
            Duration::from_secs(15),
            "the agent exits on SIGTERM",
            || {
                self.child
                    .try_wait()
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| "still running".to_owned())
            },
        )
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory for an agent run by [`Agent::start_pid1`]: not below
/// `/tmp`, `/var/tmp` or `/dev/shm` (the agent, as PID 1, mounts a tmpfs of
/// its own over each) nor `/run`, nor below the build's directory (which
/// may be below /tmp).
pub fn pid1_dir() -> tempfile::TempDir {
    let base = Path::new("/var/lib/sandbox-suite");
    std::fs::create_dir_all(base).expect("/var/lib/sandbox-suite");
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o711)).expect("chmod");
    tempfile::tempdir_in(base).expect("tempdir")
}

/// The pid (as this test sees it) of the agent [`Agent::start_pid1`]
/// started: the child of its `unshare`.
pub fn pid1_agent_pid(agent: &Agent) -> u32 {
    let parent = agent.child.id();
    eventually(Duration::from_secs(10), "the agent under unshare", || {
        for e in std::fs::read_dir("/proc")
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) {
                return Ok(pid);
            }
        }
        Err("no child yet".into())
    })
}

/// Whether the test runs as root; if not, says on stderr that `what` is
/// skipped and why. Under `CI=true` a test that needs root fails instead:
/// CI runs as root (`.ci/test-all.sh` checks), so a skip there would be a
/// claim of docs/security.md left untested without a word.
pub fn root_or_skip(what: &str) -> bool {
    root_or_skip_in(what, nix::unistd::geteuid().is_root(), ci())
}

/// Whether this runs in CI (`CI=true`, as CI services set it).
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

fn root_or_skip_in(what: &str, root: bool, ci: bool) -> bool {
    if !root {
        assert!(
            !ci,
            "{what} needs root, and CI=true: the test command must run as root in CI"
        );
        skipped(&format!(
            "{what} needs root (run the test command as root to cover it)"
        ));
    }
    root
}

/// Whether this machine has what `what` needs (`needs` says what: an
/// address, a tool, data); if not, says on stderr that `what` is skipped
/// and why. Under `CI=true` it fails instead, as [`root_or_skip`] does: a
/// skip there would leave a claim untested without a word.
pub fn have_or_skip(have: bool, what: &str, needs: &str) -> bool {
    have_or_skip_in(have, what, needs, ci())
}

fn have_or_skip_in(have: bool, what: &str, needs: &str, ci: bool) -> bool {
    if !have {
        assert!(!ci, "{what} needs {needs}, and CI=true: CI must provide it");
        skipped(&format!("{what} needs {needs}"));
    }
    have
}

/// Says on the terminal that a test is skipped, and why: written to the
/// process's stderr itself, past the test harness's capture (which hides
/// what a passing test prints), so a run shows every skip.
pub fn skipped(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
}

/// How often [`eventually`] looks again.
pub const POLL: Duration = Duration::from_millis(50);

/// Polls `check` until it returns `Ok`, and returns that value. `Err`
/// says what it sees instead; once `within` has passed, the test fails with
/// `what` and the last `Err`. For the states a test waits for, never a
/// fixed sleep.
pub fn eventually<T>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match check() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("{what}: not within {within:?}; last seen: {last}")
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// [`eventually`] with an async check.
pub async fn eventually_async<T>(
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("{what}: not within {within:?}; last seen: {last}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// `Ok(())` when `cond`, else `Err(why())`: the usual check of [`eventually`].
pub fn when(cond: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if cond { Ok(()) } else { Err(why()) }
}

pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
}

pub fn capture(stream: impl std::io::Read + Send + 'static) -> Lines {
    let lines = Lines::default();
    let shared = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let (lock, cv) = &*shared.0;
            lock.lock().unwrap().push(line);
            cv.notify_all();
        }
    });
    lines
}

/// Runs `sandboxctl` with `args` (environment cleared of agent settings).
pub fn ctl(args: &[&str]) -> Output {
    Command::new(&*CTL)
        .args(args)
        .env_remove("SANDBOX_AGENT")
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_TOKEN_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("run sandboxctl")
}

/// Runs `sandbox-agent` to completion (for --check-config and start errors).
pub fn agent_once(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(&*AGENT);
    cmd.args(args)
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_LISTEN")
        .env_remove("SANDBOX_AGENT_CONFIG")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run sandbox-agent")
}

/// Peak resident memory of a process (VmHWM), in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb << 10
}

/// A JSON-RPC batch of `n` `method` requests (ids 0..n), as a POST body.
pub fn rpc_batch(n: usize, method: &str) -> String {
    let all: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"{method}"}}"#))
        .collect();
    format!("[{}]", all.join(","))
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn write_token(dir: &Path) -> PathBuf {
    let p = dir.join("token");
    std::fs::write(&p, format!("{TOKEN}\n")).unwrap();
    p
}

/// Gives `path` (and everything below it) to the owner of `workspace`: the
/// tenant of a root agent. What a test puts into a workspace itself is the
/// test's (root's); an Initialize gives its files to the tenant, and git
/// refuses a repository another user owns.
pub fn as_tenant(workspace: &Path, path: &Path) {
    let st = Command::new("chown")
        .arg("-R")
        .arg(format!("--reference={}", workspace.display()))
        .arg(path)
        .status()
        .expect("chown");
    assert!(st.success(), "chown -R {}", path.display());
}

/// Under CI a test that needs root (or anything else it does not find)
/// fails; elsewhere it skips, saying so.
#[test]
fn a_root_test_fails_in_ci_when_not_root() {
    assert!(std::panic::catch_unwind(|| root_or_skip_in("a test", false, true)).is_err());
    assert!(!root_or_skip_in("a test", false, false));
    assert!(root_or_skip_in("a test", true, true));
    assert!(std::panic::catch_unwind(|| have_or_skip_in(false, "a test", "a tool", true)).is_err());
    assert!(!have_or_skip_in(false, "a test", "a tool", false));
    assert!(have_or_skip_in(true, "a test", "a tool", true));
}
