//! The upload store: archives PUT to signed URLs wait here until
//! initialize or execute takes them (`<dir>/<sandbox>.tar.gz`,
//! `<dir>/<sandbox>.exec/<name>.tar.gz`). It is bounded: execution names
//! per sandbox (the agent's `exec.max_executions`), bytes per archive, per
//! sandbox and per owner, each counted while an upload streams. A partial
//! or refused upload leaves nothing and gives its bytes back; Release
//! removes a sandbox's archives and frees their bytes. Only a complete
//! upload replaces the stored one, and not once the sandbox is released.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use futures_util::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

/// The store's bounds (`sandbox-host --help`).
#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    /// One archive (`--max-upload-bytes`).
    pub archive_bytes: u64,
    /// Execution archives one sandbox may hold (`--max-executions-per-sandbox`).
    pub executions: usize,
    /// All of one sandbox's archives (`--max-stored-bytes-per-sandbox`).
    pub sandbox_bytes: u64,
    /// All archives of one owner's sandboxes (`--max-stored-bytes-per-key`).
    pub owner_bytes: u64,
    /// One `multipart/form-data` initialize, held in memory while it is
    /// packed (`--max-multipart-bytes`).
    pub multipart_bytes: u64,
}

/// Why an upload was refused.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error(
        "this sandbox already holds {max} execution archives (--max-executions-per-sandbox, the agent's exec.max_executions): upload to one of their names again to replace it, or release the sandbox to free them"
    )]
    TooManyExecutions { max: usize },
    #[error("the archive is larger than {limit} bytes (--max-upload-bytes)")]
    ArchiveTooLarge { limit: u64 },
    #[error(
        "the files are larger than {limit} bytes (--max-multipart-bytes): upload a tar.gz through upload-url instead"
    )]
    MultipartTooLarge { limit: u64 },
    #[error(
        "this sandbox's uploads would exceed {limit} bytes (--max-stored-bytes-per-sandbox); nothing of this upload was kept: release the sandbox to free its uploads"
    )]
    SandboxFull { limit: u64 },
    #[error(
        "the uploads of this API key's sandboxes would exceed {limit} bytes (--max-stored-bytes-per-key); nothing of this upload was kept: release sandboxes you are done with to free their uploads"
    )]
    OwnerFull { limit: u64 },
    #[error("reading the upload: {0}")]
    Body(String),
    #[error("the sandbox was released during the upload")]
    Released { id: String },
    #[error("storing the upload: {0}")]
    Io(#[from] std::io::Error),
}

/// What an upload is.
#[derive(Debug, Clone, Copy)]
pub enum Kind<'a> {
    /// The workspace archive (upload-url).
    Workspace,
    /// An execution's archive, by its name.
    Exec(&'a str),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Workspace,
    Exec(String),
}

impl From<Kind<'_>> for Key {
    fn from(k: Kind<'_>) -> Key {
        match k {
            Kind::Workspace => Key::Workspace,
            Kind::Exec(n) => Key::Exec(n.to_owned()),
        }
    }
}

/// One sandbox's archives.
#[derive(Default)]
struct Held {
    owner: String,
    /// Stored archives and their sizes.
    files: HashMap<Key, u64>,
    /// Their sum.
    stored: u64,
    /// Bytes of uploads in flight.
    inflight: u64,
    /// Execution names with an upload in flight (how many each).
    pending: HashMap<String, usize>,
}

impl Held {
    fn exec_names(&self) -> usize {
        let stored: HashSet<&str> = self
            .files
            .keys()
            .filter_map(|k| match k {
                Key::Exec(n) => Some(n.as_str()),
                Key::Workspace => None,
            })
            .collect();
        stored.len()
            + self
                .pending
                .keys()
                .filter(|n| !stored.contains(n.as_str()))
                .count()
    }

    fn holds_name(&self, name: &str) -> bool {
        self.pending.contains_key(name) || self.files.contains_key(&Key::Exec(name.to_owned()))
    }

    fn empty(&self) -> bool {
        self.files.is_empty() && self.inflight == 0 && self.pending.is_empty()
    }
}

#[derive(Default)]
struct State {
    sandboxes: HashMap<String, Held>,
    /// Stored and in-flight bytes per owner.
    owners: HashMap<String, u64>,
}

impl State {
    fn owner_sub(&mut self, owner: &str, n: u64) {
        if let Some(b) = self.owners.get_mut(owner) {
            *b = b.saturating_sub(n);
            if *b == 0 {
                self.owners.remove(owner);
            }
        }
    }
}

pub struct Uploads {
    dir: PathBuf,
    limits: UploadLimits,
    state: Mutex<State>,
}

