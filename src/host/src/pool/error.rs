//! Why the pool could not give or start a sandbox. The API answers every
//! one of these 503 (see `crate::error`): the request was fine, the host
//! has no sandbox for it now.

use super::isolate::IsolationError;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A shutdown began: nothing starts any more.
    #[error("the host is stopping")]
    Stopping,
    #[error("every one of the {0} sandboxes this host may run (--max-slots) is in use")]
    Full(usize),
    /// A file or process of the slot could not be made.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The isolated backend could not set the slot up.
    #[error(transparent)]
    Isolation(#[from] IsolationError),
    /// The slot's setup failed; `log` is the end of its agent's log.
    #[error("{error}: {log}")]
    Setup { error: Box<PoolError>, log: String },
    /// The agent or VM died, or did not serve within the start deadline
    /// (`--slot-start-timeout`).
    #[error("the {backend} sandbox did not start serving ({why}); its log ends: {log}")]
    NotServing {
        backend: &'static str,
        /// What the last probe met (the agent gone, the deadline passed,
        /// the connect's error).
        why: String,
        log: String,
        /// Its process had exited (rather than stayed up, mute): the start
        /// is tried again (`super::start`).
        exited: bool,
    },
    /// The slot's agent does not answer.
    #[error("agent of slot {slot}: {source}")]
    Connect {
        slot: String,
        #[source]
        source: sandbox_client::ConnectError,
    },
    /// The agent refused a warm pre-acquire.
    #[error("pre-acquiring the warm servers: {0}")]
    Warm(String),
    /// The agent refused to record or take discovery catalogs (logged
    /// only: discovery then starts the servers).
    #[error("discovery catalogs: {0}")]
    Catalogs(String),
    /// `run-qemu.sh --probe-accel` failed.
    #[error("{0}")]
    Probe(String),
}

impl PoolError {
    /// An I/O failure with what was being done.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PoolError {
        let context = context.into();
        move |source| PoolError::Io { context, source }
    }
}

impl From<nix::errno::Errno> for PoolError {
    fn from(e: nix::errno::Errno) -> PoolError {
        PoolError::Io {
            context: "a system call".into(),
            source: e.into(),
        }
    }
}
