//! Every way a request can fail, by cause, and the one place each becomes
//! an HTTP status (as Firecracker maps `VmmActionError`): [`HostError::status`].
//! The body is FastAPI's: `{"detail": "<message>"}`, or for a 422 the list
//! of pydantic-shaped [`ValidationItem`]s.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use crate::fleet::FleetError;
use crate::lease::LeaseError;
use crate::pool::PoolError;
use crate::store::StoreError;
use crate::uploads::UploadError;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No `Authorization: Bearer` header (401).
    #[error("Not authenticated: send Authorization: Bearer <api key>")]
    NoKey,
    /// A key this host does not know (401).
    #[error("Invalid API key")]
    BadKey,
    /// No live sandbox of that id for this caller (404; another owner's
    /// sandbox is answered the same, never 403).
    #[error("Local sandbox {0} not found")]
    SandboxNotFound(String),
    /// The same, asked through Klavis's `/sandbox/{server}` API, in its
    /// words (404): [`in_sandbox_api_words`] makes every
    /// `SandboxNotFound` of those routes one.
    #[error("Sandbox {0} not found")]
    McpSandboxNotFound(String),
    /// A path this API does not serve, e.g. per-server data of a server
    /// without any (404, FastAPI's text).
    #[error("Not Found")]
    NoRoute,
    /// Something named in the request does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The body or query does not fit Klavis's model (422).
    #[error("the request does not fit the API's model")]
    Validation(Vec<ValidationItem>),
    /// A well-formed request this sandbox cannot serve as asked (400).
    #[error("{0}")]
    BadRequest(String),
    /// An MCP URL's token that is not this sandbox's (401).
    #[error(
        "invalid MCP token: use the mcp_server_url of the acquire answer, or send Authorization: Bearer <api key>"
    )]
    BadMcpToken,
    /// A transfer URL that is unsigned, expired or forged (403).
    #[error("{0}")]
    SignedUrl(&'static str),
    /// The owner's cap on live sandboxes (429).
    #[error(
        "this API key already holds {held} sandbox(es){} (limit {limit}, --max-sandboxes-per-key): {}",
        if *cleaning > 0 { format!(" and {cleaning} released one(s) still being cleaned up") } else { String::new() },
        if *cleaning > 0 { "its Acquire waited --agent-release-timeout for them; release one, or retry" } else { "release one first" }
    )]
    TooManySandboxes {
        held: usize,
        cleaning: usize,
        limit: usize,
    },
    /// The upload store's bounds (413, 429) or its disk.
    #[error(transparent)]
    Upload(UploadError),
    /// The pool has no sandbox to give (503).
    #[error("no sandbox available: {0}")]
    NoSandbox(PoolError),
    /// The sandbox's agent is not running any more (503).
    #[error("the sandbox's agent is gone")]
    AgentGone,
    /// The sandbox's agent does not answer (503).
    #[error("{0}")]
    AgentUnreachable(PoolError),
    /// The sandbox's MCP data plane failed mid-request (502).
    #[error("{0}")]
    DataPlane(String),
    /// The agent refused or failed `what`; its gRPC code decides.
    #[error("{what}: {}", status.message())]
    Agent { what: String, status: tonic::Status },
    /// The sandbox's lease ended or was reset while the request was in
    /// flight (409): it was stopped, and nothing of it reached the sandbox
    /// after that.
    #[error(
        "sandbox {0} was released or reset while this request was in flight; the request was stopped and nothing of it reached the sandbox after that"
    )]
    LeaseEnded(String),
    /// The agent answered something this host cannot read (500).
    #[error("{0}")]
    BadAgentAnswer(String),
    /// The host's state (500; 503 when it is the cluster's API server).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The kubernetes backend's fleet: no pool for the benchmark (400);
    /// the pool empty past the wait, a failed claim, the API server
    /// unreachable or forbidding (503).
    #[cfg(feature = "kubernetes")]
    #[error(transparent)]
    Cluster(sandbox_kube::KubeError),
    /// Anything else of the host's own (500).
    #[error("{0}")]
    Internal(String),
}

