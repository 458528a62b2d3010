//! One POST's requests on one child: each goes out under an id of the
//! child connection, its answer comes back under the client's id, and a
//! request whose client went away is cancelled on the child.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::method_of;
use super::revision::{complete_result, strip_envelope};
use crate::gateway::router::{Out, Route};
use crate::gateway::rpc_error;
use crate::supervisor::mcp::{McpError, StdioConn};

use sandbox_client::mcp::{self, code};

/// One POST's requests on one child.
pub(super) struct Exchange {
    pub route: Arc<Route>,
    pub conn: Arc<StdioConn>,
    /// The child generation the requests go to (a restart starts a new one).
    pub generation: u64,
    pub session: Option<String>,
    /// A session-less (2026-07-28) request.
    pub modern: bool,
    pub timeout: Duration,
}

/// Removes a request from the route when it ends, and tells the child to
/// cancel it when its client went away first.
struct InflightGuard<'a> {
    x: &'a Exchange,
    child_id: u64,
    done: bool,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        self.x.route.end(self.x.generation, self.child_id);
        if !self.done {
            let cancel = mcp::notification(
                "notifications/cancelled",
                Some(json!({"requestId": self.child_id, "reason": "the client went away"})),
            );
            self.x.conn.try_send_message(&cancel);
        }
    }
}

/// Sends one client request to the child and returns the answer under the
/// client's id.
pub(super) async fn call_child(
    x: Arc<Exchange>,
    mut msg: Value,
    sink: Option<mpsc::Sender<Out>>,
) -> Value {
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let method = method_of(&msg).unwrap_or("").to_owned();
    let mut params = msg
        .get_mut("params")
        .map(Value::take)
        .unwrap_or_else(|| json!({}));
    if x.modern {
        strip_envelope(&mut params);
    }
    let child_id = x.conn.alloc_id();
    let back_channel = !x.modern;
    if !x.route.begin(
        x.generation,
        child_id,
        x.session.as_deref(),
        &id,
        &mut params,
        sink,
        back_channel,
    ) {
        return rpc_error(
            &id,
            code::INTERNAL_ERROR,
            "the MCP server restarted while this request was sent; retry",
        );
    }
    let mut guard = InflightGuard {
        x: &x,
        child_id,
        done: false,
    };
    let r = x
        .conn
        .request_seq(child_id, &method, params, x.timeout)
        .await;
    if let Ok((_, seq)) = &r {
        // What the child sent for this request before answering (its
        // progress) reaches the request's stream first, while the request
        // is still in flight to route it.
        x.route.caught_up(x.generation, *seq).await;
    }
    guard.done = true;
    drop(guard);
    match r.map(|(answer, _)| answer) {
        Ok(mut answer) => {
            answer["id"] = id;
            if x.modern {
                complete_result(&mut answer, &method, x.conn.init_result());
            }
            answer
        }
        Err(McpError::Closed) => rpc_error(
            &id,
            code::INTERNAL_ERROR,
            "the MCP server exited while handling this request; it is being restarted, retry shortly",
        ),
        Err(e) => rpc_error(&id, code::INTERNAL_ERROR, e.to_string()),
    }
}
