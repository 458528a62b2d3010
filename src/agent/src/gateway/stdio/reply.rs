//! A POST's answers, each serialized and counted against the reply's
//! bytes (`gateway.max_reply_bytes`) as soon as it is made, on the catalog
//! path and the live path alike: no answer is kept as a parsed tree, and
//! no reply is built whole before it is counted. An answer that does not
//! fit becomes a JSON-RPC error for its id that names the limit.

use std::sync::Mutex;

use http::StatusCode;
use serde_json::Value;

use super::revision::modern_status;
use crate::gateway::rpc_error;
use sandbox_client::mcp::code;

/// One answer as JSON text.
pub(super) struct Answer {
    pub json: String,
    /// Its HTTP status when it is a session-less request's only answer.
    pub status: StatusCode,
}

/// What is left of one POST's reply bytes.
pub(super) struct Budget {
    left: Mutex<usize>,
    max: usize,
}

impl Budget {
    pub fn new(max: usize) -> Budget {
        Budget {
            left: Mutex::new(max),
            max,
        }
    }

    /// `answer` as text, when it fits in what is left; else an error for
    /// its id saying why it was dropped.
    pub fn admit(&self, answer: &Value) -> Answer {
        let json = answer.to_string();
        if self.take(json.len()) {
            return Answer {
                json,
                status: modern_status(answer),
            };
        }
        let id = answer.get("id").unwrap_or(&Value::Null);
        let error = rpc_error(
            id,
            code::INTERNAL_ERROR,
            format!(
                "this answer ({} bytes) does not fit in the reply: one POST's answers are at most \
                 gateway.max_reply_bytes = {} bytes; send fewer requests per batch",
                json.len(),
                self.max
            ),
        );
        Answer {
            json: error.to_string(),
            status: modern_status(&error),
        }
    }

    fn take(&self, n: usize) -> bool {
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        let fits = n <= *left;
        if fits {
            *left -= n;
        }
        fits
    }
}

/// The body of a reply: one answer, or a batch's array.
pub(super) fn body(answers: Vec<Answer>, batch: bool) -> String {
    if !batch {
        return answers
            .into_iter()
            .next()
            .map(|a| a.json)
            .unwrap_or_default();
    }
    let len = answers.iter().map(|a| a.json.len() + 1).sum::<usize>() + 1;
    let mut out = String::with_capacity(len);
    out.push('[');
    for (i, a) in answers.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&a.json);
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers_past_the_budget_become_errors_naming_the_limit() {
        let big = json!({"jsonrpc": "2.0", "id": 1, "result": {"text": "x".repeat(600)}});
        let budget = Budget::new(1000);
        let first = budget.admit(&big);
        assert_eq!(first.json, big.to_string());
        let second = budget
            .admit(&json!({"jsonrpc": "2.0", "id": "b", "result": {"text": "x".repeat(600)}}));
        let e: Value = serde_json::from_str(&second.json).expect("json");
        assert_eq!(e["id"], "b");
        assert_eq!(e["error"]["code"], code::INTERNAL_ERROR);
        let msg = e["error"]["message"].as_str().expect("message");
        assert!(msg.contains("gateway.max_reply_bytes = 1000"), "{msg}");
        let small = budget.admit(&json!({"jsonrpc": "2.0", "id": 3, "result": {}}));
        assert!(small.json.contains("result"), "a small answer still fits");
        let all: Value =
            serde_json::from_str(&body(vec![first, second, small], true)).expect("batch");
        assert_eq!(all.as_array().map(Vec::len), Some(3));
    }
}
