//! Routing between one shared stdio child and its many client sessions.
//!
//! A [`Route`] lives for one server within one lease. It knows:
//! - the client requests in flight on the child (by the child-side id), with
//!   the sink of the POST that carries each, so the child's progress
//!   notifications go back to the request that caused them;
//! - each session's server-to-client stream (GET), where global
//!   notifications (`list_changed`, log messages) are broadcast;
//! - the child's own requests (`roots/list`, `sampling/createMessage`,
//!   `elicitation/create`) waiting for a client's answer.
//!
//! Progress tokens are rewritten on the way in (to the child-side request
//! id, unique on the connection) and restored on the way out, so two
//! sessions that both use token `0` never see each other's progress.
//!
//! A child's request goes to the one session with a request in flight that
//! declared the capability, else to the most recently used session with an
//! open stream that declared it; with neither, the child gets a JSON-RPC
//! error at once. Unanswered ones are failed after the request timeout.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sandbox_client::mcp;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::session::Sessions;
use crate::supervisor::mcp::StdioConn;

/// What a POST's answer channel carries: messages for the client while its
/// requests run, then the answers.
pub enum Out {
    Message(Value),
    /// The answers, serialized and counted (`stdio::reply`).
    Done(Vec<String>),
}

/// A client request on the child.
struct Inflight {
    session: Option<String>,
    client_id: Value,
    /// The client's own progress token, restored on the way out.
    client_token: Option<Value>,
    /// The POST's channel, when its client accepts an SSE answer.
    sink: Option<mpsc::Sender<Out>>,
    /// False for the session-less revision: no server-to-client requests.
    back_channel: bool,
}

/// A request of the child's waiting for a client's answer.
struct ServerRequest {
    session: String,
    deadline: Instant,
}

#[derive(Default)]
struct State {
    /// The child connection requests are on, and its generation: ids
    /// restart with each child.
    conn: std::sync::Weak<StdioConn>,
    generation: u64,
    inflight: HashMap<u64, Inflight>,
    /// Session → its open server-to-client stream.
    streams: HashMap<String, mpsc::Sender<Value>>,
    /// The child's request id (as JSON text) → where it went.
    server_requests: HashMap<String, ServerRequest>,
    /// Resource URI → sessions subscribed to it.
    subscriptions: HashMap<String, HashSet<String>>,
}

pub struct Route {
    pub name: String,
    pub lease: String,
    sessions: Arc<Sessions>,
    state: Mutex<State>,
    /// Cancelled when the route is retired (the lease ended): every stream
    /// of it ends.
    pub ended: CancellationToken,
    stream_buffer: usize,
    server_request_timeout: Duration,
    dropped: AtomicU64,
    /// The child generation and number of the last of its messages routed
    /// ([`pump`]): an answer waits for what the child sent before it
    /// ([`Route::caught_up`]).
    seen: tokio::sync::watch::Sender<(u64, u64)>,
}

/// How long an answer waits for the child's messages sent before it to be
/// routed (they normally are within a scheduling turn).
const CATCH_UP: Duration = Duration::from_secs(2);

/// What a child's request needs of a client to be routed to it.
fn capability_for(method: &str) -> Option<&'static str> {
    match method {
        "roots/list" => Some("roots"),
        "sampling/createMessage" => Some("sampling"),
        "elicitation/create" => Some("elicitation"),
        _ => None,
    }
}

fn id_key(id: &Value) -> String {
    id.to_string()
}

impl Route {
    pub fn new(
        name: &str,
        lease: &str,
        sessions: Arc<Sessions>,
        stream_buffer: usize,
        server_request_timeout: Duration,
    ) -> Route {
        Route {
            name: name.to_owned(),
            lease: lease.to_owned(),
            sessions,
            state: Mutex::new(State::default()),
            ended: CancellationToken::new(),
            stream_buffer,
            server_request_timeout,
            dropped: AtomicU64::new(0),
            seen: tokio::sync::watch::channel((0, 0)).0,
        }
    }

