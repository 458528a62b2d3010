//! The local backends' state in SQLite: sandboxes (leases) and their
//! owners. It survives a host restart; agents (separate processes)
//! survive it too.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

use super::{SandboxRow, Status, StoreError};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sandboxes (
    id            TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    slot          TEXT NOT NULL,
    status        TEXT NOT NULL,
    benchmark     TEXT,
    servers       TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    updated_at    TEXT NOT NULL,
    expires_at_ms INTEGER,
    released      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sandboxes_owner ON sandboxes(owner, released);
";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(SandboxRow, String, String)> {
    Ok((
        SandboxRow {
            id: r.get(0)?,
            owner: r.get(1)?,
            slot: r.get(2)?,
            status: Status::Error,
            benchmark: r.get(4)?,
            servers: Vec::new(),
            created_at: r.get(6)?,
            updated_at: r.get(7)?,
            expires_at_ms: r.get(8)?,
            endpoint: None,
        },
        r.get::<_, String>(5)?,
        r.get::<_, String>(3)?,
    ))
}

fn finish(v: (SandboxRow, String, String)) -> Result<SandboxRow, StoreError> {
    let (mut s, servers, status) = v;
    s.servers = serde_json::from_str(&servers)?;
    s.status = Status::parse(&status).ok_or(StoreError::Status(status))?;
    Ok(s)
}

const COLUMNS: &str =
    "id, owner, slot, status, benchmark, servers, created_at, updated_at, expires_at_ms";

pub struct Db {
    db: Mutex<Connection>,
}

impl Db {
    pub fn open(path: &Path) -> Result<Db, StoreError> {
        let db = Connection::open(path)?;
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        db.busy_timeout(std::time::Duration::from_secs(5))?;
        db.execute_batch(SCHEMA)?;
        Ok(Db { db: Mutex::new(db) })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, s: &SandboxRow) -> Result<(), StoreError> {
        self.db().execute(
            &format!(
                "INSERT INTO sandboxes ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ),
            params![
                s.id,
                s.owner,
                s.slot,
                s.status.as_str(),
                s.benchmark,
                serde_json::to_string(&s.servers)?,
                s.created_at,
                s.updated_at,
                s.expires_at_ms
            ],
        )?;
        Ok(())
    }

    /// A live (not released) sandbox, whoever owns it (for a capability
    /// that names it).
    pub fn get_live(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        let v = self
            .db()
            .query_row(
                &format!("SELECT {COLUMNS} FROM sandboxes WHERE id = ?1 AND released = 0"),
                params![id],
                row,
            )
            .optional()?;
        v.map(finish).transpose()
    }

    /// Live sandboxes; of one owner, or all.
    pub fn list(&self, owner: Option<&str>) -> Result<Vec<SandboxRow>, StoreError> {
        let db = self.db();
        let mut out = Vec::new();
        let mut q = db.prepare(&format!(
            "SELECT {COLUMNS} FROM sandboxes WHERE released = 0 AND (?1 IS NULL OR owner = ?1) ORDER BY created_at"
        ))?;
        for r in q.query_map(params![owner], row)? {
            out.push(finish(r?)?);
        }
        Ok(out)
    }

    pub fn set_status(&self, id: &str, status: Status, now: &str) -> Result<(), StoreError> {
        self.db().execute(
            "UPDATE sandboxes SET status = ?2, updated_at = ?3 WHERE id = ?1",
            params![id, status.as_str(), now],
        )?;
        Ok(())
    }

    pub fn mark_released(&self, id: &str, now: &str) -> Result<(), StoreError> {
        self.db().execute(
            "UPDATE sandboxes SET released = 1, updated_at = ?2 WHERE id = ?1",
            params![id, now],
        )?;
        Ok(())
    }

    /// Live sandboxes whose TTL has passed.
    pub fn expired(&self, now_ms: i64) -> Result<Vec<SandboxRow>, StoreError> {
        let db = self.db();
        let mut out = Vec::new();
        let mut q = db.prepare(&format!(
            "SELECT {COLUMNS} FROM sandboxes WHERE released = 0 AND expires_at_ms IS NOT NULL AND expires_at_ms <= ?1"
        ))?;
        for r in q.query_map(params![now_ms], row)? {
            out.push(finish(r?)?);
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl super::Leases for Db {
    async fn insert(&self, s: &SandboxRow) -> Result<(), StoreError> {
        Db::insert(self, s)
    }

    async fn get_live(&self, id: &str) -> Result<Option<SandboxRow>, StoreError> {
        Db::get_live(self, id)
    }

    fn live_now(&self, id: &str) -> bool {
        matches!(Db::get_live(self, id), Ok(Some(_)))
    }

    async fn list(&self, owner: Option<&str>) -> Result<Vec<SandboxRow>, StoreError> {
        Db::list(self, owner)
    }

    async fn held(&self, owner: &str) -> Result<usize, StoreError> {
        Ok(Db::list(self, Some(owner))?.len())
    }

    async fn set_status(&self, id: &str, status: Status, now: &str) -> Result<(), StoreError> {
        Db::set_status(self, id, status, now)
    }

    async fn mark_released(&self, id: &str, now: &str) -> Result<(), StoreError> {
        Db::mark_released(self, id, now)
    }

    async fn expired(&self, now_ms: i64) -> Result<Vec<SandboxRow>, StoreError> {
        Db::expired(self, now_ms)
    }
}
