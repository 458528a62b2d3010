//! A minimal streamable-HTTP MCP client that sends what the benchmarks'
//! official Python client (`mcp` 1.x: `streamablehttp_client` and
//! `ClientSession`) sends, with no client overhead in the figures: one
//! keep-alive connection per session; `initialize`, then
//! `notifications/initialized`, then requests with `Mcp-Session-Id` and
//! `MCP-Protocol-Version` (the negotiated revision); `DELETE` at the end.
//! Every POST carries `Accept: application/json, text/event-stream` and
//! `Content-Type: application/json`; an answer may be JSON or SSE.
//! (The Python client also opens a GET SSE stream after `initialized`;
//! it carries nothing here and is not replayed.)
//!
//! Every exchange is bounded by the session's `within`: running out is an
//! `Err` (the caller counts the task as not done); any other failure (a
//! status, a JSON-RPC error, a tool's `isError`) panics with the answer.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use serde_json::{Value, json};

/// The revision the Python SDK 1.x asks for.
pub const PROTOCOL: &str = "2025-06-18";
const ACCEPT: &str = "application/json, text/event-stream";

/// `Err` only when an exchange ran out of time.
pub type Timed<T> = Result<T, String>;

/// Runs `f` within `d`, or says which step ran out of time.
pub async fn within<T>(d: Duration, what: &str, f: impl Future<Output = T>) -> Timed<T> {
    tokio::time::timeout(d, f)
        .await
        .map_err(|_| format!("{what}: no answer within {} s", d.as_secs()))
}

pub struct Session {
    url: String,
    authority: String,
    path: String,
    conn: Option<SendRequest<Full<Bytes>>>,
    sid: Option<String>,
    version: Option<String>,
    next_id: u64,
    within: Duration,
}

impl Session {
    /// A session on `url`; nothing is sent until [`Session::initialize`].
    pub fn new(url: &str, within: Duration) -> Session {
        let uri: http::Uri = url.parse().expect("MCP URL");
        Session {
            url: url.to_owned(),
            authority: uri.authority().expect("authority").to_string(),
            path: uri
                .path_and_query()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_else(|| "/".into()),
            conn: None,
            sid: None,
            version: None,
            next_id: 0,
            within,
        }
    }

