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

// --- entry types --------------------------------------------------------

#[test]
fn a_regular_file_is_written_with_its_mode_and_mtime_without_setuid() {
    let d = dirs();
    let tar = Tar::new().file_mode("a.txt", b"hello", 0o4777).bytes();
    let stats = run(&d.ws, tar).expect("extract");
    let p = d.ws.join("a.txt");
    assert_eq!(fs::read(&p).expect("read"), b"hello");
    // The umask's bits are set back; setuid is dropped.
    assert_eq!(mode_of(&p), 0o777);
    assert_eq!(fs::metadata(&p).expect("stat").mtime(), 1_000_000);
    assert_eq!(
        stats,
        ExtractStats {
            files: 1,
            bytes_written: 5,
            entries: 1,
            ..ExtractStats::default()
        }
    );
}

#[test]
fn a_contiguous_file_is_a_regular_file() {
    let d = dirs();
    let tar = Tar::new()
        .raw(EntryType::Continuous, b"c.bin", b"", 0o600, b"data")
        .bytes();
    let stats = run(&d.ws, tar).expect("extract");
    assert_eq!(fs::read(d.ws.join("c.bin")).expect("read"), b"data");
    assert_eq!(mode_of(&d.ws.join("c.bin")), 0o600);
    assert_eq!(stats.files, 1);
}

/// A GNU sparse file with 5 bytes of data at 1024 and a hole to 4096.
fn sparse_tar() -> Vec<u8> {
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::GNUSparse);
    h.set_mode(0o644);
    h.set_size(5);
    let gnu = h.as_gnu_mut().expect("gnu");
    gnu.sparse[0].set_offset(1024);
    gnu.sparse[0].set_length(5);
    gnu.sparse[1].set_offset(4096);
    gnu.sparse[1].set_length(0);
    gnu.set_real_size(4096);
    h.as_old_mut().name[..6].copy_from_slice(b"sparse");
    h.set_cksum();
    let mut b = Builder::new(Vec::new());
    b.append(&h, &b"hello"[..]).expect("append");
    b.into_inner().expect("finish")
}

#[test]
fn a_gnu_sparse_file_is_written_dense_at_its_real_size() {
    let d = dirs();
    let stats = run(&d.ws, sparse_tar()).expect("extract");
    let got = fs::read(d.ws.join("sparse")).expect("read");
    let mut want = vec![0u8; 4096];
    want[1024..1029].copy_from_slice(b"hello");
    assert_eq!(got, want);
    assert_eq!(stats.bytes_written, 4096);
}

#[test]
fn a_gnu_sparse_file_counts_its_real_size_against_max_file_bytes() {
    let d = dirs();
    let limits = ArchiveLimits {
        max_file_bytes: 4095,
        ..ArchiveLimits::default()
    };
    assert_eq!(
        limit(limited(&d.ws, sparse_tar(), limits)),
        "max_file_bytes"
    );
}