impl Uploads {
    /// The store in `dir`, counting what live sandboxes (`(id, owner)`)
    /// stored before a restart; anything else there (partial uploads,
    /// archives of sandboxes released meanwhile) is removed. `live`
    /// `None` (not known: the API server unreachable) keeps every file.
    pub fn open(dir: PathBuf, limits: UploadLimits, live: Option<&[(String, String)]>) -> Uploads {
        let known = live.is_some();
        let live = live.unwrap_or_default();
        let up = Uploads {
            dir,
            limits,
            state: Mutex::new(State::default()),
        };
        let owners: HashMap<&str, &str> = live
            .iter()
            .map(|(id, owner)| (id.as_str(), owner.as_str()))
            .collect();
        let mut st = up.lock();
        for e in std::fs::read_dir(&up.dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let (id, exec) = match name.strip_suffix(".exec") {
                Some(id) => (id.to_owned(), true),
                None => (name.strip_suffix(".tar.gz").unwrap_or("").to_owned(), false),
            };
            let Some(owner) = owners.get(id.as_str()) else {
                if known {
                    remove(&e.path());
                }
                continue;
            };
            let mut found = Vec::new();
            if exec {
                for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                    let n = f.file_name().to_string_lossy().into_owned();
                    match (n.strip_suffix(".tar.gz"), f.metadata()) {
                        (Some(exec_name), Ok(md)) if md.is_file() => {
                            found.push((Key::Exec(exec_name.to_owned()), md.len()));
                        }
                        _ => remove(&f.path()),
                    }
                }
            } else if let Ok(md) = e.metadata() {
                found.push((Key::Workspace, md.len()));
            }
            if found.is_empty() {
                continue;
            }
            let held = st.sandboxes.entry(id).or_insert_with(|| Held {
                owner: owner.to_string(),
                ..Held::default()
            });
            let mut added = 0;
            for (k, size) in found {
                held.files.insert(k, size);
                added += size;
            }
            held.stored += added;
            *st.owners.entry(owner.to_string()).or_default() += added;
        }
        drop(st);
        up
    }

    pub fn limits(&self) -> UploadLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn workspace_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.tar.gz"))
    }

    fn exec_dir(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.exec"))
    }

    pub fn exec_path(&self, id: &str, name: &str) -> PathBuf {
        self.exec_dir(id).join(format!("{name}.tar.gz"))
    }

    fn path(&self, id: &str, kind: Kind<'_>) -> PathBuf {
        match kind {
            Kind::Workspace => self.workspace_path(id),
            Kind::Exec(n) => self.exec_path(id, n),
        }
    }

    /// Whether sandbox `id` may take an archive for execution `name` (one
    /// it holds, or a new one within the cap): execution-upload-url's
    /// answer before any URL is handed out.
    pub fn check_exec_name(&self, id: &str, name: &str) -> Result<(), UploadError> {
        let st = self.lock();
        match st.sandboxes.get(id) {
            Some(h) if !h.holds_name(name) && h.exec_names() >= self.limits.executions => {
                Err(UploadError::TooManyExecutions {
                    max: self.limits.executions,
                })
            }
            _ => Ok(()),
        }
    }

    /// Streams `body` (the request's bytes as they arrive) into the store
    /// as `kind` of sandbox `id` (of
    /// `owner`), counted against every limit as it arrives; only a complete
    /// upload replaces the stored one, and only while `live()` says the
    /// sandbox is not released. Returns the archive's size.
    pub async fn store(
        &self,
        id: &str,
        owner: &str,
        kind: Kind<'_>,
        body: impl Stream<Item = Result<bytes::Bytes, impl std::fmt::Display>> + Send,
        live: impl Fn() -> bool,
    ) -> Result<u64, UploadError> {
        let final_path = self.path(id, kind);
        if let Kind::Exec(_) = kind {
            tokio::fs::create_dir_all(self.exec_dir(id)).await?;
        }
        let mut r = self.begin(id, owner, kind)?;
        let rnd = sandbox_client::random::hex_token(8)?;
        let mut part = final_path.as_os_str().to_owned();
        part.push(format!(".{rnd}.part"));
        let part = PathBuf::from(part);
        let stored = async {
            let mut f = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&part)
                .await?;
            let mut stream = std::pin::pin!(body);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| UploadError::Body(e.to_string()))?;
                r.add(chunk.len() as u64)?;
                f.write_all(&chunk).await?;
            }
            f.sync_all().await?;
            drop(f);
            r.commit(&part, &final_path, live)
        }
        .await;
        if stored.is_err() {
            let _ = tokio::fs::remove_file(&part).await;
        }
        stored
    }

    fn begin<'a>(
        &'a self,
        id: &str,
        owner: &str,
        kind: Kind<'_>,
    ) -> Result<Reservation<'a>, UploadError> {
        let mut st = self.lock();
        let held = st.sandboxes.entry(id.to_owned()).or_insert_with(|| Held {
            owner: owner.to_owned(),
            ..Held::default()
        });
        let name = match kind {
            Kind::Exec(n) => {
                if !held.holds_name(n) && held.exec_names() >= self.limits.executions {
                    let max = self.limits.executions;
                    if held.empty() {
                        st.sandboxes.remove(id);
                    }
                    return Err(UploadError::TooManyExecutions { max });
                }
                *held.pending.entry(n.to_owned()).or_default() += 1;
                Some(n.to_owned())
            }
            Kind::Workspace => None,
        };
        Ok(Reservation {
            up: self,
            id: id.to_owned(),
            owner: owner.to_owned(),
            key: kind.into(),
            name,
            bytes: 0,
            committed: false,
        })
    }

    /// Forgets what is counted for `owner`'s sandboxes not in `live`
    /// (released through another replica sharing the volume, which removed
    /// their files but could not uncount them here): their bytes stop
    /// counting, and a file left of them is removed. A sandbox with an
    /// upload in flight is left to it.
    pub fn forget_released(&self, owner: &str, live: &HashSet<&str>) {
        let mut st = self.lock();
        let gone: Vec<String> = st
            .sandboxes
            .iter()
            .filter(|(id, h)| {
                h.owner == owner
                    && !live.contains(id.as_str())
                    && h.inflight == 0
                    && h.pending.is_empty()
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(h) = st.sandboxes.remove(&id) {
                st.owner_sub(&h.owner, h.stored);
            }
            remove(&self.workspace_path(&id));
            remove(&self.exec_dir(&id));
        }
    }

    /// Removes sandbox `id`'s archives and frees their bytes (Release).
    /// Uploads still in flight give theirs back as they end and keep
    /// nothing.
    pub fn release(&self, id: &str) {
        let mut st = self.lock();
        if let Some(h) = st.sandboxes.remove(id) {
            st.owner_sub(&h.owner, h.stored);
        }
        // Under the lock: a commit cannot rename a file in meanwhile.
        remove(&self.workspace_path(id));
        remove(&self.exec_dir(id));
    }
}