    /// Waits until the child's messages numbered up to `seq` (generation
    /// `generation`) are routed, so a request's progress reaches its
    /// stream before its answer; at most [`CATCH_UP`], and not past the
    /// route's end.
    pub async fn caught_up(&self, generation: u64, seq: u64) {
        let mut rx = self.seen.subscribe();
        tokio::select! {
            _ = rx.wait_for(|&(g, s)| g != generation || s >= seq) => {}
            _ = self.ended.cancelled() => {}
            _ = tokio::time::sleep(CATCH_UP) => {
                debug!(server = %self.name, seq, "the child's earlier messages were not routed in time; answering");
            }
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The generation of `conn`. A new child connection starts a new one and
    /// forgets what belonged to the previous child.
    pub fn attach(&self, conn: &Arc<StdioConn>) -> u64 {
        let mut st = self.state();
        let weak = Arc::downgrade(conn);
        if !st.conn.ptr_eq(&weak) {
            st.conn = weak;
            st.generation += 1;
            st.inflight.clear();
            st.server_requests.clear();
        }
        st.generation
    }

    /// Records a client request about to be sent to the child under
    /// `child_id`, and rewrites its progress token. Returns false when the
    /// child has been replaced since `generation` was read.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &self,
        generation: u64,
        child_id: u64,
        session: Option<&str>,
        client_id: &Value,
        params: &mut Value,
        sink: Option<mpsc::Sender<Out>>,
        back_channel: bool,
    ) -> bool {
        let client_token = params
            .pointer_mut("/_meta/progressToken")
            .map(|t| std::mem::replace(t, json!(child_id)));
        let mut st = self.state();
        if st.generation != generation {
            return false;
        }
        st.inflight.insert(
            child_id,
            Inflight {
                session: session.map(str::to_owned),
                client_id: client_id.clone(),
                client_token,
                sink,
                back_channel,
            },
        );
        true
    }

    pub fn end(&self, generation: u64, child_id: u64) {
        let mut st = self.state();
        if st.generation == generation {
            st.inflight.remove(&child_id);
        }
    }

    /// The child-side id of a session's request, for a cancellation.
    pub fn child_id_of(&self, session: Option<&str>, client_id: &Value) -> Option<u64> {
        let st = self.state();
        st.inflight
            .iter()
            .find(|(_, f)| f.session.as_deref() == session && &f.client_id == client_id)
            .map(|(id, _)| *id)
    }

    /// Opens a session's server-to-client stream, replacing an older one.
    pub fn open_stream(&self, session: &str) -> mpsc::Receiver<Value> {
        let (tx, rx) = mpsc::channel(self.stream_buffer);
        let mut st = self.state();
        st.streams.retain(|_, s| !s.is_closed());
        st.streams.insert(session.to_owned(), tx);
        rx
    }

    /// A session ended (DELETE): its stream closes and the child's requests
    /// sent to it are failed by the next sweep.
    pub fn close_session(&self, session: &str) {
        let mut st = self.state();
        st.streams.remove(session);
        for r in st.server_requests.values_mut() {
            if r.session == session {
                r.deadline = Instant::now();
            }
        }
        for subs in st.subscriptions.values_mut() {
            subs.remove(session);
        }
    }

    /// `resources/subscribe` from a session. Returns whether the child must
    /// be told (no other session was subscribed to the URI).
    pub fn subscribe(&self, session: &str, uri: &str) -> bool {
        let mut st = self.state();
        let subs = st.subscriptions.entry(uri.to_owned()).or_default();
        let first = subs.is_empty();
        subs.insert(session.to_owned());
        first
    }

    /// `resources/unsubscribe`. Returns whether the child must be told (no
    /// session is subscribed any more).
    pub fn unsubscribe(&self, session: &str, uri: &str) -> bool {
        let mut st = self.state();
        let Some(subs) = st.subscriptions.get_mut(uri) else {
            return true;
        };
        subs.remove(session);
        if subs.is_empty() {
            st.subscriptions.remove(uri);
            true
        } else {
            false
        }
    }

    /// A client's answer to one of the child's requests. Returns false when
    /// no such request is waiting (it timed out, or was never sent to this
    /// session).
    pub fn take_server_request(&self, session: Option<&str>, id: &Value) -> bool {
        let mut st = self.state();
        let key = id_key(id);
        match st.server_requests.get(&key) {
            Some(r) if session.is_none_or(|s| s == r.session) => {
                st.server_requests.remove(&key);
                true
            }
            _ => false,
        }
    }

    /// Delivers a message to a stream without blocking the child's reader:
    /// a full stream loses the message (counted and logged).
    fn push(&self, tx: &mpsc::Sender<Value>, msg: Value) -> bool {
        match tx.try_send(msg) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                warn!(server = %self.name, dropped = n, "a client stream is full (gateway.stream_buffer_messages); message dropped");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    fn push_out(&self, tx: &mpsc::Sender<Out>, msg: Value) -> bool {
        match tx.try_send(Out::Message(msg)) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                warn!(server = %self.name, dropped = n, "a client stream is full (gateway.stream_buffer_messages); message dropped");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    fn broadcast(&self, st: &mut State, msg: &Value, only: Option<&HashSet<String>>) {
        st.streams.retain(|_, s| !s.is_closed());
        for (session, tx) in &st.streams {
            if only.is_none_or(|o| o.contains(session)) {
                self.push(tx, msg.clone());
            }
        }
    }

    /// A message from the child that is not an answer to one of our
    /// requests. Returns an answer to send back to the child when one of
    /// its requests cannot be routed.
    pub fn on_child_message(&self, msg: &Value) -> Option<Value> {
        let method = msg.get("method").and_then(Value::as_str)?;
        let id = msg.get("id");
        let mut st = self.state();
        match (method, id) {
            ("notifications/progress", None) => {
                let token = msg.pointer("/params/progressToken").and_then(Value::as_u64);
                let Some(f) = token.and_then(|t| st.inflight.get(&t)) else {
                    debug!(server = %self.name, "progress for no request in flight; dropped");
                    return None;
                };
                let mut out = msg.clone();
                if let Some(t) = &f.client_token {
                    out["params"]["progressToken"] = t.clone();
                }
                if let Some(sink) = &f.sink {
                    self.push_out(sink, out);
                } else if let Some(tx) = f.session.as_ref().and_then(|s| st.streams.get(s)) {
                    self.push(tx, out);
                }
                None
            }
            ("notifications/cancelled", None) => {
                // The child gave up one of its own requests.
                let key = msg.pointer("/params/requestId").map(id_key)?;
                let r = st.server_requests.remove(&key)?;
                if let Some(tx) = st.streams.get(&r.session) {
                    self.push(tx, msg.clone());
                }
                None
            }
            ("notifications/resources/updated", None) => {
                let uri = msg.pointer("/params/uri").and_then(Value::as_str);
                let subs = uri.and_then(|u| st.subscriptions.get(u)).cloned();
                self.broadcast(&mut st, msg, subs.as_ref());
                None
            }
            ("notifications/message", None) => {
                // A log line: with exactly one request in flight it most
                // likely belongs to it; otherwise every stream gets it.
                let mut sinks = st.inflight.values().filter_map(|f| f.sink.as_ref());
                if let (Some(sink), None) = (sinks.next(), sinks.next())
                    && st.inflight.len() == 1
                {
                    let sink = sink.clone();
                    self.push_out(&sink, msg.clone());
                } else {
                    self.broadcast(&mut st, msg, None);
                }
                None
            }
            (_, None) => {
                // list_changed and the like are global.
                self.broadcast(&mut st, msg, None);
                None
            }
            (_, Some(id)) => self.route_server_request(&mut st, method, id, msg),
        }
    }

    fn route_server_request(
        &self,
        st: &mut State,
        method: &str,
        id: &Value,
        msg: &Value,
    ) -> Option<Value> {
        if method == "ping" {
            // The child checks that its client is alive: the gateway is.
            return Some(mcp::result(id, json!({})));
        }
        let cap = capability_for(method);
        // 1. The one session with requests in flight that can answer.
        let mut in_flight: HashMap<&String, &mpsc::Sender<Out>> = HashMap::new();
        for f in st.inflight.values().filter(|f| f.back_channel) {
            if let (Some(s), Some(sink)) = (&f.session, &f.sink)
                && self.sessions.capable(s, cap).is_some()
            {
                in_flight.entry(s).or_insert(sink);
            }
        }
        let mut target: Option<String> = None;
        if in_flight.len() == 1
            && let Some((session, sink)) = in_flight.into_iter().next()
            && self.push_out(sink, msg.clone())
        {
            target = Some(session.clone());
        }
        // 2. The most recently used session with an open stream that can.
        if target.is_none() {
            st.streams.retain(|_, s| !s.is_closed());
            let mut open: Vec<(Instant, &String, &mpsc::Sender<Value>)> = st
                .streams
                .iter()
                .filter_map(|(s, tx)| Some((self.sessions.capable(s, cap)?, s, tx)))
                .collect();
            open.sort_by_key(|(used, _, _)| std::cmp::Reverse(*used));
            for (_, session, tx) in open {
                if self.push(tx, msg.clone()) {
                    target = Some(session.clone());
                    break;
                }
            }
        }
        match target {
            Some(session) => {
                debug!(server = %self.name, method, %session, "server request routed to a client session");
                st.server_requests.insert(
                    id_key(id),
                    ServerRequest {
                        session,
                        deadline: Instant::now() + self.server_request_timeout,
                    },
                );
                None
            }
            None => {
                let need = cap.map_or(String::new(), |c| {
                    format!(" that declared the {c:?} capability")
                });
                Some(mcp::error(
                    id,
                    mcp::code::METHOD_NOT_FOUND,
                    format!(
                        "{method}: no MCP client session{need} has a request in flight or an open stream (GET) to answer it"
                    ),
                ))
            }
        }
    }

    /// Fails the child's requests whose client never answered.
    pub fn expired_server_requests(&self) -> Vec<Value> {
        let now = Instant::now();
        let mut st = self.state();
        let mut out = Vec::new();
        st.server_requests.retain(|key, r| {
            if r.deadline > now {
                return true;
            }
            if let Ok(id) = serde_json::from_str::<Value>(key) {
                out.push(mcp::error(
                    &id,
                    mcp::code::INTERNAL_ERROR,
                    format!(
                        "no answer from the client session {} in time (or the session ended)",
                        r.session
                    ),
                ));
            }
            false
        });
        out
    }

    /// Ends the route: its streams close and nothing more is routed.
    pub fn retire(&self) {
        self.ended.cancel();
        let mut st = self.state();
        st.streams.clear();
        st.inflight.clear();
        st.server_requests.clear();
    }
}

/// Reads the child's messages (generation `generation`) into `route` until
/// the connection closes or the route is retired.
pub async fn pump(route: &Route, conn: &StdioConn, generation: u64) {
    use tokio::sync::broadcast::error::RecvError;
    let (mut rx, before) = conn.subscribe();
    route.seen.send_replace((generation, before));
    let mut sweep = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            m = rx.recv() => match m {
                Ok((seq, m)) => {
                    let answer = route.on_child_message(&m);
                    route.seen.send_replace((generation, seq));
                    if let Some(answer) = answer
                        && conn.send_message(&answer).await.is_err()
                    {
                        return;
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    warn!(server = %route.name, lost = n, "the gateway fell behind the server's messages; some were lost");
                }
                Err(RecvError::Closed) => return,
            },
            _ = sweep.tick() => {
                for answer in route.expired_server_requests() {
                    if conn.send_message(&answer).await.is_err() {
                        return;
                    }
                }
            }
            _ = conn.closed().cancelled() => return,
            _ = route.ended.cancelled() => return,
        }
    }
}
