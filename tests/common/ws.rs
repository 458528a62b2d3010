//! Workspace test helpers: archives (hostile ones included), streaming them
//! into Initialize, and snapshots of trees for equality checks.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_client::proto;
use sandbox_client::proto::initialize_request::Msg;
use sha2::{Digest, Sha256};

/// Builds tar archives, including entries the tar crate would refuse to
/// write (names are put in the header as raw bytes).
#[derive(Default)]
pub struct Tar {
    pub buf: Vec<u8>,
}

impl Tar {
    pub fn new() -> Tar {
        Tar::default()
    }

    fn push(
        &mut self,
        name: &[u8],
        kind: tar::EntryType,
        mode: u32,
        data: &[u8],
        link: &[u8],
    ) -> &mut Tar {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        if name.len() > 100 {
            // GNU long name record, raw bytes.
            let mut l = tar::Header::new_gnu();
            l.set_entry_type(tar::EntryType::GNULongName);
            l.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
            l.set_size(name.len() as u64 + 1);
            l.set_cksum();
            self.buf.extend_from_slice(l.as_bytes());
            let mut n = name.to_vec();
            n.push(0);
            pad(&mut n);
            self.buf.extend_from_slice(&n);
            h.as_old_mut().name.copy_from_slice(&name[..100]);
        } else {
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
        }
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_cksum();
        self.buf.extend_from_slice(h.as_bytes());
        let mut d = data.to_vec();
        pad(&mut d);
        self.buf.extend_from_slice(&d);
        self
    }

    /// A PAX extended header (`x`) with `records` (key, raw value) for the
    /// next entry.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Tar {
        let mut body = Vec::new();
        for (k, v) in records {
            // "LEN KEY=VALUE\n", LEN counting itself.
            let rest = k.len() + v.len() + 3;
            let mut len = rest + 1;
            while len.to_string().len() + rest != len {
                len += 1;
            }
            body.extend_from_slice(format!("{len} {k}=").as_bytes());
            body.extend_from_slice(v);
            body.push(b'\n');
        }
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_mode(0o644);
        h.set_size(body.len() as u64);
        h.as_ustar_mut().expect("ustar").name[..9].copy_from_slice(b"PaxHeader");
        h.set_cksum();
        self.buf.extend_from_slice(h.as_bytes());
        pad(&mut body);
        self.buf.extend_from_slice(&body);
        self
    }

    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Tar {
        self.push(name.as_bytes(), tar::EntryType::Regular, 0o644, data, b"")
    }
    pub fn file_raw(&mut self, name: &[u8], mode: u32, data: &[u8]) -> &mut Tar {
        self.push(name, tar::EntryType::Regular, mode, data, b"")
    }
    pub fn dir(&mut self, name: &str) -> &mut Tar {
        self.push(name.as_bytes(), tar::EntryType::Directory, 0o755, b"", b"")
    }
    pub fn dir_mode(&mut self, name: &str, mode: u32) -> &mut Tar {
        self.push(name.as_bytes(), tar::EntryType::Directory, mode, b"", b"")
    }
    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Tar {
        self.push(
            name.as_bytes(),
            tar::EntryType::Symlink,
            0o777,
            b"",
            target.as_bytes(),
        )
    }
    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Tar {
        self.push(
            name.as_bytes(),
            tar::EntryType::Link,
            0o644,
            b"",
            target.as_bytes(),
        )
    }
    pub fn special(&mut self, name: &str, kind: tar::EntryType) -> &mut Tar {
        self.push(name.as_bytes(), kind, 0o644, b"", b"")
    }
    /// End-of-archive marker.
    pub fn end(&mut self) -> Vec<u8> {
        self.buf.extend_from_slice(&[0u8; 1024]);
        std::mem::take(&mut self.buf)
    }
}

fn pad(v: &mut Vec<u8>) {
    let r = v.len() % 512;
    if r != 0 {
        v.resize(v.len() + 512 - r, 0);
    }
}

