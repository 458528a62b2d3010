//! The task that keeps one server running: spawn, readiness, the wait for
//! an exit or a stop, the restart decision ([`super::restart`]), and the
//! stop of the whole process tree.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::logbuf::{LogBuf, Stream};
use super::manifest::{LaunchSpec, Transport};
use super::mcp::StdioConn;
use super::restart::{Decision, RestartTracker};
use super::spawn::{self, Exit};
use super::{Server, Shared, State, cgroup, now_ms, probe};

/// A server that fails its readiness check gets this long to exit on
/// SIGTERM before SIGKILL.
pub const NOT_READY_KILL_GRACE: Duration = Duration::from_millis(500);
/// Longest single attempt of an HTTP server's readiness probe.
pub const HTTP_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between HTTP readiness probes.
pub const HTTP_PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// How often a stop looks whether the process tree is gone.
pub const KILL_POLL: Duration = Duration::from_millis(20);
/// How long each SIGKILL round waits for the main process's exit.
pub const KILL_WAIT: Duration = Duration::from_millis(50);
/// SIGKILL rounds before a stop gives up on members that resist (each
/// round waits [`KILL_WAIT`] or [`KILL_POLL`]).
pub const KILL_ROUNDS: usize = 100;

pub(super) fn set_state(server: &Server, state: State, message: String) {
    server.status.send_modify(|s| {
        let now = now_ms();
        if s.state != state {
            s.state_since_ms = now;
        }
        s.state = state;
        s.message = message;
        s.updated_at_ms = now;
    });
}

/// Copies a child's output into its log buffer, line by line.
async fn pump(fd: OwnedFd, log: Arc<LogBuf>, stream: Stream) {
    let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut r = BufReader::new(rx);
    let max = log.max_line_bytes();
    let mut line = Vec::new();
    loop {
        line.clear();
        let mut cut = false;
        loop {
            let buf = match r.fill_buf().await {
                Ok(b) if !b.is_empty() => b,
                _ => {
                    if !line.is_empty() {
                        log.push(stream, &line, cut);
                    }
                    return;
                }
            };
            let (chunk, used, nl) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (&buf[..i], i + 1, true),
                None => (buf, buf.len(), false),
            };
            let room = max.saturating_sub(line.len());
            if chunk.len() > room {
                cut = true;
            }
            line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            r.consume(used);
            if nl {
                break;
            }
        }
        let text = line.strip_suffix(b"\r").unwrap_or(&line);
        log.push(stream, text, cut);
    }
}

enum Outcome {
    Exited(Exit),
    Stop,
}

/// Keeps one server running until `stop` is cancelled or it gives up:
/// launch, wait for readiness and then for an exit or the stop, decide
/// whether to restart.
pub(super) async fn runner(
    server: Arc<Server>,
    shared: Arc<Shared>,
    spec: LaunchSpec,
    stop: CancellationToken,
) {
    let mut spec = spec;
    shared
        .tenant
        .apply(&mut spec.uid, &mut spec.gid, &mut spec.env);
    let mut policy = RestartTracker::new(spec.restart.clone());
    loop {
        set_state(&server, State::Starting, String::new());
        let cg = server_cgroup(&shared, &server.name, &spec);
        let Some(mut p) = launch(&server, &shared, &spec, cg).await else {
            return;
        };
        let (outcome, not_ready) = p.until_exit_or_stop(&server, &spec, &stop).await;
        *server.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let exit = match outcome {
            Outcome::Stop => return p.stop(&server, &spec).await,
            Outcome::Exited(exit) => exit,
        };
        let Some(backoff) = p.exited(&server, &mut policy, exit, not_ready).await else {
            return;
        };
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.cancelled() => {
                set_state(&server, State::Stopped, String::new());
                return;
            }
        }
    }
}

/// The server's own cgroup with its memory limit, when the agent has
/// cgroups (else the server runs in its session only).
fn server_cgroup(shared: &Shared, name: &str, spec: &LaunchSpec) -> Option<Arc<cgroup::Cgroup>> {
    let cg = shared
        .cgroups
        .as_ref()
        .and_then(|root| match root.create(name) {
            Ok(cg) => Some(Arc::new(cg)),
            Err(e) => {
                warn!(error = %e, "cannot create the server's cgroup; using its session only");
                None
            }
        });
    if let (Some(cg), Some(mem)) = (&cg, spec.limits.memory_bytes)
        && shared.cgroups.as_ref().is_some_and(|r| r.memory_limits())
        && let Err(e) = cg.set_memory_max(mem)
    {
        warn!(error = %e, "cannot set memory.max");
    }
    cg
}

/// One process of a server, from its spawn to its exit.
struct Process {
    pid: i32,
    cg: Option<Arc<cgroup::Cgroup>>,
    started: Instant,
    exit_rx: oneshot::Receiver<Exit>,
    /// A stdio server's MCP connection (`None` for http, or unusable pipes).
    conn: Option<Arc<StdioConn>>,
    /// stdin stays open for the whole life of an http server too: some
    /// servers exit when their stdin closes.
    _stdin_keepalive: Option<OwnedFd>,
}

