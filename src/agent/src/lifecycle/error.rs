//! Lifecycle errors, one variant per cause. `rpc::status::lc_status` maps each to
//! one gRPC status code.

use std::path::PathBuf;

use crate::mail::MailError;
use crate::server_data::DataError;
use crate::supervisor::SupError;
use crate::supervisor::manifest::{LaunchError, NotInstalled};
use crate::workspace::WorkspaceError;

/// Longest lease id.
pub const MAX_LEASE_ID_LEN: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum LcError {
    // ---- the request is wrong (INVALID_ARGUMENT)
    #[error("lease_id must be 1-{MAX_LEASE_ID_LEN} characters of A-Z, a-z, 0-9, '.', '_' and '-'")]
    BadLeaseId,
    #[error("name at least one server in server_names, or ask for all")]
    NoServersNamed,
    #[error(
        "the manifest has no servers to acquire (none, or each has in_all = false and must be named)"
    )]
    EmptyManifest,
    #[error(
        "unknown server{} {}; this sandbox's manifest ({}) has: {}",
        if names.len() > 1 { "s" } else { "" },
        names.join(", "),
        manifest.display(),
        known.join(", ")
    )]
    UnknownServers {
        names: Vec<String>,
        manifest: PathBuf,
        known: Vec<String>,
    },
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    NotInstalled(Vec<NotInstalled>),
    #[error(
        "ttl_seconds must be between {min} and {max} (or absent for the default of {default}, or 0 for none); got {got}"
    )]
    TtlOutOfRange {
        got: u32,
        min: u32,
        max: u32,
        default: u32,
    },
    #[error(
        "auth_data/env given for {server:?}, which is not one of the servers acquired ({})",
        acquired.join(", ")
    )]
    CredentialsForOther {
        server: String,
        acquired: Vec<String>,
    },
    // ---- the sandbox is not in the state the request needs (FAILED_PRECONDITION)
    #[error(
        "the sandbox is already leased (lease {lease}, acquired {}); Release it before acquiring again",
        crate::supervisor::when(*acquired_at_ms)
    )]
    AlreadyLeased { lease: String, acquired_at_ms: u64 },
    #[error("the sandbox is idle; there is no lease to reset")]
    NotLeased,
    #[error(
        "the lease cannot be narrowed to what was asked: {why}; release it and acquire instead"
    )]
    NotNarrowable { why: String },
    #[error(
        "benchmark {benchmark} needs its preloaded data at {}, which is not installed here: install it with packaging/install-benchmark-data.sh {benchmark} --from DIR|URL",
        path.display()
    )]
    NoBenchmarkData {
        benchmark: &'static str,
        path: PathBuf,
    },
    #[error(transparent)]
    Launch(#[from] LaunchError),
    // ---- a catalog the host gave is not one (INVALID_ARGUMENT)
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
    /// Every server of the request that lacks credentials, each by name.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    MissingCredentials(Vec<LaunchError>),
    // ---- what the request names does not exist (NOT_FOUND)
    #[error(
        "no lease {asked:?}: {}",
        match current {
            Some(c) => format!("the sandbox is leased as {c:?}"),
            None => "the sandbox is idle".to_owned(),
        }
    )]
    NoSuchLease {
        asked: String,
        current: Option<String>,
    },
    /// A request bound to a lease (`sandbox_client::lease`) arrived, or
    /// finished arriving, after that lease ended. The message never names
    /// the lease that holds the sandbox now.
    #[error(
        "lease {0:?} has ended: this request was admitted under it and is refused; nothing was done"
    )]
    LeaseEnded(String),
    #[error(transparent)]
    Supervisor(#[from] SupError),
    /// A clean-up of Release or Reset failed: the sandbox is not clean and
    /// must not be leased again as it is (its status is `error`).
    #[error("the sandbox could not be cleaned up; it is in error: {}", .failed.join("; "))]
    Cleanup { failed: Vec<String> },
    #[error(
        "server {server:?} is not in the lease ({})",
        if lease.is_empty() { "the sandbox is idle".to_owned() } else { lease.join(", ") }
    )]
    NotInLease { server: String, lease: Vec<String> },
    // ---- the request names something this agent does not do (UNIMPLEMENTED)
    #[error(
        "server {server:?} has no data this sandbox can load or dump: only servers with mail = true or a data_command in the manifest do"
    )]
    NoServerData { server: String },
    // ---- the mail service (mapped by cause)
    #[error(transparent)]
    Mail(#[from] MailError),
    #[error("server {server}: {source}")]
    Data { server: String, source: DataError },
    // ---- servers did not come up (UNAVAILABLE)
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    NotReady(Vec<ReadyError>),
    // ---- the workspace (mapped like the Workspace service's errors)
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    // ---- the machine failed us (INTERNAL)
    #[error("placing seed data {}: {source}", from.display())]
    Seed {
        from: PathBuf,
        source: WorkspaceError,
    },
    #[error("wiping state path {}: {source}", path.display())]
    Wipe {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("making the servers' ids: {0}")]
    NoRandomness(std::io::Error),
    #[error("the {what} task failed: {source}")]
    Task {
        what: &'static str,
        source: tokio::task::JoinError,
    },
}

/// Why one server is not ready.
#[derive(Debug, thiserror::Error)]
pub enum ReadyError {
    #[error("server {name} did not become ready: {why}{}", stderr_tail(tail))]
    Exited {
        name: String,
        why: String,
        tail: String,
    },
    #[error(
        "server {name} was not ready within {} ms (state {state}, {message}){}",
        within.as_millis(),
        stderr_tail(tail)
    )]
    Timeout {
        name: String,
        within: std::time::Duration,
        state: String,
        message: String,
        tail: String,
    },
    #[error(transparent)]
    Unknown(#[from] SupError),
}

fn stderr_tail(t: &str) -> String {
    if t.is_empty() {
        String::new()
    } else {
        format!("; stderr tail:\n{t}")
    }
}
