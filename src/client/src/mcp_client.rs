//! A small host-side MCP client for the agent's data plane: JSON-RPC over
//! streamable HTTP on any of the agent's transports. `sandboxctl mcp` and
//! the gateway benchmark use it; applications normally use an MCP SDK.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use crate::auth::Token;
use crate::mcp;

/// Largest answer the client reads (a tool result with embedded files can
/// be large, but not unbounded).
const MAX_ANSWER_BYTES: usize = 256 << 20;
use crate::transport::{Endpoint, HvsockOptions, dial};

#[derive(Debug, thiserror::Error)]
pub enum McpClientError {
    #[error("{0}")]
    Connect(String),
    #[error("HTTP {status}: {body}")]
    Http { status: u16, body: String },
    #[error("the server answered {method} with error {code}: {message}")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
    #[error("{0}")]
    Protocol(String),
}

/// One MCP session with one server of the data plane.
pub struct McpHttpClient {
    send: SendRequest<Full<Bytes>>,
    path: String,
    token: Option<Token>,
    session: Option<String>,
    next_id: u64,
    /// The server's initialize result.
    pub server_info: Value,
}

impl McpHttpClient {
    /// Connects to `endpoint` and initializes a session with `server`.
    pub async fn connect(
        endpoint: &Endpoint,
        server: &str,
        token: Option<Token>,
        timeout: Duration,
    ) -> Result<McpHttpClient, McpClientError> {
        let io = dial(endpoint, timeout, &HvsockOptions::default())
            .await
            .map_err(|e| McpClientError::Connect(e.to_string()))?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| McpClientError::Connect(format!("HTTP handshake with {endpoint}: {e}")))?;
        tokio::spawn(conn);
        let mut c = McpHttpClient {
            send,
            path: format!("/{server}/mcp"),
            token,
            session: None,
            next_id: 1,
            server_info: Value::Null,
        };
        c.server_info = c
            .call(
                "initialize",
                json!({
                    "protocolVersion": mcp::CLIENT_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "sandboxctl", "version": crate::VERSION},
                }),
            )
            .await?;
        c.notify("notifications/initialized").await?;
        Ok(c)
    }

    async fn post(&mut self, msg: &Value) -> Result<(http::StatusCode, Bytes), McpClientError> {
        let mut req = http::Request::post(&self.path)
            .header(http::header::HOST, "localhost")
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream");
        if let Some(s) = &self.session {
            req = req.header(mcp::header::SESSION, s);
        }
        if let Some(t) = &self.token {
            req = req.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", t.expose()),
            );
        }
        let req = req
            .body(Full::new(Bytes::from(msg.to_string())))
            .map_err(|e| McpClientError::Protocol(e.to_string()))?;
        self.send
            .ready()
            .await
            .map_err(|e| McpClientError::Connect(format!("connection to the data plane: {e}")))?;
        let resp = self.send.send_request(req).await.map_err(|e| {
            McpClientError::Connect(format!("POST {}: {}", self.path, crate::error_chain(&e)))
        })?;
        let status = resp.status();
        if let Some(s) = resp
            .headers()
            .get(mcp::header::SESSION)
            .and_then(|v| v.to_str().ok())
        {
            self.session = Some(s.to_owned());
        }
        let sse = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER_BYTES);
        let body = if sse {
            read_sse_answer(body).await?
        } else {
            body.collect()
                .await
                .map_err(|e| McpClientError::Connect(format!("reading the answer: {e}")))?
                .to_bytes()
        };
        if !status.is_success() {
            return Err(McpClientError::Http {
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        Ok((status, body))
    }

    /// Sends a request and returns its `result`.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, McpClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let msg = mcp::request(&json!(id), method, params);
        let (_, body) = self.post(&msg).await?;
        let answer: Value = serde_json::from_slice(&body).map_err(|e| {
            McpClientError::Protocol(format!("the answer to {method} is not JSON: {e}"))
        })?;
        if let Some((code, message)) = mcp::error_of(&answer) {
            return Err(McpClientError::Rpc {
                method: method.to_owned(),
                code,
                message,
            });
        }
        Ok(answer.get("result").cloned().unwrap_or(Value::Null))
    }

    pub async fn notify(&mut self, method: &str) -> Result<(), McpClientError> {
        let msg = mcp::notification(method, None);
        self.post(&msg).await.map(|_| ())
    }
}

/// An SSE answer: the server's messages for the request, then the answer.
/// Returns the last JSON-RPC answer in it.
async fn read_sse_answer(
    body: http_body_util::Limited<hyper::body::Incoming>,
) -> Result<Bytes, McpClientError> {
    use futures_util::StreamExt;
    fn io(e: Box<dyn std::error::Error + Send + Sync>) -> std::io::Error {
        std::io::Error::other(e)
    }
    let mut events = sse_stream::SseStream::new(BodyExt::map_err(body, io));
    let mut answer = Bytes::new();
    while let Some(ev) = events.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => return Err(McpClientError::Connect(format!("reading the answer: {e}"))),
        };
        if let Some(data) = ev.data
            && let Ok(v) = serde_json::from_str::<Value>(&data)
            && v.get("method").is_none()
        {
            answer = Bytes::from(data);
        }
    }
    Ok(answer)
}
