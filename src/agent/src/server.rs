//! Runs the control plane: binds every listener, serves the gRPC services on
//! each with that listener's auth policy, reports health, and drains on
//! shutdown within the configured grace period.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic::transport::Server;
use tonic_health::ServingStatus;
use tracing::{Instrument, error, info, warn};

use super::config::Settings;
use super::{info as sysinfo, rpc};
use crate::agent_token::AgentToken;
use crate::exec::{Executions, McpAccess};
use crate::lifecycle::Lifecycle;
use crate::supervisor::{State, Supervisor};
use crate::workspace::Workspace;
use sandbox_client::proto;
use sandbox_client::transport::Endpoint;
use sandbox_serve::auth::{AuthLayer, AuthPolicy};
use sandbox_serve::listen::{ListenError, Listener};

/// Health service name of a server: `mcp/<name>`, SERVING while ready.
pub fn server_health_name(name: &str) -> String {
    format!("mcp/{name}")
}

/// Mirrors every server's readiness into grpc.health.v1.
async fn publish_server_health(sup: &Supervisor, health: &tonic_health::server::HealthReporter) {
    for name in sup.names() {
        let Ok(mut rx) = sup.watch(&name) else {
            continue;
        };
        let health = health.clone();
        let service = server_health_name(&name);
        health
            .set_service_status(&service, ServingStatus::NotServing)
            .await;
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let ready = rx.borrow_and_update().state == State::Ready;
                if last != Some(ready) {
                    let st = if ready {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    health.set_service_status(&service, st).await;
                    last = Some(ready);
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }
}

/// Why the agent could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Listen(#[from] ListenError),
    #[error("cannot create workspace directory {path}: {source}")]
    Workspace {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("building the reflection service: {0}")]
    Reflection(String),
    #[error("opening the workspace: {0}")]
    Open(String),
    #[error(transparent)]
    DataPath(#[from] crate::workspace::data_path::DataPathError),
    #[error("starting the supervisor: {0}")]
    Supervisor(std::io::Error),
    #[error(
        "the tenant (uid {uid}) cannot reach {what} {path}: {blocked} does not let other users pass through; move it, `chmod o+x {blocked}`, or set supervisor.tenant_user = \"none\" (development only)"
    )]
    Unreachable {
        uid: u32,
        what: &'static str,
        path: String,
        blocked: String,
    },
}

/// Listeners bound and ready to serve.
pub struct Bound {
    listeners: Vec<Listener>,
    mcp_listeners: Vec<Listener>,
    /// The scripts' loopback MCP listener (exec.mcp_listen).
    exec_mcp: Option<Listener>,
    workspace: Arc<Workspace>,
}

impl Bound {
    /// The endpoints actually bound (real ports for `tcp://…:0`).
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.listeners
            .iter()
            .chain(&self.mcp_listeners)
            .map(|l| l.local_endpoint().clone())
            .collect()
    }
}

