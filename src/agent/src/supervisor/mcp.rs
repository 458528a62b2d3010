//! The agent's side of a stdio MCP server: JSON-RPC messages, one per line,
//! over the child's stdin and stdout.
//!
//! [`StdioConn`] multiplexes requests: each gets a connection-local numeric
//! id and its response is routed back by that id. Messages from the server
//! that are not responses to the agent's own requests (notifications, and
//! requests such as `roots/list`) go to subscribers ([`StdioConn::subscribe`]);
//! with none, a server request gets a JSON-RPC error at once so the server
//! never waits for an answer nobody will send. Lines that are not JSON go to
//! the server's log. A message longer than the limit is dropped and logged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use sandbox_client::mcp;

use super::logbuf::{LogBuf, Stream};

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("the server closed its stdout (it exited or crashed)")]
    Closed,
    #[error("no answer to {method} within {0:?}", method = .1)]
    Timeout(Duration, String),
    #[error("the server answered {method} with error {code}: {message}")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
    #[error("the server's answer to {0} is not valid: {1}")]
    Protocol(String, String),
}

pub struct StdioConn {
    out: mpsc::Sender<Bytes>,
    /// Each waiting request's answer, with how many events were broadcast
    /// before it ([`StdioConn::request_seq`]).
    pending: Mutex<HashMap<u64, oneshot::Sender<(Value, u64)>>>,
    next_id: AtomicU64,
    /// The server's other messages, numbered from 1 in the order read.
    events: broadcast::Sender<(u64, Arc<Value>)>,
    /// The number of the last event broadcast (written by the reader only).
    sent: AtomicU64,
    closed: CancellationToken,
    init: OnceLock<Value>,
}

impl StdioConn {
    /// Starts the reader and writer tasks over the child's pipes.
    pub fn start(
        stdin: std::os::fd::OwnedFd,
        stdout: std::os::fd::OwnedFd,
        log: Arc<LogBuf>,
        max_message_bytes: usize,
    ) -> std::io::Result<Arc<StdioConn>> {
        let mut writer = pipe::Sender::from_owned_fd(stdin)?;
        let reader = pipe::Receiver::from_owned_fd(stdout)?;
        let (out, mut out_rx) = mpsc::channel::<Bytes>(64);
        let conn = Arc::new(StdioConn {
            out,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            events: broadcast::channel(256).0,
            sent: AtomicU64::new(0),
            closed: CancellationToken::new(),
            init: OnceLock::new(),
        });
        let closed = conn.closed.clone();
        tokio::spawn(async move {
            // One write per message, newline included: a reader woken by
            // half a line only goes back to sleep.
            let mut buf = Vec::new();
            while let Some(line) = out_rx.recv().await {
                buf.clear();
                buf.extend_from_slice(&line);
                buf.push(b'\n');
                if writer.write_all(&buf).await.is_err() {
                    break;
                }
            }
            closed.cancel();
        });
        let c = conn.clone();
        tokio::spawn(async move {
            c.read_loop(BufReader::new(reader), log, max_message_bytes)
                .await;
            c.closed.cancel();
            // Fail every request still waiting: dropping the senders wakes
            // them with Closed.
            c.pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
        });
        Ok(conn)
    }

    async fn read_loop(&self, mut r: BufReader<pipe::Receiver>, log: Arc<LogBuf>, max: usize) {
        let mut line = Vec::new();
        loop {
            line.clear();
            // Read one line, refusing to hold more than `max` bytes of it.
            let mut overflow = false;
            loop {
                let buf = match r.fill_buf().await {
                    Ok(b) => b,
                    Err(_) => return,
                };
                if buf.is_empty() {
                    return;
                }
                let (chunk, done) = match buf.iter().position(|b| *b == b'\n') {
                    Some(i) => (&buf[..i], i + 1),
                    None => (buf, buf.len()),
                };
                let found_newline = chunk.len() < done;
                if !overflow && line.len() + chunk.len() <= max {
                    line.extend_from_slice(chunk);
                } else {
                    overflow = true;
                }
                r.consume(done);
                if found_newline {
                    break;
                }
            }
            if overflow {
                log.push(
                    Stream::Stdout,
                    format!("sandbox-agent: dropped a stdout message longer than {max} bytes")
                        .as_bytes(),
                    false,
                );
                continue;
            }
            let text = line.strip_suffix(b"\r").unwrap_or(&line);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Value>(text) {
                Ok(msg) if msg.is_object() => self.dispatch(msg).await,
                _ => log.push(Stream::Stdout, text, false),
            }
        }
    }

