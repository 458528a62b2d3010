//! Recording a catalog from a running server: its handshake result, then
//! every listing method, each followed page by page as a client would.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Catalog, CatalogError, FORMAT, METHODS, Page};
use crate::supervisor::mcp::StdioConn;

/// Records `conn`'s answers (its handshake done) under `key`. Every method
/// of [`METHODS`] is asked, also those the server does not advertise: its
/// error answer is what a client would get, and is recorded as such.
pub async fn record(
    conn: &StdioConn,
    key: String,
    server: &str,
    benchmark: Option<String>,
    max_pages: usize,
    timeout: Duration,
) -> Result<Catalog, CatalogError> {
    let fail = |why: String| CatalogError::Record {
        server: server.to_owned(),
        why,
    };
    let init = conn
        .init_result()
        .cloned()
        .ok_or_else(|| fail("it has not finished its handshake".into()))?;
    let mut answers = BTreeMap::new();
    for method in METHODS {
        let mut pages = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            if pages.len() == max_pages {
                return Err(fail(format!(
                    "{method} has more than catalog.max_pages ({max_pages}) pages"
                )));
            }
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let msg = conn
                .request(method, params, timeout)
                .await
                .map_err(|e| fail(format!("{method}: {e}")))?;
            let answer = answer_of(msg);
            let next = answer
                .pointer("/result/nextCursor")
                .and_then(Value::as_str)
                .map(str::to_owned);
            pages.push(Page {
                cursor: cursor.take(),
                answer,
            });
            match next {
                Some(n) if pages.iter().all(|p| p.cursor.as_deref() != Some(&n)) => {
                    cursor = Some(n)
                }
                Some(n) => return Err(fail(format!("{method}: cursor {n:?} comes back"))),
                None => break,
            }
        }
        answers.insert(method.to_owned(), pages);
    }
    Ok(Catalog {
        format: FORMAT,
        key,
        server: server.to_owned(),
        benchmark,
        init,
        answers,
    })
}

/// A response message without its envelope: `{"result": …}` or
/// `{"error": …}`.
fn answer_of(mut msg: Value) -> Value {
    let mut out = serde_json::Map::new();
    for k in ["result", "error"] {
        if let Some(v) = msg.get_mut(k).map(Value::take) {
            out.insert(k.to_owned(), v);
        }
    }
    Value::Object(out)
}