fn remove(p: &Path) {
    if let Err(e) = sandbox_tree::remove_path(p) {
        tracing::warn!(error = %e, "removing an upload");
    }
}

/// One upload in flight: the bytes it has counted so far, given back when
/// dropped unless committed.
struct Reservation<'a> {
    up: &'a Uploads,
    id: String,
    owner: String,
    key: Key,
    name: Option<String>,
    bytes: u64,
    committed: bool,
}

impl Reservation<'_> {
    /// Counts `n` more bytes, or refuses them (nothing is counted then).
    fn add(&mut self, n: u64) -> Result<(), UploadError> {
        let l = self.up.limits;
        if self.bytes + n > l.archive_bytes {
            return Err(UploadError::ArchiveTooLarge {
                limit: l.archive_bytes,
            });
        }
        let mut st = self.up.lock();
        let owner_now = st.owners.get(&self.owner).copied().unwrap_or(0);
        let Some(h) = st.sandboxes.get_mut(&self.id) else {
            return Err(UploadError::Released {
                id: self.id.clone(),
            });
        };
        if h.stored + h.inflight + n > l.sandbox_bytes {
            return Err(UploadError::SandboxFull {
                limit: l.sandbox_bytes,
            });
        }
        if owner_now + n > l.owner_bytes {
            return Err(UploadError::OwnerFull {
                limit: l.owner_bytes,
            });
        }
        h.inflight += n;
        *st.owners.entry(self.owner.clone()).or_default() += n;
        self.bytes += n;
        Ok(())
    }

    /// Renames the complete upload `part` into place, replacing the stored
    /// archive, unless the sandbox was released meanwhile.
    fn commit(
        &mut self,
        part: &Path,
        to: &Path,
        live: impl Fn() -> bool,
    ) -> Result<u64, UploadError> {
        let mut st = self.up.lock();
        let released = UploadError::Released {
            id: self.id.clone(),
        };
        if !st.sandboxes.contains_key(&self.id) || !live() {
            return Err(released);
        }
        std::fs::rename(part, to)?;
        let Some(h) = st.sandboxes.get_mut(&self.id) else {
            return Err(released);
        };
        let old = h.files.insert(self.key.clone(), self.bytes).unwrap_or(0);
        h.inflight -= self.bytes;
        h.stored = h.stored.saturating_sub(old) + self.bytes;
        st.owner_sub(&self.owner, old);
        self.committed = true;
        Ok(self.bytes)
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut st = self.up.lock();
        if !self.committed {
            st.owner_sub(&self.owner, self.bytes);
        }
        let Some(h) = st.sandboxes.get_mut(&self.id) else {
            return;
        };
        if !self.committed {
            h.inflight = h.inflight.saturating_sub(self.bytes);
        }
        if let Some(n) = &self.name
            && let Some(c) = h.pending.get_mut(n)
        {
            *c -= 1;
            if *c == 0 {
                h.pending.remove(n);
            }
        }
        if h.empty() {
            st.sandboxes.remove(&self.id);
        }
    }
}
