//! Discovery catalogs: what each installed server answers to `initialize`
//! and its listings, recorded by an agent in a sandbox no tenant has used
//! (`Servers.RecordCatalogs`), kept in the host's own directory, and given
//! to every agent (`Servers.PutCatalogs`), which answers an idle server's
//! discovery from the one whose key matches the launch its lease runs.
//!
//! Recorded at start, in the background, for what the directory lacks or
//! holds under an old key (a new lock installed, another version, another
//! profile): until then, and for servers not catalogued (a lease's
//! credentials or mail account in their launch), discovery starts the
//! server as before.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use tracing::{info, warn};

use sandbox_client::proto;

use super::{Pool, PoolError, Slot};

/// What the host does with discovery catalogs (`--catalogs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CatalogMode {
    /// Records at start what the directory lacks, and gives them out.
    Record,
    /// Gives out what the directory holds; records nothing.
    Use,
    /// None: every first request of a lazy server starts it.
    Off,
}

/// Largest catalog file read back from the directory.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// The catalogs of this host, by label (`server` or `server@Profile`).
pub struct Discovery {
    dir: PathBuf,
    by_label: RwLock<BTreeMap<String, (String, Bytes)>>,
    /// Set from the start until [`Pool::record_catalogs`] ends, when the
    /// host records (`/metrics`: `sandbox_host_discovery_recording`).
    recording: AtomicBool,
}

/// The part of a catalog document the host reads.
#[derive(serde::Deserialize)]
struct Head {
    key: String,
    server: String,
    benchmark: Option<String>,
}

fn label_of(h: &Head) -> String {
    match &h.benchmark {
        Some(b) => format!("{}@{b}", h.server),
        None => h.server.clone(),
    }
}

impl Discovery {
    /// The catalogs kept in `dir` (made 0700 if absent); a file that is
    /// not one is skipped with a warning (the next recording replaces it).
    pub fn open(dir: &Path, will_record: bool) -> std::io::Result<Discovery> {
        std::fs::create_dir_all(dir)?;
        let mut by_label = BTreeMap::new();
        for e in std::fs::read_dir(dir)? {
            let path = e?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            match read_catalog(&path) {
                Ok((h, bytes)) => {
                    by_label.insert(label_of(&h), (h.key, bytes));
                }
                Err(why) => warn!(path = %path.display(), %why, "not a catalog; skipped"),
            }
        }
        info!(dir = %dir.display(), catalogs = by_label.len(), "discovery catalogs");
        Ok(Discovery {
            dir: dir.to_owned(),
            by_label: RwLock::new(by_label),
            recording: AtomicBool::new(will_record),
        })
    }

    /// Catalogs held, and whether a recording is still to end.
    pub fn counts(&self) -> (usize, bool) {
        (self.read().len(), self.recording.load(Ordering::SeqCst))
    }

    /// Label → key of every catalog held.
    pub fn known(&self) -> HashMap<String, String> {
        self.read()
            .iter()
            .map(|(l, (k, _))| (l.clone(), k.clone()))
            .collect()
    }

    /// Every catalog document held.
    pub fn documents(&self) -> Vec<Bytes> {
        self.read().values().map(|(_, b)| b.clone()).collect()
    }