/// Prepares the workspace directory and binds every listener. Nothing is
/// served yet; on error, listeners already bound are closed again (and
/// their socket files removed).
pub async fn bind(settings: &Settings) -> Result<Bound, ServeError> {
    std::fs::create_dir_all(&settings.workspace).map_err(|source| ServeError::Workspace {
        path: settings.workspace.display().to_string(),
        source,
    })?;
    // A mounted workspace: the agent's state must not show in its tree.
    // Only as PID 1 (a VM's init, an isolated slot), whose mounts are its
    // own: an agent in a machine's namespace never mounts over its paths.
    let ws = settings.workspace.clone();
    let real = tokio::task::spawn_blocking(move || {
        if !crate::init::is_pid1() {
            return Ok(ws);
        }
        crate::workspace::volume::separate(&ws, Path::new(crate::workspace::volume::VOLUME_DIR))
    })
    .await
    .map_err(|e| ServeError::Open(e.to_string()))?
    .map_err(|e| ServeError::Open(e.to_string()))?;
    if real != settings.workspace {
        info!(volume = %real.display(), "the workspace's bookkeeping is kept outside its tree");
    }
    // Tenants work in the workspace: its root is theirs, and so is every
    // entry extracted into it (archive.owner defaults to the root's owner).
    let tenant = crate::tenant::parse(&settings.supervisor.tenant_user)
        .map_err(|e| ServeError::Open(e.to_string()))?;
    if let Some((uid, gid)) = tenant {
        std::os::unix::fs::chown(&settings.workspace, Some(uid), Some(gid)).map_err(|source| {
            ServeError::Workspace {
                path: settings.workspace.display().to_string(),
                source,
            }
        })?;
        for (what, path) in [
            ("the workspace", &settings.workspace),
            ("the state root", &settings.effective.state_root),
            ("exec.root", &settings.exec.root),
        ] {
            if let Some(blocked) = crate::tenant::unreachable(path) {
                return Err(ServeError::Unreachable {
                    uid,
                    what,
                    path: path.display().to_string(),
                    blocked: blocked.display().to_string(),
                });
            }
        }
    }
    if let Some((data, link)) = &settings.data_path {
        crate::workspace::data_path::show_at(&settings.workspace, data, *link)?;
        info!(data_path = %data.display(), ?link, "the workspace is also at data_path");
    }
    let (path, limits) = (real, settings.archive.clone());
    let workspace = tokio::task::spawn_blocking(move || Workspace::open(&path, limits))
        .await
        .map_err(|e| ServeError::Open(e.to_string()))?
        .map_err(|e| ServeError::Open(e.to_string()))?;
    let mut listeners = Vec::with_capacity(settings.listen.len());
    for ep in &settings.listen {
        listeners.push(Listener::bind(ep).await?);
    }
    let mcp_listeners = crate::gateway::bind(&settings.mcp_listen).await?;
    // Optional: without it scripts only lack the MCP variables, so a
    // failure (no loopback interface) is a warning, not a refusal to start.
    let exec_mcp = match &settings.exec_mcp_listen {
        Some(ep) => match Listener::bind(ep).await {
            Ok(l) => Some(l),
            Err(e) => {
                warn!(endpoint = %ep, error = %e, "cannot bind exec.mcp_listen; scripts will get no SANDBOX_MCP_* variables");
                None
            }
        },
        None => None,
    };
    Ok(Bound {
        listeners,
        mcp_listeners,
        exec_mcp,
        workspace: Arc::new(workspace),
    })
}

/// Serves until `shutdown` is cancelled, then stops accepting, marks health
/// NOT_SERVING, and waits up to the grace period for RPCs in flight.
pub async fn serve(
    settings: Settings,
    bound: Bound,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let span = tracing::info_span!("agent", sandbox = %settings.name);
    serve_inner(settings, bound, shutdown)
        .instrument(span)
        .await
}

