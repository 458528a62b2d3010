//! What an idle server would answer to discovery, recorded from that very
//! server build: its `initialize` result and every page of its listings.
//!
//! A lazy lease's clients list every server before their task starts
//! (MCP_Atlas lists eleven, one after another); starting each to answer
//! costs seconds and hundreds of MiB. The gateway answers the handshake and
//! the listing methods of an idle server from its catalog instead, and the
//! server starts on the first request the catalog cannot answer.
//!
//! - `key`: what determines the answers (the launch after the profile,
//!   the install's lock stamps, the version, the agent's protocol version).
//! - `record`: a catalog made from a running server, before any lease.
//! - [`Catalogs`]: the catalogs the host gave this agent, bounded.
//!
//! A catalog is data the host recorded from a clean slot (no tenant ever
//! ran there) and stores privately; it holds no secret: servers whose
//! launch needs a lease's credentials or mail account are not recorded.

pub mod key;
pub mod record;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use key::key_of;

/// The methods a catalog answers (besides `initialize` and
/// `server/discover`, made from [`Catalog::init`]).
pub const METHODS: [&str; 5] = [
    "tools/list",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "ping",
];

/// The format written by this agent; others are refused.
pub const FORMAT: u32 = 1;

/// One server build's discovery answers.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    pub format: u32,
    /// [`key_of`] of the launch it was recorded from.
    pub key: String,
    pub server: String,
    /// The profile it was recorded under (`None`: the manifest's default).
    pub benchmark: Option<String>,
    /// The server's `initialize` result, as it answered the agent.
    pub init: Value,
    /// Per method of [`METHODS`], each page as the server answered it.
    pub answers: BTreeMap<String, Vec<Page>>,
}

/// One answer of a listing: to the request without a cursor (`cursor`
/// `None`) or with the cursor a previous page gave.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Page {
    pub cursor: Option<String>,
    /// `{"result": …}` or `{"error": …}`, as the server sent it.
    pub answer: Value,
}

impl Catalog {
    /// The recorded answer (its `result` or `error` member, without id) to
    /// `method` with `params`, or `None` when the catalog cannot say what
    /// the server would answer (a method or cursor it never saw).
    pub fn answer(&self, method: &str, params: Option<&Value>) -> Option<&Value> {
        let cursor = params
            .and_then(|p| p.get("cursor"))
            .map(|c| c.as_str().map(str::to_owned));
        let cursor = match cursor {
            None => None,
            Some(Some(c)) => Some(c),
            // A cursor that is not a string: only the server knows.
            Some(None) => return None,
        };
        self.answers
            .get(method)?
            .iter()
            .find(|p| p.cursor == cursor)
            .map(|p| &p.answer)
    }

    /// Whether the catalog answers a message by itself (everything of
    /// discovery; the caller answers `initialize` and notifications).
    pub fn answers_method(&self, method: &str, params: Option<&Value>) -> bool {
        method == "initialize"
            || method == "server/discover"
            || self.answer(method, params).is_some()
    }

    /// Reads a catalog, checking its format.
    pub fn parse(bytes: &[u8]) -> Result<Catalog, CatalogError> {
        let c: Catalog = serde_json::from_slice(bytes).map_err(CatalogError::Parse)?;
        if c.format != FORMAT {
            return Err(CatalogError::Format(c.format));
        }
        if !c.init.is_object() {
            return Err(CatalogError::Invalid("init is not an object"));
        }
        Ok(c)
    }
}

/// A catalog's outline, read without building its answers (which would
/// take the allocator's memory for nothing): the whole document is read
/// when a request needs it.
#[derive(Deserialize)]
struct Head {
    format: u32,
    key: String,
    /// Read only to check it is an object.
    #[serde(rename = "init")]
    _init: HashMap<String, serde::de::IgnoredAny>,
}

impl Head {
    /// The key of a catalog document of this agent's format.
    fn check(bytes: &[u8]) -> Result<String, CatalogError> {
        let h: Head = serde_json::from_slice(bytes).map_err(CatalogError::Parse)?;
        if h.format != FORMAT {
            return Err(CatalogError::Format(h.format));
        }
        Ok(h.key)
    }
}

/// Why a catalog cannot be recorded or taken.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("not a catalog: {0}")]
    Parse(serde_json::Error),
    #[error("catalog format {0} is not this agent's ({FORMAT})")]
    Format(u32),
    #[error("invalid catalog: {0}")]
    Invalid(&'static str),
    #[error("{count} catalogs given; catalog.max_entries is {max}")]
    TooMany { count: usize, max: usize },
    #[error("the catalogs take {bytes} bytes; catalog.max_bytes is {max}")]
    TooLarge { bytes: usize, max: usize },
    #[error("server {server}: {why}")]
    Record { server: String, why: String },
}

