//! Discovery of an idle server answered from its catalog: the handshake
//! (`initialize`, `server/discover`), the listings with their pages, and
//! `ping`, exactly as the server answered them when recorded, without
//! starting it. A POST with anything else (a call, a read, a cursor the
//! catalog never saw, a notification the server should hear) goes to the
//! server, which starts first; the session the catalog opened goes on.

use std::sync::Arc;

use http::{Response, StatusCode};
use serde_json::Value;

use super::method_of;
use super::reply::{Answer, Budget};
use super::revision::{complete_result, discover};
use crate::catalog::Catalog;
use crate::gateway::{Body, Gateway, http_error};

use sandbox_client::mcp;

/// The server a POST is for.
pub(super) struct Target<'a> {
    pub name: &'a str,
    pub lease: &'a str,
    /// Its catalog, while it is idle.
    pub catalog: Option<Arc<Catalog>>,
}

impl<'a> Target<'a> {
    pub fn new(name: &'a str, lease: &'a str, catalog: Option<Arc<Catalog>>) -> Self {
        Target {
            name,
            lease,
            catalog,
        }
    }
}

/// A POST's answers made from a catalog.
pub(super) struct FromCatalog {
    pub answers: Vec<Answer>,
    /// The session an `initialize` opened.
    pub new_session: Option<String>,
}

/// Whether `cat` answers message `m` by itself.
fn answerable(cat: &Catalog, m: &Value, modern: bool) -> bool {
    let params = m.get("params");
    match (method_of(m), m.get("id")) {
        (Some("initialize"), Some(_)) => !modern,
        (Some(method), Some(_)) => cat.answers_method(method, params),
        // Nothing of the handshake reaches a child: the gateway made it.
        (Some("notifications/initialized"), None) => true,
        // Nothing is in flight on a server that has not started.
        (Some("notifications/cancelled"), None) => true,
        _ => false,
    }
}

impl Gateway {
    /// A POST to an idle server with a catalog: its answer when the
    /// catalog answers every message; else (`None`) the server is started
    /// and the POST goes on to it in the same session, or the answer says
    /// why it could not start.
    pub(super) async fn discovery(
        &self,
        cat: &Catalog,
        messages: &[Value],
        (name, lease): (&str, &str),
        budget: &Budget,
        (batch, wants_json, modern): (bool, bool, bool),
    ) -> Option<Response<Body>> {
        let at = (name, lease);
        if let Some(c) = self.answer_from_catalog(cat, messages, at, budget, modern) {
            return Some(self.lease_ended(name, lease).unwrap_or_else(|| {
                self.reply(c.answers, batch, wants_json, c.new_session, modern)
            }));
        }
        let started = self.lc.start_on_use(name, lease).await;
        started
            .err()
            .map(|e| http_error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
    }

    /// The answers to `messages` from `cat`, when it answers every one;
    /// `None` (and nothing done) otherwise. Each answer is made, counted
    /// against `budget` and serialized before the next: a batch never
    /// holds more than one recorded listing's copy at a time.
    pub(super) fn answer_from_catalog(
        &self,
        cat: &Catalog,
        messages: &[Value],
        (name, lease): (&str, &str),
        budget: &Budget,
        modern: bool,
    ) -> Option<FromCatalog> {
        if !messages.iter().all(|m| answerable(cat, m, modern)) {
            return None;
        }
        let init = Some(&cat.init);
        let mut out = FromCatalog {
            answers: Vec::new(),
            new_session: None,
        };
        for m in messages {
            let Some(id) = m.get("id") else { continue };
            let method = method_of(m).unwrap_or_default();
            let answer = match method {
                "initialize" => {
                    let (answer, sid) = self.open_session(init, m, id, name, lease);
                    if sid.is_some() {
                        out.new_session = sid;
                    }
                    answer
                }
                "server/discover" => discover(init, id),
                _ => {
                    let recorded = cat.answer(method, m.get("params"))?;
                    let mut answer = mcp::result(id, Value::Null);
                    if let (Some(a), Some(r)) = (answer.as_object_mut(), recorded.as_object()) {
                        a.remove("result");
                        a.extend(r.clone());
                    }
                    if modern {
                        complete_result(&mut answer, method, init);
                    }
                    answer
                }
            };
            out.answers.push(budget.admit(&answer));
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[test]
    fn only_discovery_and_the_handshakes_notifications_are_answerable() {
        let cat = Catalog {
            format: crate::catalog::FORMAT,
            key: "k".into(),
            server: "s".into(),
            benchmark: None,
            init: json!({}),
            answers: BTreeMap::from([(
                "tools/list".to_owned(),
                vec![crate::catalog::Page {
                    cursor: None,
                    answer: json!({"result": {"tools": []}}),
                }],
            )]),
        };
        let req = |m: &str| json!({"jsonrpc": "2.0", "id": 1, "method": m});
        assert!(answerable(&cat, &req("initialize"), false));
        assert!(!answerable(&cat, &req("initialize"), true));
        assert!(answerable(&cat, &req("tools/list"), false));
        assert!(!answerable(&cat, &req("tools/call"), false));
        assert!(
            !answerable(&cat, &req("prompts/list"), false),
            "never recorded"
        );
        let note = json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"});
        assert!(!answerable(&cat, &note, false), "the server must hear it");
        let answer = json!({"jsonrpc": "2.0", "id": 4, "result": {}});
        assert!(!answerable(&cat, &answer, false));
    }
}