async fn serve_inner(
    settings: Settings,
    bound: Bound,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in proto::SERVICE_NAMES {
        health
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    let d = Domain::start(&settings, &bound.workspace)?;
    publish_server_health(&d.supervisor, &health).await;
    let routes = routes(
        &settings,
        health_service,
        bound.workspace.clone(),
        &d,
        shutdown.clone(),
    )?;
    let mut servers = JoinSet::new();
    let accept_tasks = serve_control_plane(
        &settings,
        &d.token,
        bound.listeners,
        &routes,
        &shutdown,
        &mut servers,
    );
    let gateway = crate::gateway::Gateway::new(
        d.lifecycle.clone(),
        d.supervisor.clone(),
        d.manifest,
        settings.gateway.clone(),
    );
    for listener in bound.mcp_listeners {
        let policy = listener_policy(&settings, &d.token, listener.local_endpoint());
        servers.spawn(
            gateway
                .clone()
                .serve(listener, policy, shutdown.clone())
                .in_current_span(),
        );
    }
    if let Some(listener) = bound.exec_mcp {
        let policy = scripts_policy(&d.executions, listener.local_endpoint());
        servers.spawn(
            gateway
                .clone()
                .serve(listener, policy, shutdown.clone())
                .in_current_span(),
        );
    }
    info!(version = sandbox_client::VERSION, workspace = %settings.workspace.display(), "serving");
    tokio::spawn(
        watch_state_root(
            watched_dirs(&settings),
            Duration::from_millis(settings.limits.state_root_check_ms),
            shutdown.clone(),
        )
        .in_current_span(),
    );

    shutdown.cancelled().await;
    drain(&settings, &health, &d.lifecycle, servers, accept_tasks).await;
    info!("stopped");
    Ok(())
}

/// The domain the services share: the supervisor, the executions and the
/// lifecycle over them, and the agent's token (one for every listener that
/// checks it, so a BindToken reaches them all).
struct Domain {
    supervisor: Arc<Supervisor>,
    manifest: Arc<crate::supervisor::manifest::Manifest>,
    executions: Arc<Executions>,
    lifecycle: Arc<Lifecycle>,
    token: AgentToken,
}

impl Domain {
    fn start(settings: &Settings, workspace: &Arc<Workspace>) -> Result<Domain, ServeError> {
        let supervisor = Arc::new(
            Supervisor::new(
                &settings.manifest,
                settings.supervisor.clone(),
                &settings.effective.state_root,
            )
            .map_err(ServeError::Supervisor)?,
        );
        let manifest = Arc::new(settings.manifest.clone());
        let executions = Executions::new(
            settings.exec.clone(),
            supervisor.clone(),
            settings.workspace.clone(),
            settings.effective.state_root.join("exec-base-venv"),
        );
        let lifecycle = Lifecycle::new(
            manifest.clone(),
            supervisor.clone(),
            workspace.clone(),
            executions.clone(),
            settings.lifecycle.clone(),
            settings.effective.state_root.join("server-data"),
        );
        Ok(Domain {
            supervisor,
            manifest,
            executions,
            lifecycle,
            token: AgentToken::new(settings.token.clone()),
        })
    }
}

/// A listener's policy: the agent's token (as bound), required always over
/// TCP, on local sockets when `require_token_on_local`.
fn listener_policy(settings: &Settings, token: &AgentToken, endpoint: &Endpoint) -> AuthPolicy {
    token.policy(matches!(endpoint, Endpoint::Tcp { .. }) || settings.require_token_on_local)
}

/// Serves the gRPC services on each control-plane listener; returns the
/// accept loops.
fn serve_control_plane(
    settings: &Settings,
    token: &AgentToken,
    listeners: Vec<Listener>,
    routes: &Routes,
    shutdown: &CancellationToken,
    servers: &mut JoinSet<()>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let limits = &settings.limits;
    let mut accept_tasks = Vec::new();
    for listener in listeners {
        let endpoint = listener.local_endpoint().clone();
        let policy = listener_policy(settings, token, &endpoint);
        info!(%endpoint, token_required = policy.required, "listening");
        let keepalive = Duration::from_millis(limits.keepalive_interval_ms);
        let server = Server::builder()
            .max_concurrent_streams(limits.max_concurrent_streams)
            .http2_keepalive_interval(Some(keepalive))
            .http2_keepalive_timeout(Some(keepalive))
            .initial_stream_window_size(Some(limits.stream_window_bytes))
            .initial_connection_window_size(Some(limits.connection_window_bytes))
            .layer(AuthLayer::new(policy));
        let (incoming, accept_task) = listener.incoming_within(
            limits.max_connections_per_listener,
            Some(Duration::from_millis(limits.handshake_timeout_ms)),
        );
        accept_tasks.push(accept_task);
        let stop = shutdown.clone().cancelled_owned();
        let routes = routes.clone();
        servers.spawn(
            async move {
                if let Err(e) = server
                    .serve_with_incoming_shutdown(routes, incoming, stop)
                    .await
                {
                    error!(%endpoint, error = %sandbox_client::error_chain(&e), "listener failed");
                }
            }
            .in_current_span(),
        );
    }
    accept_tasks
}

/// The scripts' listener policy. Scripts get their own token for it: it is
/// in their environment, opens nothing but the data plane, and lives as
/// long as the lease (made at Acquire, Narrow and Reset, revoked at
/// Release: Executions::open/close). A TCP listener's URL goes into their
/// environment too.
fn scripts_policy(executions: &Executions, endpoint: &Endpoint) -> AuthPolicy {
    if let Endpoint::Tcp { host, port } = endpoint {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        executions.set_mcp_access(McpAccess {
            base_url: format!("http://{host}:{port}"),
        });
    }
    AuthPolicy {
        token: None,
        required: true,
        lease: Some(executions.lease_token()),
    }
}

/// The stop: NOT_SERVING, the servers stopped, then the RPCs in flight get
/// `shutdown_grace_ms` to finish before their connections close.
async fn drain(
    settings: &Settings,
    health: &tonic_health::server::HealthReporter,
    lifecycle: &Lifecycle,
    mut servers: JoinSet<()>,
    accept_tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    let grace_ms = settings.limits.shutdown_grace_ms;
    info!(grace_ms, "shutting down: draining RPCs in flight");
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    // Servers go first: they hold no client state the drain could save,
    // and nothing they started may outlive the agent.
    lifecycle.shutdown().await;
    for name in proto::SERVICE_NAMES {
        health
            .set_service_status(name, ServingStatus::NotServing)
            .await;
    }
    let drained = tokio::time::timeout(settings.shutdown_grace(), async {
        while servers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            grace_ms,
            "grace period over with RPCs still in flight; closing their connections"
        );
        servers.shutdown().await;
    }
    // The accept loops end once their streams are dropped; wait for them so
    // unix socket files are removed before the process exits.
    for t in accept_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
    }
}

