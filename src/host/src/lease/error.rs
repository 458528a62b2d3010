//! Why the lease service refused or failed; `crate::error` maps each to
//! its status.

use crate::fleet::FleetError;
use crate::pool::PoolError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The owner's cap on live sandboxes.
    #[error("this API key already holds {held} sandbox(es) (limit {limit})")]
    TooManySandboxes {
        held: usize,
        cleaning: usize,
        limit: usize,
    },
    /// A request this host's sandboxes cannot serve as asked.
    #[error("{0}")]
    BadRequest(String),
    /// No live sandbox of that id.
    #[error("Local sandbox {0} not found")]
    SandboxNotFound(String),
    /// The sandbox's lease ended or was reset while a request was in
    /// flight.
    #[error("sandbox {0} was released or reset while this request was in flight")]
    LeaseEnded(String),
    /// The sandbox's agent does not answer.
    #[error("{0}")]
    AgentUnreachable(PoolError),
    /// The agent refused or failed `what`.
    #[error("{what}: {}", status.message())]
    Agent { what: String, status: tonic::Status },
    /// The agent answered something this host cannot read.
    #[error("{0}")]
    BadAgentAnswer(String),
    /// Anything else of the host's own.
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Fleet(#[from] FleetError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl LeaseError {
    /// The agent's gRPC failure of `what`.
    pub fn agent(what: impl Into<String>) -> impl FnOnce(tonic::Status) -> LeaseError {
        let what = what.into();
        move |status| LeaseError::Agent { what, status }
    }
}

pub type LeaseResult<T> = Result<T, LeaseError>;
