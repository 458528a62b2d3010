//! Connecting to an agent from the host.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = sandbox_client::connect("unix:///run/sandbox-agent.sock").await?;
//! let info = client.agent().get_info(sandbox_client::proto::GetInfoRequest {}).await?;
//! println!("{}", info.into_inner().hostname);
//! # Ok(()) }
//! ```
//!
//! [`ConnectOptions`] sets the token and timeouts. The channel reconnects by
//! itself (through the same transport, handshake included) when the
//! connection drops.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Uri};

use crate::auth::{BearerInterceptor, Token};

/// How much later than the connector's own bounds tonic's connect timer fires.
const CONNECT_BACKSTOP: Duration = Duration::from_secs(1);
use crate::proto::agent_client::AgentClient;
use crate::proto::exec_client::ExecClient;
use crate::proto::health::health_client::HealthClient;
use crate::proto::servers_client::ServersClient;
use crate::proto::workspace_client::WorkspaceClient;
use crate::transport::{self, DialError, Endpoint, HvsockOptions, UriError};

/// Channel with the bearer token attached to every request.
pub type AuthChannel = InterceptedService<Channel, BearerInterceptor>;

/// Why [`connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Uri(#[from] UriError),
    #[error("cannot reach the agent at {endpoint}: {detail}{hint}")]
    Unreachable {
        endpoint: String,
        detail: String,
        /// What to check, when the cause says (nothing listens there).
        hint: &'static str,
    },
}

/// How to connect: token and timeouts.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub token: Option<Token>,
    /// Bound on establishing one connection (tcp, unix, vsock).
    pub connect_timeout: Duration,
    /// Hybrid-vsock handshake timeout and retry deadline.
    pub hvsock: HvsockOptions,
    /// Bound on every call until the agent's answer begins (a unary
    /// call's answer, a stream's first message headers); past it the call
    /// fails with CANCELLED "Timeout expired" ([`is_timeout`]). `None`: no
    /// bound.
    pub request_timeout: Option<Duration>,
    /// HTTP/2 keepalive: a ping this often, also while idle; a connection
    /// whose peer does not answer one within the same time is closed and
    /// its calls fail. `None`: no pings.
    pub keepalive: Option<Duration>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            token: None,
            connect_timeout: Duration::from_secs(5),
            hvsock: HvsockOptions::default(),
            request_timeout: None,
            keepalive: Some(Duration::from_secs(20)),
        }
    }
}

/// Whether `status` is a call's end by [`ConnectOptions::request_timeout`].
pub fn is_timeout(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Cancelled && status.message() == "Timeout expired"
}

/// Connects with default options and no token.
pub async fn connect(uri: &str) -> Result<Client, ConnectError> {
    ConnectOptions::default().connect(uri).await
}

impl ConnectOptions {
    /// Parses `uri` and connects now, so an unreachable agent is reported
    /// here rather than on the first RPC.
    pub async fn connect(&self, uri: &str) -> Result<Client, ConnectError> {
        let endpoint: Endpoint = uri.parse()?;
        let unreachable = |e: &tonic::transport::Error| ConnectError::Unreachable {
            endpoint: endpoint.to_string(),
            detail: error_chain(e),
            hint: if nobody_listens(e) {
                "; is the agent running? (start one with `sandbox-agent --dev`, or check --agent)"
            } else {
                ""
            },
        };
        // The URI given to tonic only names the HTTP/2 authority; the
        // connector decides where bytes really go.
        // Large flow-control windows: workspace dumps are bulk transfers.
        // The connector bounds itself (`connect_timeout` per attempt, the
        // hybrid-vsock retry deadline); tonic's own timer is only a backstop
        // set later, so the error a person reads is the connector's, which
        // names the endpoint and the cause, never a bare "deadline has
        // elapsed" that wins a race against it under load.
        let backstop = self.connect_timeout.max(self.hvsock.retry_deadline) + CONNECT_BACKSTOP;
        let mut builder = Channel::from_static("http://sandbox-agent")
            .connect_timeout(backstop)
            .initial_stream_window_size(Some(2 << 20))
            .initial_connection_window_size(Some(8 << 20))
            .tcp_nodelay(true);
        if let Some(t) = self.request_timeout {
            builder = builder.timeout(t);
        }
        if let Some(k) = self.keepalive {
            builder = builder
                .http2_keep_alive_interval(k)
                .keep_alive_timeout(k)
                .keep_alive_while_idle(true);
        }
        let target = endpoint.clone();
        let timeout = self.connect_timeout;
        let hv = self.hvsock.clone();
        let connector = tower::service_fn(move |_: Uri| {
            let target = target.clone();
            let hv = hv.clone();
            async move {
                let io = transport::dial(&target, timeout, &hv).await?;
                Ok::<_, DialError>(TokioIo::new(io))
            }
        });
        let channel = builder
            .connect_with_connector(connector)
            .await
            .map_err(|e| unreachable(&e))?;
        Ok(Client {
            channel,
            auth: BearerInterceptor::new(self.token.as_ref()),
            endpoint,
        })
    }
}

/// Whether a connect failed because nothing listens at the endpoint (no
/// socket file, or the connection refused).
fn nobody_listens(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            )
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Renders an error with its sources, `a: b: c`, skipping repeats.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// A connection to one agent, handing out typed clients for each service.
/// Cloning is cheap; all clones share the connection.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    auth: BearerInterceptor,
    endpoint: Endpoint,
}

impl Client {
    /// This connection, with every call naming lease `id`: the agent
    /// refuses the calls once that lease is not current
    /// ([`crate::lease`]).
    pub fn for_lease(&self, id: &str) -> Client {
        Client {
            channel: self.channel.clone(),
            auth: self.auth.with_lease(id),
            endpoint: self.endpoint.clone(),
        }
    }

    pub fn agent(&self) -> AgentClient<AuthChannel> {
        AgentClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    pub fn workspace(&self) -> WorkspaceClient<AuthChannel> {
        WorkspaceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    pub fn servers(&self) -> ServersClient<AuthChannel> {
        ServersClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    /// Script executions (`sandbox.agent.v1.Exec`).
    pub fn exec(&self) -> ExecClient<AuthChannel> {
        ExecClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    /// Standard `grpc.health.v1` client.
    pub fn health(&self) -> HealthClient<AuthChannel> {
        HealthClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    /// Whether the agent as a whole reports `SERVING` (the health check of
    /// service `""`); `false` while it starts or drains.
    pub async fn serving(&self) -> Result<bool, tonic::Status> {
        use crate::proto::health::HealthCheckRequest;
        use crate::proto::health::health_check_response::ServingStatus;
        let r = self.health().check(HealthCheckRequest::default()).await?;
        Ok(r.into_inner().status == ServingStatus::Serving as i32)
    }

    /// The raw channel, for other generated clients (e.g. reflection).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }
}