fn routes(
    settings: &Settings,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    workspace: Arc<Workspace>,
    d: &Domain,
    shutdown: CancellationToken,
) -> Result<Routes, ServeError> {
    let (lifecycle, executions) = (d.lifecycle.clone(), d.executions.clone());
    let max = settings.limits.max_message_bytes;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection()
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let reflection_v1alpha = reflection()
        .build_v1alpha()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let info = Arc::new(sysinfo::Collector::new(&settings.workspace));

    // LoadData and DumpData carry a server's data in one message.
    let data_bytes = settings
        .manifest
        .mail
        .as_ref()
        .map_or(0, |m| m.max_data_bytes)
        .max(settings.lifecycle.server_data_max_bytes)
        .max(settings.lifecycle.catalog.max_bytes as u64);
    let data_max = max.max(usize::try_from(data_bytes).unwrap_or(usize::MAX) + (64 << 10));
    let mut b = Routes::builder();
    b.add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            proto::agent_server::AgentServer::new(rpc::AgentService::new(
                info,
                lifecycle.clone(),
                d.token.clone(),
                shutdown,
            ))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
        )
        .add_service(
            proto::workspace_server::WorkspaceServer::new(rpc::WorkspaceService::new(
                workspace,
                lifecycle.clone(),
            ))
            .max_decoding_message_size(max)
            .max_encoding_message_size(max),
        )
        .add_service(
            proto::servers_server::ServersServer::new(rpc::ServersService::new(lifecycle))
                .max_decoding_message_size(data_max)
                .max_encoding_message_size(data_max),
        )
        .add_service(
            proto::exec_server::ExecServer::new(rpc::ExecService::new(executions))
                .max_decoding_message_size(max)
                .max_encoding_message_size(max),
        );
    Ok(b.routes())
}

/// The directories whose deletion means no host can reach or end this
/// agent: its state root, and, when the control plane listens on unix
/// sockets only, their directories (a slot's `run/`, in the host's data
/// dir even when the state root is on the slot's own file system).
fn watched_dirs(settings: &Settings) -> Vec<std::path::PathBuf> {
    let mut dirs = vec![settings.effective.state_root.clone()];
    let unix: Vec<&std::path::Path> = settings
        .listen
        .iter()
        .filter_map(|e| match e {
            Endpoint::Unix(p) => Some(p.as_path()),
            _ => None,
        })
        .collect();
    if unix.len() == settings.listen.len() {
        for p in unix {
            let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
            dirs.push(dir.unwrap_or(std::path::Path::new(".")).to_owned());
        }
    }
    dirs
}

/// Shuts the agent down once one of `dirs` is deleted: the host removed
/// the slot's directory (or its whole data dir), so no host can reach or
/// end this agent any more, and it would hold its servers, memory and id
/// block until the machine stops.
async fn watch_state_root(
    dirs: Vec<std::path::PathBuf>,
    every: Duration,
    shutdown: CancellationToken,
) {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut fds = Vec::new();
    for path in dirs {
        match rustix::fs::open(&path, flags, Mode::empty()) {
            Ok(fd) => fds.push((path, fd)),
            Err(e) => warn!(path = %path.display(), error = %e, "cannot watch the state root"),
        }
    }
    if fds.is_empty() {
        return;
    }
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        for (path, fd) in &fds {
            if rustix::fs::fstat(fd).is_ok_and(|st| st.st_nlink == 0) {
                warn!(path = %path.display(), "the agent's directory was deleted (the slot's directory is gone): shutting down");
                shutdown.cancel();
                return;
            }
        }
    }
}