#[test]
fn a_directory_gets_its_mode_and_mtime_after_its_contents() {
    let d = dirs();
    let tar = Tar::new()
        .dir("ro/", 0o555)
        .file("ro/f", b"x")
        .dir("ro/sub", 0o2750)
        .bytes();
    let stats = run(&d.ws, tar).expect("extract");
    let ro = d.ws.join("ro");
    assert_eq!(fs::read(ro.join("f")).expect("read"), b"x");
    assert_eq!(mode_of(&ro), 0o555);
    // setgid dropped.
    assert_eq!(mode_of(&ro.join("sub")), 0o750);
    // Set after "f" and "sub" were created in it.
    assert_eq!(fs::metadata(&ro).expect("stat").mtime(), 1_000_000);
    assert_eq!((stats.dirs, stats.files, stats.entries), (2, 1, 3));
    fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn a_directory_named_twice_is_one_directory_with_the_last_mode() {
    let d = dirs();
    let tar = Tar::new().dir("d", 0o700).dir("d/", 0o750).bytes();
    run(&d.ws, tar).expect("extract");
    assert_eq!(mode_of(&d.ws.join("d")), 0o750);
}

#[test]
fn missing_parent_directories_are_created_and_counted() {
    let d = dirs();
    let stats = run(&d.ws, Tar::new().file("a/b/f", b"x").bytes()).expect("extract");
    assert!(d.ws.join("a/b").is_dir());
    assert_eq!(mode_of(&d.ws.join("a")), 0o755);
    assert_eq!((stats.dirs, stats.files, stats.entries), (2, 1, 1));
}

#[test]
fn the_root_entry_is_accepted_only_as_a_directory() {
    let d = dirs();
    let before = mode_of(&d.ws);
    let stats = run(&d.ws, Tar::new().dir("./", 0o700).bytes()).expect("extract");
    assert_eq!(stats.entries, 1);
    // The workspace root keeps its own mode.
    assert_eq!(mode_of(&d.ws), before);
    let tar = Tar::new()
        .raw(EntryType::Regular, b"./", b"", 0o644, b"")
        .bytes();
    assert_invalid(
        run(&d.ws, tar),
        "names the workspace root but is not a directory",
    );
}

#[test]
fn a_symlink_is_created_as_it_is_and_never_followed() {
    let d = dirs();
    let out = d.outside.to_str().expect("utf-8");
    let tar = Tar::new()
        .symlink("up", "../../etc/passwd")
        .symlink("out", out)
        .bytes();
    let stats = run(&d.ws, tar).expect("extract");
    assert_eq!(
        fs::read_link(d.ws.join("up")).expect("readlink"),
        Path::new("../../etc/passwd")
    );
    assert_eq!(
        fs::read_link(d.ws.join("out")).expect("readlink"),
        d.outside
    );
    assert_eq!(stats.symlinks, 2);
}

#[test]
fn a_symlink_needs_a_target_without_nul() {
    let d = dirs();
    let tar = Tar::new()
        .raw(EntryType::Symlink, b"l", b"", 0o777, b"")
        .bytes();
    assert_invalid(run(&d.ws, tar), "is a symlink without a target");
    let tar = Tar::new()
        .pax(&[("linkpath", b"a\0b")])
        .raw(EntryType::Symlink, b"l", b"x", 0o777, b"")
        .bytes();
    assert_invalid(run(&d.ws, tar), "has a symlink target with a NUL byte");
    assert!(empty(&d.ws));
}

#[test]
fn a_hard_link_shares_the_inode_of_a_file_earlier_in_the_archive() {
    let d = dirs();
    let tar = Tar::new()
        .file("dir/f", b"data")
        .hardlink("h", "dir/f")
        .hardlink("dir/h2", "./h")
        .bytes();
    let stats = run(&d.ws, tar).expect("extract");
    let ino = |p: &str| fs::metadata(d.ws.join(p)).expect("stat").ino();
    assert_eq!(ino("h"), ino("dir/f"));
    assert_eq!(ino("dir/h2"), ino("dir/f"));
    assert_eq!(fs::read(d.ws.join("h")).expect("read"), b"data");
    assert_eq!(stats.hardlinks, 2);
}

#[test]
fn a_hard_link_to_anything_but_a_file_of_the_archive_is_refused() {
    let not_earlier = "which is not a regular file earlier in the archive";
    for (tar, why) in [
        (Tar::new().hardlink("h", "f").file("f", b"x"), not_earlier),
        (Tar::new().dir("d", 0o755).hardlink("h", "d"), not_earlier),
        (Tar::new().symlink("s", "f").hardlink("h", "s"), not_earlier),
        (Tar::new().hardlink("h", ""), not_earlier),
    ] {
        let d = dirs();
        assert_invalid(run(&d.ws, tar.bytes()), why);
    }
    // A file that was in the workspace before (merge mode) is no target.
    let d = dirs();
    fs::write(d.ws.join("old"), b"x").expect("write");
    let tar = Tar::new().hardlink("h", "old").bytes();
    assert_invalid(
        run_with(&d.ws, tar, &ArchiveLimits::default(), true),
        not_earlier,
    );
}

#[test]
fn a_fifo_is_refused_unless_allowed() {
    let d = dirs();
    let fifo = || {
        Tar::new()
            .raw(EntryType::Fifo, b"p", b"", 0o640, b"")
            .bytes()
    };
    assert_invalid(
        run(&d.ws, fifo()),
        "is a FIFO (set archive.allow_fifos = true to allow FIFOs)",
    );
    assert!(empty(&d.ws));
    let limits = ArchiveLimits {
        allow_fifos: true,
        ..ArchiveLimits::default()
    };
    let stats = limited(&d.ws, fifo(), limits).expect("extract");
    let md = fs::symlink_metadata(d.ws.join("p")).expect("stat");
    assert!(md.file_type().is_fifo());
    assert_eq!(stats.fifos, 1);
}

#[test]
fn device_nodes_are_refused_even_with_fifos_allowed() {
    let limits = ArchiveLimits {
        allow_fifos: true,
        ..ArchiveLimits::default()
    };
    for kind in [EntryType::Char, EntryType::Block] {
        let d = dirs();
        let tar = Tar::new().raw(kind, b"dev", b"", 0o600, b"").bytes();
        assert_invalid(
            limited(&d.ws, tar, limits.clone()),
            "is a device node; device nodes are never extracted",
        );
        assert!(empty(&d.ws));
    }
}

#[test]
fn an_unknown_entry_type_is_refused() {
    let d = dirs();
    let tar = Tar::new()
        .raw(EntryType::new(b'V'), b"label", b"", 0o644, b"")
        .bytes();
    assert_invalid(run(&d.ws, tar), "has an unsupported type");
}

#[test]
fn gnu_long_names_and_links_are_read_whole() {
    let d = dirs();
    let long_dir = "d".repeat(120);
    let name = format!("{long_dir}/{}", "f".repeat(200));
    let target = format!("../{}", "t".repeat(150));
    let tar = Tar::new()
        .file(&name, b"x")
        .symlink(&format!("{long_dir}/link"), &target)
        .bytes();
    let stats = run(&d.ws, tar).expect("extract");
    assert_eq!(fs::read(d.ws.join(&name)).expect("read"), b"x");
    assert_eq!(
        fs::read_link(d.ws.join(&long_dir).join("link")).expect("readlink"),
        Path::new(&target)
    );
    // The long-name records are not entries.
    assert_eq!(stats.entries, 2);
}

#[test]
fn pax_records_name_the_next_entry_and_global_headers_are_skipped() {
    let d = dirs();
    let tar = Tar::new()
        .raw(
            EntryType::XGlobalHeader,
            b"global",
            b"",
            0o644,
            &pax_record("comment", b"ignored"),
        )
        .pax(&[("path", b"pax/named.txt"), ("mtime", b"2000000")])
        .raw(EntryType::Regular, b"header-name", b"", 0o644, b"abc")
        .bytes();
    let stats = run(&d.ws, tar).expect("extract");
    assert_eq!(fs::read(d.ws.join("pax/named.txt")).expect("read"), b"abc");
    assert!(!d.ws.join("header-name").exists());
    assert!(!d.ws.join("global").exists());
    assert_eq!(stats.entries, 1);
}

#[test]
fn a_pax_sparse_file_is_refused() {
    let d = dirs();
    let tar = Tar::new()
        .pax(&[("GNU.sparse.major", b"1"), ("GNU.sparse.minor", b"0")])
        .raw(EntryType::Regular, b"s", b"", 0o644, b"")
        .bytes();
    assert_invalid(run(&d.ws, tar), "is a PAX sparse file");
}

#[test]
fn a_pax_size_under_the_header_size_is_a_truncated_file() {
    let d = dirs();
    let tar = Tar::new()
        .pax(&[("size", b"5")])
        .raw(EntryType::Regular, b"f", b"", 0o644, b"0123456789")
        .bytes();
    assert_invalid(run(&d.ws, tar), "is truncated: 5 of 10 bytes");
}

#[test]
fn a_pax_size_over_the_header_size_counts_against_the_limits() {
    let tar = || {
        let mut t = Tar::new().pax(&[("size", b"600")]);
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        h.as_old_mut().name[..1].copy_from_slice(b"f");
        h.set_cksum();
        // The header says 0 bytes; 600 follow, as the PAX size says.
        t.0.append(&h, &[7u8; 600][..]).expect("append");
        t.bytes()
    };
    let d = dirs();
    let stats = run(&d.ws, tar()).expect("extract");
    assert_eq!(stats.bytes_written, 600);
    let d = dirs();
    let limits = ArchiveLimits {
        max_file_bytes: 599,
        ..ArchiveLimits::default()
    };
    assert_eq!(limit(limited(&d.ws, tar(), limits)), "max_file_bytes");
}

#[test]
fn paths_with_nul_the_reserved_name_or_long_components_are_refused() {
    let d = dirs();
    let tar = Tar::new()
        .pax(&[("path", b"a\0b")])
        .raw(EntryType::Regular, b"x", b"", 0o644, b"")
        .bytes();
    assert_invalid(run(&d.ws, tar), "contains a NUL byte");
    let tar = Tar::new().file(&format!("{RESERVED_NAME}/x"), b"").bytes();
    assert_invalid(run(&d.ws, tar), "reserved for the agent's own state");
    let tar = Tar::new().file(&"n".repeat(256), b"").bytes();
    assert_invalid(
        run(&d.ws, tar),
        "has a path component longer than 255 bytes",
    );
    assert!(empty(&d.ws));
    run(&d.ws, Tar::new().file(&"n".repeat(255), b"").bytes()).expect("255 bytes");
}

// --- duplicates and merge mode ------------------------------------------

#[test]
fn an_entry_may_not_replace_one_of_the_same_archive() {
    let twice = "appears twice in the archive";
    type Case = (fn() -> Tar, &'static str);
    let cases: [Case; 4] = [
        (|| Tar::new().file("f", b"1").file("f", b"2"), twice),
        (|| Tar::new().dir("d", 0o755).file("d", b"2"), twice),
        (|| Tar::new().file("f", b"1").symlink("f", "x"), twice),
        (
            || Tar::new().file("f", b"1").dir("f", 0o755),
            "is a directory replacing a non-directory entry of the same archive",
        ),
    ];
    for (tar, why) in cases {
        for merge in [false, true] {
            let d = dirs();
            let r = run_with(&d.ws, tar().bytes(), &ArchiveLimits::default(), merge);
            assert_invalid(r, why);
        }
    }
}

#[test]
fn merge_mode_replaces_what_was_there_before_and_only_then() {
    let d = dirs();
    fs::write(d.ws.join("file-then-dir"), b"old").expect("write");
    fs::create_dir_all(d.ws.join("dir-then-file/sub")).expect("mkdir");
    fs::write(d.ws.join("dir-then-file/sub/x"), b"old").expect("write");
    fs::write(d.ws.join("same"), b"old").expect("write");
    let tar = || {
        Tar::new()
            .dir("file-then-dir", 0o755)
            .file("dir-then-file", b"new")
            .file("same", b"new")
            .bytes()
    };
    let limits = ArchiveLimits::default();
    assert!(matches!(
        run_with(&d.ws, tar(), &limits, false),
        Err(ArchiveError::Invalid(_))
    ));
    run_with(&d.ws, tar(), &limits, true).expect("merge");
    assert!(d.ws.join("file-then-dir").is_dir());
    assert_eq!(fs::read(d.ws.join("dir-then-file")).expect("read"), b"new");
    assert_eq!(fs::read(d.ws.join("same")).expect("read"), b"new");
}

// --- confinement --------------------------------------------------------

#[test]
fn dot_dot_components_are_refused() {
    for name in [&b"../escape"[..], b"a/../../escape", b"a/.."] {
        let d = dirs();
        let tar = Tar::new()
            .raw(EntryType::Regular, name, b"", 0o644, b"x")
            .bytes();
        assert_invalid(run(&d.ws, tar), "contains a '..' component");
        assert!(empty(&d.ws) && empty(&d.outside));
        assert!(!d.ws.parent().expect("parent").join("escape").exists());
    }
}

#[test]
fn absolute_paths_are_refused() {
    let d = dirs();
    let abs = d.outside.join("abs");
    let tar = Tar::new()
        .raw(
            EntryType::Regular,
            abs.as_os_str().as_encoded_bytes(),
            b"",
            0o644,
            b"x",
        )
        .bytes();
    assert_invalid(run(&d.ws, tar), "is absolute");
    assert!(!abs.exists());
    assert!(empty(&d.ws));
}

#[test]
fn nothing_is_written_through_a_symlink_of_the_archive() {
    let cases: [fn(&str) -> Tar; 4] = [
        |t| Tar::new().symlink("l", t).file("l/f", b"x"),
        |t| Tar::new().symlink("l", t).dir("l/d", 0o755),
        |t| Tar::new().symlink("l", t).file("l/deeper/f", b"x"),
        |t| {
            Tar::new()
                .dir("a", 0o755)
                .symlink("a/l", t)
                .file("a/l/f", b"x")
        },
    ];
    for tar in cases {
        let d = dirs();
        let target = d.outside.to_str().expect("utf-8");
        let m = invalid(run(&d.ws, tar(target).bytes()));
        assert!(
            m.contains("goes through the symlink")
                && m.contains("writing through symlinks is refused"),
            "{m}"
        );
        assert!(empty(&d.outside));
    }
}

#[test]
fn nothing_is_written_through_a_symlink_already_in_the_workspace() {
    let d = dirs();
    std::os::unix::fs::symlink(&d.outside, d.ws.join("l")).expect("symlink");
    let limits = ArchiveLimits::default();
    for merge in [false, true] {
        let tar = Tar::new().file("l/f", b"x").bytes();
        let m = invalid(run_with(&d.ws, tar, &limits, merge));
        assert!(m.contains("goes through the symlink 'l'"), "{m}");
        assert!(empty(&d.outside));
    }
}

#[test]
fn a_file_replaces_a_symlink_in_the_workspace_without_following_it() {
    let d = dirs();
    let secret = d.outside.join("secret");
    fs::write(&secret, b"secret").expect("write");
    std::os::unix::fs::symlink(&secret, d.ws.join("f")).expect("symlink");
    let tar = || Tar::new().file("f", b"new").bytes();
    let limits = ArchiveLimits::default();
    assert!(matches!(
        run_with(&d.ws, tar(), &limits, false),
        Err(ArchiveError::Invalid(_))
    ));
    run_with(&d.ws, tar(), &limits, true).expect("merge");
    assert!(
        fs::symlink_metadata(d.ws.join("f"))
            .expect("stat")
            .is_file()
    );
    assert_eq!(fs::read(&secret).expect("read"), b"secret");
}

#[test]
fn a_file_below_a_file_is_refused() {
    let d = dirs();
    let tar = Tar::new().file("f", b"x").file("f/g", b"y").bytes();
    assert_invalid(run(&d.ws, tar), "is below 'f', which is not a directory");
}

#[test]
fn a_hard_link_out_of_the_workspace_is_refused() {
    let d = dirs();
    let secret = d.outside.join("secret");
    fs::write(&secret, b"secret").expect("write");
    let abs = secret.to_str().expect("utf-8");
    let tar = Tar::new().hardlink("h", abs).bytes();
    assert_invalid(run(&d.ws, tar), "is a hardlink whose target is absolute");
    let tar = Tar::new().hardlink("h", "../outside/secret").bytes();
    assert_invalid(
        run(&d.ws, tar),
        "is a hardlink whose target contains a '..' component",
    );
    // Through a symlink of the archive to the outside file: not a file of
    // the archive.
    let tar = Tar::new().symlink("s", abs).hardlink("h", "s").bytes();
    assert_invalid(
        run(&d.ws, tar),
        "which is not a regular file earlier in the archive",
    );
    assert_eq!(fs::metadata(&secret).expect("stat").nlink(), 1);
}

// --- limits -------------------------------------------------------------

fn with(f: impl FnOnce(&mut ArchiveLimits)) -> ArchiveLimits {
    let mut l = ArchiveLimits::default();
    f(&mut l);
    l
}

#[test]
fn max_entries_counts_entries_and_the_directories_they_imply() {
    let three = || Tar::new().file("a", b"").file("b", b"").dir("c", 0o755);
    let l = with(|l| l.max_entries = 3);
    limited(&dirs().ws, three().bytes(), l.clone()).expect("3 entries");
    let four = three().file("d", b"").bytes();
    assert_eq!(limit(limited(&dirs().ws, four, l.clone())), "max_entries");
    // "x/y/f" is three: two directories and the file.
    limited(&dirs().ws, Tar::new().file("x/y/f", b"").bytes(), l).expect("3 created");
    let l = with(|l| l.max_entries = 2);
    let r = limited(&dirs().ws, Tar::new().file("x/y/f", b"").bytes(), l);
    assert_eq!(limit(r), "max_entries");
}

#[test]
fn max_path_bytes_bounds_entry_paths_and_symlink_targets() {
    let l = with(|l| l.max_path_bytes = 10);
    let ok = Tar::new()
        .file("0123456789", b"")
        .symlink("s", "0123456789");
    limited(&dirs().ws, ok.bytes(), l.clone()).expect("10 bytes");
    let r = limited(
        &dirs().ws,
        Tar::new().file("0123456789a", b"").bytes(),
        l.clone(),
    );
    assert_eq!(limit(r), "max_path_bytes");
    let r = limited(
        &dirs().ws,
        Tar::new().symlink("s", "0123456789a").bytes(),
        l,
    );
    assert_eq!(limit(r), "max_path_bytes");
}

#[test]
fn max_depth_bounds_nesting() {
    let l = with(|l| l.max_depth = 3);
    let ok = Tar::new().file("a/b/c", b"").dir("d/e/f", 0o755);
    limited(&dirs().ws, ok.bytes(), l.clone()).expect("3 deep");
    for tar in [
        Tar::new().file("a/b/c/d", b""),
        Tar::new().dir("a/b/c/d/", 0o755),
    ] {
        let d = dirs();
        assert_eq!(limit(limited(&d.ws, tar.bytes(), l.clone())), "max_depth");
        assert!(empty(&d.ws));
    }
}

#[test]
fn max_file_bytes_bounds_each_file() {
    let l = with(|l| l.max_file_bytes = 10);
    limited(
        &dirs().ws,
        Tar::new().file("f", &[1; 10]).bytes(),
        l.clone(),
    )
    .expect("10 bytes");
    let d = dirs();
    let r = limited(&d.ws, Tar::new().file("f", &[1; 11]).bytes(), l);
    assert_eq!(limit(r), "max_file_bytes");
    assert!(empty(&d.ws));
}

#[test]
fn max_expanded_bytes_bounds_the_sum_of_the_files() {
    let l = with(|l| l.max_expanded_bytes = 10);
    let tar = |second: usize| {
        Tar::new()
            .file("a", &[1; 5])
            .hardlink("h", "a")
            .file("b", &vec![2; second])
            .bytes()
    };
    // A hard link adds no bytes.
    limited(&dirs().ws, tar(5), l.clone()).expect("10 bytes");
    let d = dirs();
    assert_eq!(limit(limited(&d.ws, tar(6), l)), "max_expanded_bytes");
    assert!(!d.ws.join("b").exists());
}

#[test]
fn max_header_bytes_bounds_the_metadata_before_an_entry() {
    // Between two entries the reader may read max_header_bytes + 512
    // bytes: here 4608, the PAX header block, its records and the file's
    // header block.
    let l = with(|l| l.max_header_bytes = 4096);
    let tar = |comment: usize| {
        let records = pax_record("comment", &vec![b'c'; comment]);
        let padded = records.len().div_ceil(512) * 512;
        let tar = Tar::new()
            .raw(EntryType::XHeader, b"PaxHeaders/x", b"", 0o644, &records)
            .file("f", b"x")
            .bytes();
        (tar, 512 + padded + 512)
    };
    let (ok, read) = tar(3500);
    assert_eq!(read, 4608);
    limited(&dirs().ws, ok, l.clone()).expect("4608 bytes of metadata");
    let (over, read) = tar(3600);
    assert_eq!(read, 5120);
    assert_eq!(
        limit(limited(&dirs().ws, over, l.clone())),
        "max_header_bytes"
    );
    // A GNU long name is metadata too.
    let long = format!("{}/f", "d/".repeat(2500));
    let r = limited(&dirs().ws, Tar::new().file(&long, b"").bytes(), l);
    assert_eq!(limit(r), "max_header_bytes");
}

#[test]
fn max_header_bytes_leaves_entry_data_alone() {
    // Data, even of an entry the extractor does not write (a PAX global
    // header), is read outside the metadata budget.
    let l = with(|l| l.max_header_bytes = 4096);
    let global = pax_record("comment", &vec![b'c'; 100_000]);
    let tar = Tar::new()
        .raw(EntryType::XGlobalHeader, b"g", b"", 0o644, &global)
        .file("big", &vec![1; 100_000])
        .bytes();
    limited(&dirs().ws, tar, l).expect("data is not metadata");
}

/// A gzip-compressed archive of one file of 4 MiB of zeros (about 1000:1).
fn zeros_gz() -> Vec<u8> {
    let tar = Tar::new().file("zeros", &vec![0; 4 << 20]).bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).expect("gzip");
    gz.finish().expect("gzip")
}

#[test]
fn max_compression_ratio_stops_a_bomb_after_the_grace() {
    let l = with(|l| {
        l.max_compression_ratio = 100;
        l.ratio_grace_bytes = 1 << 20;
    });
    let r = limited(&dirs().ws, zeros_gz(), l);
    assert_eq!(limit(r), "max_compression_ratio");
    // Under the ratio, or within the grace, it passes.
    let l = with(|l| {
        l.max_compression_ratio = 2000;
        l.ratio_grace_bytes = 1 << 20;
    });
    limited(&dirs().ws, zeros_gz(), l).expect("under the ratio");
    let l = with(|l| {
        l.max_compression_ratio = 100;
        l.ratio_grace_bytes = 8 << 20;
    });
    let d = dirs();
    limited(&d.ws, zeros_gz(), l).expect("within the grace");
    assert_eq!(
        fs::metadata(d.ws.join("zeros")).expect("stat").len(),
        4 << 20
    );
}

// --- the stream ---------------------------------------------------------

#[test]
fn gzip_and_zstd_are_sniffed() {
    let tar = Tar::new().file("f", b"compressed").bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    let zst = zstd::encode_all(&tar[..], 3).expect("zstd");
    for data in [gz.finish().expect("gzip"), zst] {
        let d = dirs();
        run(&d.ws, data).expect("extract");
        assert_eq!(fs::read(d.ws.join("f")).expect("read"), b"compressed");
    }
}

#[test]
fn an_archive_without_its_end_marker_is_truncated() {
    let full = Tar::new().file("f", b"x").bytes();
    let no_marker = full[..1024].to_vec();
    assert_invalid(
        run(&dirs().ws, no_marker),
        "the stream ends without the end-of-archive marker",
    );
    let cut = full[..300].to_vec();
    assert_invalid(run(&dirs().ws, cut), "ends inside a 512-byte tar block");
}

#[test]
fn data_after_the_end_marker_is_refused() {
    let mut two = Tar::new().file("a", b"x").bytes();
    two.extend(Tar::new().file("b", b"y").bytes());
    assert_invalid(
        run(&dirs().ws, two),
        "data after the tar end-of-archive marker",
    );
    let mut padded = Tar::new().file("a", b"x").bytes();
    padded.extend([0u8; 10240]);
    run(&dirs().ws, padded).expect("zero padding");
}

#[test]
fn data_that_is_no_tar_archive_is_named() {
    let text = "not an archive\n".repeat(100).into_bytes();
    assert_invalid(run(&dirs().ws, text), "not an archive this agent reads");
}

// --- the writer pool ----------------------------------------------------

/// Files of every size (empty, small, exactly one piece, several pieces)
/// come out the same whatever the number of writers, with their modes and
/// mtimes (set after their last byte).
#[test]
fn files_are_written_whole_with_their_metadata_whatever_the_writers() {
    use super::writers::PIECE;
    let sizes = [0, 1, 4096, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 17];
    let mut tar = Tar::new().dir("d", 0o750);
    for (i, n) in sizes.iter().enumerate() {
        let data: Vec<u8> = (0..*n).map(|b| (b * 7 + i) as u8).collect();
        tar = tar.file_mode(&format!("d/f{i}"), &data, 0o640 + (i as u32 % 2) * 0o100);
    }
    let tar = tar.bytes();
    for writers in [0, 1, 2, 3] {
        let d = dirs();
        let l = with(|l| l.extract_writers = writers);
        let stats = limited(&d.ws, tar.clone(), l).expect("extract");
        assert_eq!(stats.files, sizes.len() as u64, "{writers} writers");
        for (i, n) in sizes.iter().enumerate() {
            let p = d.ws.join(format!("d/f{i}"));
            let data: Vec<u8> = (0..*n).map(|b| (b * 7 + i) as u8).collect();
            assert!(
                fs::read(&p).expect("read") == data,
                "{writers} writers: f{i}"
            );
            assert_eq!(mode_of(&p), 0o640 + (i as u32 % 2) * 0o100);
            assert_eq!(fs::metadata(&p).expect("stat").mtime(), 1_000_000);
        }
        assert_eq!(mode_of(&d.ws.join("d")), 0o750);
    }
}

/// A limit hit part-way: the error is the limit's, and every file handed to
/// a writer before it is complete when `extract` returns (the pool is
/// joined first), nothing after it was created.
#[test]
fn a_limit_hit_mid_stream_leaves_no_writer_running() {
    let mut tar = Tar::new();
    for i in 0..200 {
        tar = tar.file(&format!("f{i:03}"), &[b'x'; 1000]);
    }
    let d = dirs();
    let l = with(|l| {
        l.max_expanded_bytes = 100_500;
        l.extract_writers = 2;
    });
    assert_eq!(limit(limited(&d.ws, tar.bytes(), l)), "max_expanded_bytes");
    let mut names: Vec<_> = fs::read_dir(&d.ws)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 100);
    for n in names {
        let md = fs::metadata(d.ws.join(&n)).expect("stat");
        assert_eq!((md.len(), md.mtime()), (1000, 1_000_000), "{n:?}");
    }
}

