//! MCP sessions of the data plane: ids issued at initialize, bounded in
//! number per server, expired when idle.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Session {
    server: String,
    /// Sessions belong to one lease: a new lease starts without any.
    lease: String,
    last_used: Instant,
    /// The client's capabilities from its `initialize` (null when the
    /// session was created from an unknown id).
    caps: serde_json::Value,
}

pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
    max_per_server: usize,
    idle: Duration,
}

/// A fresh session id: 128 random bits, hex.
pub fn new_id() -> std::io::Result<String> {
    sandbox_client::random::hex_token(16)
}

impl Sessions {
    pub fn new(max_per_server: usize, idle: Duration) -> Sessions {
        Sessions {
            map: Mutex::new(HashMap::new()),
            max_per_server,
            idle,
        }
    }

    /// Records a session; when the server already has the maximum, the
    /// least recently used one is dropped (clients that never DELETE their
    /// sessions, such as one-session-per-call benchmarks, keep working).
    pub fn insert(&self, id: &str, server: &str, lease: &str, caps: serde_json::Value) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        m.retain(|_, s| now.duration_since(s.last_used) < self.idle);
        let count = m.values().filter(|s| s.server == server).count();
        if count >= self.max_per_server
            && let Some(oldest) = m
                .iter()
                .filter(|(_, s)| s.server == server)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(k, _)| k.clone())
        {
            m.remove(&oldest);
        }
        m.insert(
            id.to_owned(),
            Session {
                server: server.to_owned(),
                lease: lease.to_owned(),
                last_used: now,
                caps,
            },
        );
    }

    /// Marks a session used; false when it does not exist (or expired).
    pub fn touch(&self, id: &str, server: &str, lease: &str) -> bool {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match m.get_mut(id) {
            Some(s)
                if s.server == server && s.lease == lease && s.last_used.elapsed() < self.idle =>
            {
                s.last_used = Instant::now();
                true
            }
            _ => false,
        }
    }

    pub fn remove(&self, id: &str, server: &str) -> bool {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(id) {
            Some(s) if s.server == server => m.remove(id).is_some(),
            _ => false,
        }
    }

    /// When a live session was last used, if its client declared
    /// `capability` (such as `roots` or `sampling`; None asks for none).
    pub fn capable(&self, id: &str, capability: Option<&str>) -> Option<Instant> {
        let m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        m.get(id)
            .filter(|s| s.last_used.elapsed() < self.idle)
            .filter(|s| capability.is_none_or(|c| s.caps.get(c).is_some()))
            .map(|s| s.last_used)
    }

    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_per_server_lru() {
        let s = Sessions::new(2, Duration::from_secs(60));
        s.insert("a", "fs", "l1", serde_json::json!({"roots": {}}));
        s.insert("b", "fs", "l1", serde_json::Value::Null);
        assert!(s.touch("a", "fs", "l1"));
        s.insert("c", "fs", "l1", serde_json::Value::Null);
        assert!(s.touch("a", "fs", "l1") && s.touch("c", "fs", "l1"));
        assert!(!s.touch("b", "fs", "l1"), "least recently used is evicted");
        assert!(!s.touch("a", "git", "l1"), "sessions belong to one server");
        assert!(!s.touch("a", "fs", "l2"), "and to one lease");
        assert_eq!(s.count(), 2);
        assert!(s.capable("a", Some("roots")).is_some());
        assert!(s.capable("a", Some("sampling")).is_none());
        assert!(s.capable("c", Some("roots")).is_none() && s.capable("c", None).is_some());
    }
}