/// Spawns the server's process and attaches its output; a spawn that fails
/// leaves the server Failed (`None`).
async fn launch(
    server: &Server,
    shared: &Shared,
    spec: &LaunchSpec,
    cg: Option<Arc<cgroup::Cgroup>>,
) -> Option<Process> {
    let procs = cg.as_ref().and_then(|c| c.procs_fd().ok());
    let spawned = match shared.spawner.spawn(spec, procs).await {
        Ok(s) => s,
        Err(e) => {
            if let Some(cg) = &cg {
                cg.remove();
            }
            let msg = format!(
                "cannot start {:?} (in {}): {e}",
                spec.command,
                spec.cwd.display()
            );
            warn!("{msg}");
            server.log.push(
                Stream::Stderr,
                format!("sandbox-agent: {msg}").as_bytes(),
                false,
            );
            set_state(server, State::Failed, msg);
            return None;
        }
    };
    let pid = spawned.pid;
    let started = Instant::now();
    info!(pid, command = %spec.command, "server started");
    *server.proc_.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, cg.clone()));
    server.status.send_modify(|s| {
        s.pid = Some(pid);
        s.started_at_ms = now_ms();
        s.updated_at_ms = s.started_at_ms;
    });
    tokio::spawn(pump(spawned.stderr, server.log.clone(), Stream::Stderr));
    let (conn, stdin) = match &spec.transport {
        Transport::Stdio => {
            let conn = StdioConn::start(
                spawned.stdin,
                spawned.stdout,
                server.log.clone(),
                shared.cfg.stdio_message_bytes,
            );
            let conn = conn
                .inspect_err(|e| warn!(error = %e, "cannot attach to the server's pipes"))
                .ok();
            (conn, None)
        }
        Transport::Http { .. } => {
            tokio::spawn(pump(spawned.stdout, server.log.clone(), Stream::Stdout));
            (None, Some(spawned.stdin))
        }
    };
    Some(Process {
        pid,
        cg,
        started,
        exit_rx: spawned.exit,
        conn,
        _stdin_keepalive: stdin,
    })
}

/// Whether the server became ready within its `ready_timeout`: a stdio
/// server's MCP handshake, an http server's probe.
async fn ready(spec: &LaunchSpec, conn: Option<&Arc<StdioConn>>) -> Result<(), String> {
    match (&spec.transport, conn) {
        (Transport::Stdio, Some(c)) => c
            .handshake(spec.ready_timeout)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        (Transport::Stdio, None) => Err("the server's pipes are unusable".to_owned()),
        (Transport::Http { port, path }, _) => {
            let deadline = Instant::now() + spec.ready_timeout;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let last = probe::http_ready(*port, path, left.min(HTTP_PROBE_TIMEOUT)).await;
                match last {
                    Ok(()) => break Ok(()),
                    Err(e) if Instant::now() >= deadline => {
                        break Err(format!("not ready within {:?}: {e}", spec.ready_timeout));
                    }
                    Err(_) => tokio::time::sleep(HTTP_PROBE_INTERVAL).await,
                }
            }
        }
    }
}

impl Process {
    /// Waits for readiness (publishing Ready), then for the exit or the
    /// stop. A server that is not ready is killed: its exit comes back with
    /// the reason.
    async fn until_exit_or_stop(
        &mut self,
        server: &Server,
        spec: &LaunchSpec,
        stop: &CancellationToken,
    ) -> (Outcome, Option<String>) {
        let pid = self.pid;
        tokio::select! {
            r = ready(spec, self.conn.as_ref()) => match r {
                Ok(()) => {
                    *server.conn.lock().unwrap_or_else(|p| p.into_inner()) = self.conn.clone();
                    info!(pid, ms = self.started.elapsed().as_millis() as u64, "server ready");
                    set_state(server, State::Ready, String::new());
                    let outcome = tokio::select! {
                        e = &mut self.exit_rx => Outcome::Exited(e.unwrap_or(Exit::Signal(0))),
                        _ = stop.cancelled() => Outcome::Stop,
                    };
                    (outcome, None)
                }
                Err(msg) => {
                    warn!(pid, error = %msg, "server did not become ready");
                    let e = kill_tree(pid, self.cg.as_deref(), NOT_READY_KILL_GRACE, None, &mut self.exit_rx).await;
                    (Outcome::Exited(e), Some(msg))
                }
            },
            e = &mut self.exit_rx => (Outcome::Exited(e.unwrap_or(Exit::Signal(0))), None),
            _ = stop.cancelled() => (Outcome::Stop, None),
        }
    }

    /// A stop: the process tree ends within the stop grace (a Stop's own,
    /// else the manifest's), and the server is Stopped.
    async fn stop(mut self, server: &Server, spec: &LaunchSpec) {
        set_state(server, State::Stopping, String::new());
        let grace = server
            .stop_grace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or(spec.stop_grace);
        let exit = kill_tree(self.pid, self.cg.as_deref(), grace, None, &mut self.exit_rx).await;
        finish_process(server, exit, State::Stopped, String::new(), false);
        if let Some(cg) = &self.cg {
            cg.remove();
        }
        info!(pid = self.pid, %exit, "server stopped");
    }