/// A writer's failure is the extraction's error, as the same cause
/// (a full disk is `DiskFull`), and later hand-offs say so too.
#[test]
fn a_writer_s_error_surfaces_as_its_archive_error() {
    use super::fsops::FileMeta;
    use super::writers::{Dest, Piece, Writers};
    use std::sync::Arc;
    let piece = |file: fs::File, w: &Writers, last: bool| Piece {
        file: Dest::Open(Arc::new(file)),
        data: w.buffer(),
        len: 10,
        last: last.then_some(FileMeta {
            mode: 0o644,
            mtime: 0,
            chmod: false,
            owner: None,
        }),
        path: Arc::new("f".into()),
    };
    let w = Writers::start(2).expect("writers");
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    w.send(0, piece(full, &w, true)).expect("queued");
    match w.finish() {
        Err(ArchiveError::DiskFull(m)) => assert!(m.contains("writing f"), "{m}"),
        other => panic!("expected DiskFull, got {other:?}"),
    }

    let d = dirs();
    fs::write(d.ws.join("ro"), b"").expect("file");
    let w = Writers::start(1).expect("writers");
    let ro = fs::File::open(d.ws.join("ro")).expect("open");
    w.send(0, piece(ro, &w, false)).expect("queued");
    let mut later = Ok(());
    for _ in 0..1000 {
        let f = fs::File::open(d.ws.join("ro")).expect("open");
        later = w.send(0, piece(f, &w, false));
        if later.is_err() {
            break;
        }
    }
    assert!(
        matches!(&later, Err(ArchiveError::Io { context, .. }) if context == "writing f"),
        "{later:?}"
    );
}