    async fn dispatch(&self, msg: Value) {
        let is_response = msg.get("method").is_none()
            && (msg.get("result").is_some() || msg.get("error").is_some());
        if is_response && let Some(id) = msg.get("id").and_then(Value::as_u64) {
            let waiter = self
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            if let Some(tx) = waiter {
                let _ = tx.send((msg, self.sent.load(Ordering::Acquire)));
                return;
            }
        }
        let is_request = msg.get("method").is_some() && msg.get("id").is_some();
        if self.events.receiver_count() == 0 {
            if is_request {
                let id = msg.get("id").cloned().unwrap_or(Value::Null);
                let reply = mcp::error(
                    &id,
                    mcp::code::METHOD_NOT_FOUND,
                    "no MCP client session is connected to answer this request",
                );
                self.send_raw(&reply).await;
            }
            return;
        }
        let seq = self.sent.load(Ordering::Acquire) + 1;
        self.sent.store(seq, Ordering::Release);
        let _ = self.events.send((seq, Arc::new(msg)));
    }

    /// Messages from the server that are not answers to this connection's
    /// own requests, each with its number, and the number of the last one
    /// broadcast before the subscription (read after it: at worst one
    /// counted before it is received).
    pub fn subscribe(&self) -> (broadcast::Receiver<(u64, Arc<Value>)>, u64) {
        let rx = self.events.subscribe();
        (rx, self.sent.load(Ordering::Acquire))
    }

    /// Cancelled when either pipe closes.
    pub fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// The server's `initialize` result, once the handshake succeeded.
    pub fn init_result(&self) -> Option<&Value> {
        self.init.get()
    }

    async fn send_raw(&self, msg: &Value) -> bool {
        match serde_json::to_vec(msg) {
            Ok(v) => self.out.send(Bytes::from(v)).await.is_ok(),
            Err(_) => false,
        }
    }

    /// Writes one message as it is (an answer to a server request, or a
    /// notification the caller built).
    pub async fn send_message(&self, msg: &Value) -> Result<(), McpError> {
        if self.send_raw(msg).await {
            Ok(())
        } else {
            Err(McpError::Closed)
        }
    }

    /// Like [`StdioConn::send_message`] without waiting: for drop paths.
    /// Returns false when the message could not be queued.
    pub fn try_send_message(&self, msg: &Value) -> bool {
        match serde_json::to_vec(msg) {
            Ok(v) => self.out.try_send(Bytes::from(v)).is_ok(),
            Err(_) => false,
        }
    }

    /// Reserves the id of a request to send with
    /// [`StdioConn::request_with_id`], so the caller can refer to it (for a
    /// cancellation, or as a progress token) before the answer comes.
    pub fn alloc_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a request and waits for its response message (which may carry
    /// a JSON-RPC error; see [`StdioConn::call`]).
    pub async fn request(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, McpError> {
        self.request_with_id(self.alloc_id(), method, params, timeout)
            .await
    }

    /// [`StdioConn::request`] under an id from [`StdioConn::alloc_id`].
    pub async fn request_with_id(
        &self,
        id: u64,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, McpError> {
        self.request_seq(id, method, params, timeout)
            .await
            .map(|(answer, _)| answer)
    }

    /// [`StdioConn::request_with_id`], with the number of the last event
    /// the server sent before its answer ([`StdioConn::subscribe`]): what
    /// a router must have passed on before the answer, to keep the
    /// server's order (progress, then the result).
    pub async fn request_seq(
        &self,
        id: u64,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<(Value, u64), McpError> {
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        let msg = mcp::request(&json!(id), method, params);
        let result = async {
            if self.closed.is_cancelled() || !self.send_raw(&msg).await {
                return Err(McpError::Closed);
            }
            tokio::select! {
                r = rx => r.map_err(|_| McpError::Closed),
                _ = self.closed.cancelled() => Err(McpError::Closed),
            }
        };
        let r = tokio::time::timeout(timeout, result)
            .await
            .unwrap_or_else(|_| Err(McpError::Timeout(timeout, method.to_owned())));
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        r
    }

    /// A request whose JSON-RPC error becomes [`McpError::Rpc`]; returns
    /// the `result`.
    pub async fn call(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, McpError> {
        let mut msg = self.request(method, params, timeout).await?;
        if let Some((code, message)) = mcp::error_of(&msg) {
            return Err(McpError::Rpc {
                method: method.to_owned(),
                code,
                message,
            });
        }
        Ok(msg
            .get_mut("result")
            .map(Value::take)
            .unwrap_or(Value::Null))
    }

    pub async fn notify(&self, method: &str, params: Value) -> Result<(), McpError> {
        let msg = mcp::notification(method, Some(params));
        if self.send_raw(&msg).await {
            Ok(())
        } else {
            Err(McpError::Closed)
        }
    }

    /// The MCP handshake: `initialize`, then `notifications/initialized`.
    /// This is the readiness check of a stdio server.
    pub async fn handshake(&self, timeout: Duration) -> Result<&Value, McpError> {
        let params = json!({
            "protocolVersion": mcp::CLIENT_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "sandbox-agent", "version": sandbox_client::VERSION},
        });
        let result = self.call("initialize", params, timeout).await?;
        if result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(McpError::Protocol(
                "initialize".into(),
                "the result has no protocolVersion".into(),
            ));
        }
        self.notify("notifications/initialized", json!({})).await?;
        Ok(self.init.get_or_init(|| result))
    }
}