    /// `initialize` and `notifications/initialized`: the handshake.
    pub async fn initialize(&mut self) -> Timed<()> {
        let result = self
            .request(
                "initialize",
                Some(json!({
                    "protocolVersion": PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "mcp", "version": "0.1.0"},
                })),
            )
            .await?;
        self.version = Some(
            result["protocolVersion"]
                .as_str()
                .unwrap_or(PROTOCOL)
                .to_owned(),
        );
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let (status, _, body) = self.send("POST", Some(&note)).await?;
        self.check(status == 202 || status == 200, "initialized", status, &body);
        Ok(())
    }

    /// One page of `tools/list` (what `ClientSession.list_tools()` asks).
    pub async fn list_tools(&mut self) -> Timed<Value> {
        let r = self.request("tools/list", None).await?;
        assert!(r["tools"].is_array(), "{}: tools/list: {r}", self.url);
        Ok(r)
    }

    /// `tools/call`; a tool error (`isError`) panics with its answer.
    pub async fn call(&mut self, tool: &str, args: &Value) -> Timed<Value> {
        let params = json!({"name": tool, "arguments": args});
        let r = self.request("tools/call", Some(params)).await?;
        assert!(
            r["isError"] != true,
            "{}: tools/call {tool} {args}: the tool failed: {r}",
            self.url
        );
        Ok(r)
    }

    /// `DELETE` of the session (405, a server that keeps sessions, is fine).
    pub async fn close(mut self) -> Timed<()> {
        if self.sid.is_none() {
            return Ok(());
        }
        let (status, _, body) = self.send("DELETE", None).await?;
        self.check(status < 300 || status == 405, "DELETE", status, &body);
        Ok(())
    }

    /// A request; its `result`, or a panic with the error answer.
    async fn request(&mut self, method: &str, params: Option<Value>) -> Timed<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(p) = params {
            msg["params"] = p;
        }
        let (status, sid, body) = self.send("POST", Some(&msg)).await?;
        self.check(status == 200, method, status, &body);
        if method == "initialize" {
            self.sid = sid;
        }
        let answer = answer_of(&body, id).unwrap_or_else(|| {
            panic!(
                "{}: {method}: no answer with id {id} in {}",
                self.url,
                String::from_utf8_lossy(&body)
            )
        });
        match answer.get("result") {
            Some(r) => Ok(r.clone()),
            None => panic!("{}: {method}: {answer}", self.url),
        }
    }

    fn check(&self, ok: bool, what: &str, status: u16, body: &[u8]) {
        assert!(
            ok,
            "{}: {what}: HTTP {status}: {}",
            self.url,
            String::from_utf8_lossy(body)
        );
    }

    /// One HTTP exchange on the session's connection (opened, or opened
    /// again, when needed): status, `Mcp-Session-Id`, the whole body.
    async fn send(
        &mut self,
        method: &str,
        msg: Option<&Value>,
    ) -> Timed<(u16, Option<String>, Bytes)> {
        let what = format!("{method} {}", self.url);
        within(self.within, &what, self.exchange(method, msg)).await
    }

    async fn exchange(
        &mut self,
        method: &str,
        msg: Option<&Value>,
    ) -> (u16, Option<String>, Bytes) {
        let url = self.url.clone();
        let mut req = http::Request::builder()
            .method(method)
            .uri(self.path.as_str())
            .header("host", self.authority.as_str())
            .header("accept", ACCEPT);
        if msg.is_some() {
            req = req.header("content-type", "application/json");
        }
        if let Some(sid) = &self.sid {
            req = req.header("mcp-session-id", sid.as_str());
        }
        if let Some(v) = &self.version {
            req = req.header("mcp-protocol-version", v.as_str());
        }
        let body = msg.map(|m| Bytes::from(m.to_string())).unwrap_or_default();
        let req = req.body(Full::new(body)).expect("request");
        let conn = self.connection().await;
        let resp = conn
            .send_request(req)
            .await
            .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = resp.status().as_u16();
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp
            .into_body()
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{method} {url}: body: {e}"))
            .to_bytes();
        (status, sid, body)
    }

    async fn connection(&mut self) -> &mut SendRequest<Full<Bytes>> {
        let alive = match self.conn.as_mut() {
            Some(c) => c.ready().await.is_ok(),
            None => false,
        };
        if !alive {
            let tcp = tokio::net::TcpStream::connect(self.authority.as_str())
                .await
                .unwrap_or_else(|e| panic!("connect {}: {e}", self.url));
            tcp.set_nodelay(true).expect("nodelay");
            let (send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .expect("handshake");
            tokio::spawn(conn);
            self.conn = Some(send);
        }
        self.conn.as_mut().expect("connection")
    }
}

/// The JSON-RPC answer with `id` in a JSON or SSE body.
fn answer_of(body: &[u8], id: u64) -> Option<Value> {
    let text = String::from_utf8_lossy(body);
    let is = |v: &Value| v.get("id") == Some(&json!(id));
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return match v {
            Value::Array(all) => all.into_iter().find(is),
            v => Some(v).filter(is),
        };
    }
    // SSE: events separated by a blank line, each its `data:` lines.
    let text = text.replace("\r\n", "\n");
    text.split("\n\n").find_map(|event| {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        serde_json::from_str::<Value>(&data.join("\n"))
            .ok()
            .filter(is)
    })
}

/// A session that lists the tools: initialize, initialized, tools/list,
/// DELETE (MCP_Atlas's discovery of one server).
pub async fn list_once(url: &str, d: Duration) -> Timed<()> {
    let mut s = Session::new(url, d);
    s.initialize().await?;
    s.list_tools().await?;
    s.close().await
}

/// A session for one call: initialize, initialized, tools/call, DELETE
/// (MCP_Atlas's every call).
pub async fn call_once(url: &str, tool: &str, args: &Value, d: Duration) -> Timed<()> {
    let mut s = Session::new(url, d);
    s.initialize().await?;
    s.call(tool, args).await?;
    s.close().await
}