    /// An exit (or a failed readiness): publishes it with the restart
    /// decision, ends what the process left running, and returns the
    /// backoff before the next start (`None`: no restart).
    async fn exited(
        &mut self,
        server: &Server,
        policy: &mut RestartTracker,
        exit: Exit,
        not_ready: Option<String>,
    ) -> Option<Duration> {
        let pid = self.pid;
        let why = match &not_ready {
            Some(m) => format!("not ready: {m}"),
            None => format!("exited: {exit}"),
        };
        warn!(pid, "{why}");
        // Decide first, so the exit and the next state are published in one
        // update: nobody may see a Ready server whose process is gone.
        let clean = exit == Exit::Code(0) && not_ready.is_none();
        let decision = policy.decide(clean, self.started.elapsed(), Instant::now());
        let (state, message, backoff) = next_state(decision, why);
        finish_process(server, exit, state, message, backoff.is_some());
        // The main process is gone; whatever it left running goes too.
        let cg = self.cg.as_deref();
        let _ = kill_tree(pid, cg, Duration::ZERO, Some(exit), &mut self.exit_rx).await;
        if let Some(cg) = cg {
            cg.remove();
        }
        backoff
    }
}

/// The state a restart decision leaves the server in, its message, and the
/// backoff before a restart (`Some`: the exit counts as a restart).
fn next_state(decision: Decision, why: String) -> (State, String, Option<Duration>) {
    match decision {
        Decision::Stay { failed: true } => (State::Failed, why, None),
        Decision::Stay { failed: false } => (State::Stopped, why, None),
        Decision::GiveUp { restarts, window } => {
            let msg = format!(
                "crash loop: {restarts} restarts within {} s; last: {why}",
                window.as_secs_f64()
            );
            warn!("{msg}; giving up");
            (State::Failed, msg, None)
        }
        Decision::Restart { after } => {
            let msg = format!("{why}; restarting in {} ms", after.as_millis());
            (State::Backoff, msg, Some(after))
        }
    }
}

/// Publishes the end of a process and the server's next state in one
/// update (`restarted`: count it as a restart).
fn finish_process(server: &Server, exit: Exit, state: State, message: String, restarted: bool) {
    *server.proc_.lock().unwrap_or_else(|p| p.into_inner()) = None;
    server.status.send_modify(|s| {
        let now = now_ms();
        s.pid = None;
        s.last_exit = Some((exit, now));
        if restarted {
            s.restarts += 1;
        }
        if s.state != state {
            s.state_since_ms = now;
        }
        s.state = state;
        s.message = message;
        s.updated_at_ms = now;
    });
}

/// SIGTERM to every process of the server, SIGKILL after `grace`; returns
/// once the main process is reaped and no member is left (or, for members
/// that resist, after a bounded wait).
pub(super) async fn kill_tree(
    pid: i32,
    cg: Option<&cgroup::Cgroup>,
    grace: Duration,
    known: Option<Exit>,
    exit_rx: &mut oneshot::Receiver<Exit>,
) -> Exit {
    // `exit_rx` is polled only while the exit is unknown: a completed
    // oneshot must not be polled again.
    let mut exit: Option<Exit> = known;
    // Sessions and groups seen led by members, across the rounds below.
    let mut seen = std::collections::HashSet::new();
    let mut members_of = |pid| spawn::members_tracked(pid, cg, &mut seen);
    let mut still = |exit: Option<Exit>| {
        let mut m = members_of(pid);
        m.retain(|p| spawn::alive(*p));
        (exit.is_none() || !m.is_empty(), m)
    };
    if !grace.is_zero() {
        let (_, members) = still(None);
        spawn::signal_all(pid, &members, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if exit.is_none()
                && let Ok(Ok(e)) = tokio::time::timeout(KILL_POLL, &mut *exit_rx).await
            {
                exit = Some(e);
            }
            if exit.is_some() {
                let (busy, _) = still(exit);
                if !busy {
                    return exit.unwrap_or(Exit::Signal(0));
                }
                tokio::time::sleep(KILL_POLL).await;
            }
        }
    }
    // Escalate.
    for _ in 0..KILL_ROUNDS {
        let (busy, members) = still(exit);
        if !busy {
            break;
        }
        if let Some(cg) = cg {
            cg.kill();
        }
        spawn::signal_all(pid, &members, Signal::SIGKILL);
        if exit.is_none() {
            if let Ok(Ok(e)) = tokio::time::timeout(KILL_WAIT, &mut *exit_rx).await {
                exit = Some(e);
            }
        } else {
            tokio::time::sleep(KILL_POLL).await;
        }
    }
    exit.unwrap_or(Exit::Signal(Signal::SIGKILL as i32))
}