/// `[catalog]` in agent.toml.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogConfig {
    /// Catalogs an agent keeps (one per server build and profile).
    pub max_entries: usize,
    /// Bytes of all catalogs together, as JSON.
    pub max_bytes: usize,
    /// Pages of one listing a recording follows; a server with more is not
    /// catalogued.
    pub max_pages: usize,
    /// How long a recording waits for one answer of the server.
    pub record_timeout_ms: u64,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        CatalogConfig {
            max_entries: 512,
            max_bytes: 64 << 20,
            max_pages: 100,
            record_timeout_ms: 30_000,
        }
    }
}

/// The catalogs this agent answers from, by key. Kept as the JSON the
/// host gave (a few KiB each, 1.2 MiB for all 54 of the shipped servers'
/// profiles) and read when a discovery request needs one: parsed, they
/// would hold about 10 MiB in every sandbox.
#[derive(Default)]
pub struct Catalogs {
    by_key: Mutex<HashMap<String, Bytes>>,
}

impl Catalogs {
    /// Replaces every catalog with `given` (JSON documents), all or none.
    /// Returns how many were taken.
    pub fn replace(&self, given: &[Bytes], cfg: &CatalogConfig) -> Result<usize, CatalogError> {
        if given.len() > cfg.max_entries {
            return Err(CatalogError::TooMany {
                count: given.len(),
                max: cfg.max_entries,
            });
        }
        let bytes: usize = given.iter().map(Bytes::len).sum();
        if bytes > cfg.max_bytes {
            return Err(CatalogError::TooLarge {
                bytes,
                max: cfg.max_bytes,
            });
        }
        let mut map = HashMap::new();
        for g in given {
            map.insert(Head::check(g)?, g.clone());
        }
        let n = map.len();
        *self.by_key.lock().unwrap_or_else(|p| p.into_inner()) = map;
        Ok(n)
    }

    /// The catalog recorded under `key` (checked when it was given).
    pub fn get(&self, key: &str) -> Option<Arc<Catalog>> {
        let bytes = self
            .by_key
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()?;
        Catalog::parse(&bytes).ok().map(Arc::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn catalog() -> Catalog {
        Catalog {
            format: FORMAT,
            key: "k".into(),
            server: "s".into(),
            benchmark: None,
            init: json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}}),
            answers: BTreeMap::from([(
                "tools/list".to_owned(),
                vec![
                    Page {
                        cursor: None,
                        answer: json!({"result": {"tools": [], "nextCursor": "2"}}),
                    },
                    Page {
                        cursor: Some("2".into()),
                        answer: json!({"result": {"tools": []}}),
                    },
                ],
            )]),
        }
    }

    #[test]
    fn pages_are_found_by_cursor_and_unknown_ones_are_the_servers() {
        let c = catalog();
        assert_eq!(
            c.answer("tools/list", None).unwrap()["result"]["nextCursor"],
            "2"
        );
        assert!(
            c.answer("tools/list", Some(&json!({"cursor": "2"})))
                .is_some()
        );
        assert!(
            c.answer("tools/list", Some(&json!({"cursor": "3"})))
                .is_none()
        );
        assert!(
            c.answer("tools/list", Some(&json!({"cursor": 2})))
                .is_none()
        );
        assert!(c.answer("prompts/list", None).is_none());
        assert!(c.answers_method("initialize", None));
        assert!(!c.answers_method("tools/call", None));
    }

    #[test]
    fn bounds_and_formats_are_checked_before_anything_is_taken() {
        let store = Catalogs::default();
        let good = Bytes::from(serde_json::to_vec(&catalog()).unwrap());
        let cfg = CatalogConfig::default();
        assert_eq!(store.replace(std::slice::from_ref(&good), &cfg).unwrap(), 1);
        let mut old = catalog();
        old.format = 0;
        let bad = Bytes::from(serde_json::to_vec(&old).unwrap());
        assert!(matches!(
            store.replace(&[good.clone(), bad], &cfg),
            Err(CatalogError::Format(0))
        ));
        assert!(store.get("k").is_some(), "a refused set keeps the old one");
        let small = CatalogConfig {
            max_bytes: 10,
            ..CatalogConfig::default()
        };
        assert!(matches!(
            store.replace(&[good], &small),
            Err(CatalogError::TooLarge { .. })
        ));
    }
}