    /// Keeps a recorded catalog: written beside, then renamed over the old
    /// one, so a reader never sees half a file.
    pub fn keep(&self, c: &proto::ServerCatalog) -> std::io::Result<()> {
        let name = format!("{}.json", file_name(&c.label));
        let tmp = self.dir.join(format!(".{name}.part"));
        std::fs::write(&tmp, &c.json)?;
        std::fs::rename(&tmp, self.dir.join(&name))?;
        self.by_label
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(c.label.clone(), (c.key.clone(), c.json.clone()));
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, (String, Bytes)>> {
        self.by_label.read().unwrap_or_else(|p| p.into_inner())
    }
}

/// Clears the recording flag however the recording ends.
struct Ended<'a>(&'a AtomicBool);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// A label as a file name: labels are manifest names and profiles
/// (`[A-Za-z0-9_.@-]`); anything else becomes `_`.
fn file_name(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.@-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn read_catalog(path: &Path) -> Result<(Head, Bytes), String> {
    let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    if len > MAX_FILE_BYTES {
        return Err(format!("{len} bytes, more than {MAX_FILE_BYTES}"));
    }
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let head: Head = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    Ok((head, Bytes::from(bytes)))
}

impl Pool {
    /// Catalogs held and whether they are being recorded (`(0, false)`
    /// with `--catalogs off`).
    pub fn discovery_counts(&self) -> (usize, bool) {
        self.cfg
            .discovery
            .as_ref()
            .map_or((0, false), |d| d.counts())
    }

    /// Gives `slot`'s agent the catalogs held (nothing when there are
    /// none). A failure is logged: that agent's discovery starts servers.
    pub async fn give_catalogs(&self, slot: &Slot) {
        let Some(d) = &self.cfg.discovery else { return };
        let catalogs = d.documents();
        if catalogs.is_empty() {
            return;
        }
        let put = async {
            let c = slot.client(self.cfg.deadlines.call).await?;
            c.servers()
                .max_encoding_message_size(usize::MAX)
                .put_catalogs(proto::PutCatalogsRequest { catalogs })
                .await
                .map_err(|s| PoolError::Catalogs(s.message().to_owned()))
        };
        if let Err(e) = put.await {
            warn!(slot = %slot.id, error = %e, "the agent did not take the discovery catalogs");
        }
    }

    /// Records what the catalogs lack in a sandbox of its own (no tenant
    /// has run there), keeps them, gives them to every live sandbox, and
    /// ends that sandbox. Once, at start, in the background.
    pub async fn record_catalogs(self: Arc<Self>) {
        let Some(d) = self.cfg.discovery.clone() else {
            return;
        };
        let _ended = Ended(&d.recording);
        let Some(room) = self.reserve() else {
            warn!("no room for a sandbox to record discovery catalogs in (--max-slots)");
            return;
        };
        let slot = match self.spawn().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "no sandbox to record discovery catalogs in");
                return;
            }
        };
        // Held as leased (no Acquire reaches it) until it is discarded.
        self.leased().insert(slot.id.clone(), slot.clone());
        drop(room);
        let recorded = self.record_in(&slot, &d).await;
        let pool = self.clone();
        let id = slot.id.clone();
        let _ = tokio::task::spawn_blocking(move || pool.drop_slot(&id)).await;
        match recorded {
            Ok(0) => {}
            Ok(_) => {
                let live: Vec<Slot> = self
                    .idle()
                    .iter()
                    .map(|i| i.slot.clone())
                    .chain(self.leased_slots())
                    .collect();
                for s in live {
                    self.give_catalogs(&s).await;
                }
            }
            Err(e) => warn!(error = %e, "recording discovery catalogs failed"),
        }
    }

    /// Asks `slot`'s agent for the catalogs `d` lacks and keeps them;
    /// returns how many were new.
    async fn record_in(&self, slot: &Slot, d: &Discovery) -> Result<usize, PoolError> {
        let c = slot.client(self.cfg.deadlines.transfer).await?;
        let r = c
            .servers()
            .max_decoding_message_size(usize::MAX)
            .record_catalogs(proto::RecordCatalogsRequest { known: d.known() })
            .await
            .map_err(|s| PoolError::Catalogs(s.message().to_owned()))?
            .into_inner();
        for s in &r.skipped {
            info!(server = %s.label, why = %s.why, "not catalogued");
        }
        let mut kept = 0;
        for c in &r.catalogs {
            match d.keep(c) {
                Ok(()) => kept += 1,
                Err(e) => warn!(server = %c.label, error = %e, "keeping a catalog"),
            }
        }
        info!(
            recorded = kept,
            unchanged = r.unchanged,
            skipped = r.skipped.len(),
            "discovery catalogs recorded"
        );
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_catalogs_are_read_back_and_junk_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let d = Discovery::open(dir.path(), false).unwrap();
        let json = br#"{"format":1,"key":"k1","server":"git","benchmark":"MCP_Atlas","init":{},"answers":{}}"#;
        d.keep(&proto::ServerCatalog {
            label: "git@MCP_Atlas".into(),
            key: "k1".into(),
            json: Bytes::from_static(json),
        })
        .unwrap();
        std::fs::write(dir.path().join("junk.json"), b"{").unwrap();
        let again = Discovery::open(dir.path(), false).unwrap();
        assert_eq!(
            again.known(),
            HashMap::from([("git@MCP_Atlas".to_owned(), "k1".to_owned())])
        );
        assert_eq!(again.documents().len(), 1);
        assert_eq!(file_name("a/../b"), "a_.._b");
    }
}