/// Buffers are reused: however many pieces go through, the pool keeps no
/// more than its bound.
#[test]
fn the_writer_pool_s_buffers_are_bounded() {
    use super::writers::{Dest, Piece, Writers};
    use std::sync::Arc;
    let d = dirs();
    let w = Writers::start(2).expect("writers");
    let f = Arc::new(fs::File::create(d.ws.join("big")).expect("create"));
    for i in 0..500 {
        let piece = Piece {
            file: Dest::Open(f.clone()),
            data: w.buffer(),
            len: 1,
            last: None,
            path: Arc::new("big".into()),
        };
        w.send(i % 2, piece).expect("queued");
        assert!(w.free_buffers() <= w.max_buffers());
    }
    w.finish().expect("written");
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

/// Files the writers create are in place before any entry could meet them:
/// a duplicate, a directory or symlink of the same name, a path below a
/// file, a hard link to it; each gives the error it gives without writers.
#[test]
fn entries_meeting_a_file_the_writers_create_see_it_created() {
    let cases: [(Tar, &str); 5] = [
        (Tar::new().file("a", b"1").file("a", b"2"), "appears twice"),
        (
            Tar::new().file("a", b"1").dir("a", 0o755),
            "is a directory replacing a non-directory",
        ),
        (
            Tar::new().file("a", b"1").symlink("a", "b"),
            "appears twice",
        ),
        (
            Tar::new().file("a", b"1").file("a/b", b"2"),
            "which is not a directory",
        ),
        (Tar::new().dir("d", 0o755).file("d/a", b"1"), ""),
    ];
    for (tar, needle) in cases {
        let tar = tar.bytes();
        for writers in [0, 2] {
            let l = with(|l| l.extract_writers = writers);
            let r = limited(&dirs().ws, tar.clone(), l);
            if needle.is_empty() {
                r.expect("extract");
            } else {
                assert_invalid(r, needle);
            }
        }
    }
    let d = dirs();
    let mut tar = Tar::new();
    for i in 0..50 {
        tar = tar.file(&format!("f{i}"), &[b'x'; 3000]);
    }
    let tar = tar.hardlink("h", "f49").bytes();
    limited(&d.ws, tar, with(|l| l.extract_writers = 2)).expect("extract");
    let (f, h) = (d.ws.join("f49"), d.ws.join("h"));
    assert_eq!(fs::read(&h).expect("read"), vec![b'x'; 3000]);
    assert_eq!(
        fs::metadata(&f).expect("stat").ino(),
        fs::metadata(&h).expect("stat").ino()
    );
}