/// `len` bytes that do not compress (xorshift from `seed`).
pub fn incompressible(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes `dir/name`: 64 MiB that gzip cannot shrink (64 distinct 1 MiB
/// blocks), more than every buffer between a Dump and a stalled reader.
pub fn write_64_mib(dir: &Path, name: &str) {
    let block = incompressible(1 << 20, 0x2545_f491_4f6c_dd1d);
    let mut f = std::fs::File::create(dir.join(name)).expect("big file");
    for i in 0..64u8 {
        let mut b = block.clone();
        b[0] = i;
        f.write_all(&b).expect("write");
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Streams `data` into Initialize in 64 KiB chunks.
pub async fn initialize(
    client: &sandbox_client::Client,
    header: proto::InitializeHeader,
    data: Vec<u8>,
) -> Result<proto::InitializeResponse, tonic::Status> {
    let mut msgs = vec![proto::InitializeRequest {
        msg: Some(Msg::Header(header)),
    }];
    for c in data.chunks(64 << 10) {
        msgs.push(proto::InitializeRequest {
            msg: Some(Msg::Chunk(c.to_vec().into())),
        });
    }
    client
        .workspace()
        .initialize(tokio_stream::iter(msgs))
        .await
        .map(|r| r.into_inner())
}

/// Dumps the whole workspace and returns the archive bytes and trailer.
pub async fn dump(
    client: &sandbox_client::Client,
    req: proto::DumpRequest,
) -> Result<(Vec<u8>, proto::DumpTrailer), tonic::Status> {
    use tokio_stream::StreamExt;
    let mut s = client.workspace().dump(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.next().await {
        match m?.msg {
            Some(proto::dump_response::Msg::Chunk(b)) => out.extend_from_slice(&b),
            Some(proto::dump_response::Msg::Trailer(t)) => return Ok((out, t)),
            None => {}
        }
    }
    panic!("dump ended without a trailer")
}

/// The paths of a gzipped tar's entries (a Dump), in archive order.
pub fn entry_names(tgz: &[u8]) -> Vec<String> {
    tar::Archive::new(flate2::read::GzDecoder::new(tgz))
        .entries()
        .expect("the archive's entries")
        .map(|e| {
            e.expect("entry")
                .path()
                .expect("path")
                .display()
                .to_string()
        })
        .collect()
}

/// What a tree holds: per relative path, a description of the entry.
pub type Snapshot = BTreeMap<PathBuf, String>;

/// Walks `root` (not following symlinks), skipping the agent's inner state
/// directory. With `mtimes`, file and symlink mtimes are part of the
/// description (directory mtimes too).
pub fn snapshot(root: &Path, mtimes: bool) -> Snapshot {
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), mtimes, &mut out);
    out
}

fn walk(root: &Path, rel: &Path, mtimes: bool, out: &mut Snapshot) {
    let mut names: Vec<_> = std::fs::read_dir(root.join(rel))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for n in names {
        if rel.as_os_str().is_empty() && n.as_bytes() == b".sandbox-agent" {
            continue;
        }
        let p = rel.join(&n);
        let full = root.join(&p);
        let md = std::fs::symlink_metadata(&full).unwrap();
        let mode = md.permissions().mode() & 0o7777;
        let mt = if mtimes {
            format!(" mtime={}", md.mtime())
        } else {
            String::new()
        };
        let desc = if md.is_dir() {
            walk(root, &p, mtimes, out);
            format!("dir {mode:o}{mt}")
        } else if md.file_type().is_symlink() {
            format!(
                "symlink -> {}",
                std::fs::read_link(&full).unwrap().display()
            )
        } else if md.is_file() {
            let mut data = Vec::new();
            std::fs::File::open(&full)
                .unwrap()
                .read_to_end(&mut data)
                .unwrap();
            format!("file {mode:o} {} {}{mt}", data.len(), sha256(&data))
        } else {
            format!("special {mode:o}")
        };
        out.insert(p, desc);
    }
}

/// Waits (up to 10 s) until `dir` is empty: the agent removes old trees and
/// failed stages in the background.
pub async fn wait_empty(dir: &Path) {
    let what = format!("{} is emptied", dir.display());
    super::eventually_async(Duration::from_secs(10), &what, async || {
        let left: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        super::when(left.is_empty(), || format!("debris: {left:?}"))
    })
    .await
}

/// Waits until the agent has a staging directory in its state dir `dir`:
/// it has taken an Initialize (the workspace lock is held from before the
/// stage is made until after it is committed or discarded).
pub async fn wait_staging(dir: &Path) {
    let what = format!(
        "the agent starts the Initialize (a staging directory in {})",
        dir.display()
    );
    super::eventually_async(Duration::from_secs(30), &what, async || {
        let staged = std::fs::read_dir(dir).map(|d| {
            d.filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().starts_with("stage"))
        });
        super::when(matches!(staged, Ok(true)), || format!("{staged:?}"))
    })
    .await
}
