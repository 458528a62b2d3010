//! The extractor, entry type by entry type, limit by limit, and the
//! confinement of every path. Archives are built with `tar::Builder`, or
//! from raw headers where the builder refuses to write a hostile one.

use std::fs;
use std::io::{Cursor, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use tar::{Builder, EntryType, Header};

use super::{ExtractOptions, ExtractStats, RESERVED_NAME, extract};
use crate::codec::Compression;
use crate::error::ArchiveError;
use crate::limits::ArchiveLimits;

/// An archive under construction.
struct Tar(Builder<Vec<u8>>);

impl Tar {
    fn new() -> Tar {
        Tar(Builder::new(Vec::new()))
    }

    /// An entry from a raw GNU header: `name` and `link` (at most 100 bytes
    /// each) go in as they are, whatever they hold.
    fn raw(mut self, kind: EntryType, name: &[u8], link: &[u8], mode: u32, data: &[u8]) -> Tar {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_mtime(1_000_000);
        h.set_size(data.len() as u64);
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name);
        old.linkname[..link.len()].copy_from_slice(link);
        h.set_cksum();
        self.0.append(&h, data).expect("append");
        self
    }

    /// A regular file through the builder (GNU long names past 100 bytes).
    fn file(self, path: &str, data: &[u8]) -> Tar {
        self.file_mode(path, data, 0o644)
    }

    fn file_mode(mut self, path: &str, data: &[u8], mode: u32) -> Tar {
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Regular);
        h.set_mode(mode);
        h.set_mtime(1_000_000);
        h.set_size(data.len() as u64);
        self.0.append_data(&mut h, path, data).expect("append");
        self
    }

    fn dir(self, path: &str, mode: u32) -> Tar {
        self.raw(EntryType::Directory, path.as_bytes(), b"", mode, b"")
    }

    /// A symlink through the builder (GNU long links past 100 bytes).
    fn symlink(mut self, path: &str, target: &str) -> Tar {
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        self.0.append_link(&mut h, path, target).expect("append");
        self
    }

    fn hardlink(self, path: &str, target: &str) -> Tar {
        self.raw(
            EntryType::Link,
            path.as_bytes(),
            target.as_bytes(),
            0o644,
            b"",
        )
    }

    /// A PAX extended header (`x`) for the next entry.
    fn pax(self, records: &[(&str, &[u8])]) -> Tar {
        let data: Vec<u8> = records.iter().flat_map(|(k, v)| pax_record(k, v)).collect();
        self.raw(EntryType::XHeader, b"PaxHeaders/x", b"", 0o644, &data)
    }

    /// The archive, with its end-of-archive marker.
    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().expect("finish")
    }
}

/// One PAX record: "<length> <key>=<value>\n", the length counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let rest = key.len() + value.len() + 3;
    let mut len = rest + 1;
    while rest + len.to_string().len() != len {
        len = rest + len.to_string().len();
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// A workspace to extract into and a directory beside it that no entry may
/// reach.
struct Dirs {
    _tmp: tempfile::TempDir,
    ws: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().expect("tempdir");
    let ws = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    fs::create_dir(&ws).expect("ws");
    fs::create_dir(&outside).expect("outside");
    Dirs {
        _tmp: tmp,
        ws,
        outside,
    }
}

fn run_with(
    ws: &Path,
    data: Vec<u8>,
    limits: &ArchiveLimits,
    merge: bool,
) -> Result<ExtractStats, ArchiveError> {
    let root = fs::File::open(ws).expect("open ws");
    let opts = ExtractOptions {
        limits,
        compression: Compression::Auto,
        owner: None,
        merge,
    };
    extract(Cursor::new(data), root.as_fd(), &opts)
}

fn run(ws: &Path, data: Vec<u8>) -> Result<ExtractStats, ArchiveError> {
    run_with(ws, data, &ArchiveLimits::default(), false)
}

fn limited(ws: &Path, data: Vec<u8>, limits: ArchiveLimits) -> Result<ExtractStats, ArchiveError> {
    run_with(ws, data, &limits, false)
}

/// The message of an `Invalid` error; anything else fails the test.
fn invalid(r: Result<ExtractStats, ArchiveError>) -> String {
    match r {
        Err(ArchiveError::Invalid(m)) => m,
        other => panic!("expected an Invalid error, got {other:?}"),
    }
}

/// The key of a `Limit` error; anything else fails the test.
fn limit(r: Result<ExtractStats, ArchiveError>) -> &'static str {
    match r {
        Err(ArchiveError::Limit { limit, .. }) => limit,
        other => panic!("expected a Limit error, got {other:?}"),
    }
}

fn assert_invalid(r: Result<ExtractStats, ArchiveError>, needle: &str) {
    let m = invalid(r);
    assert!(m.contains(needle), "{m:?} does not say {needle:?}");
}

fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).expect("stat").permissions().mode() & 0o7777
}

fn empty(dir: &Path) -> bool {
    fs::read_dir(dir).expect("read_dir").next().is_none()
}

/// The default limits, changed by `f`.
fn with(f: impl FnOnce(&mut ArchiveLimits)) -> ArchiveLimits {
    let mut l = ArchiveLimits::default();
    f(&mut l);
    l
}

/// The owner's chown is skipped only where it is a no-op: a file created
/// by this process in a setgid directory has the directory's group, and
/// is still given the configured one.
#[test]
fn a_file_in_a_setgid_directory_still_gets_the_owner_s_group() {
    use std::os::unix::fs::PermissionsExt as _;
    let (uid, gid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    if uid != 0 {
        return; // giving a directory another group needs root
    }
    let d = dirs();
    let sg = d.ws.join("sg");
    fs::create_dir(&sg).expect("dir");
    std::os::unix::fs::chown(&sg, None, Some(gid + 4321)).expect("chgrp");
    fs::set_permissions(&sg, fs::Permissions::from_mode(0o2755)).expect("setgid");
    let tar = Tar::new().file("sg/f", b"x").file("plain", b"y").bytes();
    let root = fs::File::open(&d.ws).expect("open ws");
    let l = ArchiveLimits::default();
    let opts = ExtractOptions {
        limits: &l,
        compression: Compression::Auto,
        owner: Some((uid, gid)),
        merge: true,
    };
    extract(Cursor::new(tar), root.as_fd(), &opts).expect("extract");
    assert_eq!(fs::metadata(sg.join("f")).expect("stat").gid(), gid);
    assert_eq!(fs::metadata(d.ws.join("plain")).expect("stat").gid(), gid);
}

mod confinement;
mod entry_types;
mod limits;
mod merge;
mod stream;
mod writers;