impl HostError {
    /// The agent's gRPC failure of `what`.
    pub fn agent(what: impl Into<String>) -> impl FnOnce(tonic::Status) -> HostError {
        let what = what.into();
        move |status| {
            // The host's own deadline on the call (`--agent-*-timeout`).
            let status = if sandbox_client::is_timeout(&status) {
                tonic::Status::deadline_exceeded(
                    "the sandbox's agent did not answer in time (the host's --agent-*-timeout)",
                )
            } else {
                status
            };
            HostError::Agent { what, status }
        }
    }

    /// The one mapping from cause to HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            HostError::NoKey | HostError::BadKey | HostError::BadMcpToken => {
                StatusCode::UNAUTHORIZED
            }
            HostError::SandboxNotFound(_)
            | HostError::McpSandboxNotFound(_)
            | HostError::NoRoute
            | HostError::NotFound(_) => StatusCode::NOT_FOUND,
            HostError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            HostError::BadRequest(_) => StatusCode::BAD_REQUEST,
            HostError::SignedUrl(_) => StatusCode::FORBIDDEN,
            HostError::TooManySandboxes { .. } => StatusCode::TOO_MANY_REQUESTS,
            HostError::Upload(e) => upload_status(e),
            HostError::NoSandbox(_) | HostError::AgentGone | HostError::AgentUnreachable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            HostError::DataPlane(_) => StatusCode::BAD_GATEWAY,
            HostError::LeaseEnded(_) => StatusCode::CONFLICT,
            HostError::Agent { status, .. } => agent_status(status.code()),
            #[cfg(feature = "kubernetes")]
            HostError::Cluster(sandbox_kube::KubeError::NoPool { .. }) => StatusCode::BAD_REQUEST,
            #[cfg(feature = "kubernetes")]
            HostError::Cluster(_)
            | HostError::Store(StoreError::Cluster(_) | StoreError::ClaimGone(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            HostError::BadAgentAnswer(_) | HostError::Store(_) | HostError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

fn upload_status(e: &UploadError) -> StatusCode {
    match e {
        UploadError::TooManyExecutions { .. } => StatusCode::TOO_MANY_REQUESTS,
        UploadError::ArchiveTooLarge { .. }
        | UploadError::MultipartTooLarge { .. }
        | UploadError::SandboxFull { .. }
        | UploadError::OwnerFull { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        UploadError::Body(_) => StatusCode::BAD_REQUEST,
        // Made a SandboxNotFound by `From`; kept for completeness.
        UploadError::Released { .. } => StatusCode::NOT_FOUND,
        UploadError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn agent_status(code: tonic::Code) -> StatusCode {
    match code {
        tonic::Code::InvalidArgument
        | tonic::Code::FailedPrecondition
        | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
        tonic::Code::ResourceExhausted => StatusCode::PAYLOAD_TOO_LARGE,
        // The workspace is busy with another transfer: retry later.
        tonic::Code::Aborted => StatusCode::CONFLICT,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        tonic::Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// FastAPI's error body.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = HTTPError)]
pub struct ErrorBody {
    pub detail: String,
}

/// FastAPI's 422 body.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = HTTPValidationError)]
pub struct ValidationBody {
    #[schema(required = false)]
    pub detail: Vec<ValidationItem>,
}

/// One failed check, as pydantic reports it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = ValidationError)]
pub struct ValidationItem {
    /// Where: `["body", "server_names", 0]`.
    pub loc: Vec<Loc>,
    pub msg: String,
    /// pydantic's error type (`missing`, `int_parsing`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// What was found there (any JSON value).
    #[schema(value_type = Value, required = false)]
    pub input: Value,
    /// The constraint that failed, when pydantic names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object, required = false)]
    pub ctx: Option<serde_json::Map<String, Value>>,
}

/// A step of a [`ValidationItem`]'s location: a field or an index.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Loc {
    Field(String),
    Index(usize),
}

/// pydantic's schema of a location step: `anyOf` a string or an integer.
impl utoipa::PartialSchema for Loc {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::{ObjectBuilder, Type, schema::AnyOfBuilder};
        AnyOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::String))
            .item(ObjectBuilder::new().schema_type(Type::Integer))
            .into()
    }
}

impl utoipa::ToSchema for Loc {}

impl From<&str> for Loc {
    fn from(s: &str) -> Loc {
        Loc::Field(s.to_owned())
    }
}

impl From<String> for Loc {
    fn from(s: String) -> Loc {
        Loc::Field(s)
    }
}

impl From<usize> for Loc {
    fn from(i: usize) -> Loc {
        Loc::Index(i)
    }
}

impl From<LeaseError> for HostError {
    fn from(e: LeaseError) -> HostError {
        match e {
            LeaseError::TooManySandboxes {
                held,
                cleaning,
                limit,
            } => HostError::TooManySandboxes {
                held,
                cleaning,
                limit,
            },
            LeaseError::BadRequest(m) => HostError::BadRequest(m),
            LeaseError::SandboxNotFound(id) => HostError::SandboxNotFound(id),
            LeaseError::LeaseEnded(id) => HostError::LeaseEnded(id),
            LeaseError::AgentUnreachable(p) => HostError::AgentUnreachable(p),
            LeaseError::Agent { what, status } => HostError::agent(what)(status),
            LeaseError::BadAgentAnswer(m) => HostError::BadAgentAnswer(m),
            LeaseError::Internal(m) => HostError::Internal(m),
            LeaseError::Fleet(f) => f.into(),
            LeaseError::Store(s) => HostError::Store(s),
        }
    }
}

impl From<FleetError> for HostError {
    fn from(e: FleetError) -> HostError {
        match e {
            FleetError::NoSandbox(p) => HostError::NoSandbox(p),
            FleetError::AgentGone => HostError::AgentGone,
            FleetError::AgentUnreachable(p) => HostError::AgentUnreachable(p),
            FleetError::Agent { what, status } => HostError::agent(what)(status),
            FleetError::OwnerFull { held, limit } => HostError::TooManySandboxes {
                held,
                cleaning: 0,
                limit,
            },
            #[cfg(feature = "kubernetes")]
            FleetError::Cluster(k) => HostError::Cluster(k),
            FleetError::Store(s) => HostError::Store(s),
            FleetError::Internal(m) => HostError::Internal(m),
        }
    }
}

impl From<UploadError> for HostError {
    fn from(e: UploadError) -> HostError {
        match e {
            // Released mid-upload: as if it never was.
            UploadError::Released { id } => HostError::SandboxNotFound(id),
            other => HostError::Upload(other),
        }
    }
}

/// The sandbox a [`HostError::SandboxNotFound`] answer was about, kept
/// on the answer for [`in_sandbox_api_words`].
#[derive(Clone)]
struct MissingSandbox(String);

/// An answer of a `/sandbox/{server}` route: a missing sandbox is said in
/// that API's words ("Sandbox … not found"), whichever shared handler
/// (transfers, per-server data, in-flight requests) found it missing.
pub async fn in_sandbox_api_words(r: Response) -> Response {
    match r.extensions().get::<MissingSandbox>() {
        Some(MissingSandbox(id)) => HostError::McpSandboxNotFound(id.clone()).into_response(),
        None => r,
    }
}

impl IntoResponse for HostError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self, "request failed");
        }
        let missing = match &self {
            HostError::SandboxNotFound(id) => Some(MissingSandbox(id.clone())),
            _ => None,
        };
        let mut r = self.body(status);
        if let Some(m) = missing {
            r.extensions_mut().insert(m);
        }
        r
    }
}

impl HostError {
    /// The answer: FastAPI's body for `status`.
    fn body(self, status: StatusCode) -> Response {
        match self {
            HostError::Validation(detail) => {
                (status, Json(ValidationBody { detail })).into_response()
            }
            other => (
                status,
                Json(ErrorBody {
                    detail: other.to_string(),
                }),
            )
                .into_response(),
        }
    }
}

pub type HostResult<T> = Result<T, HostError>;
