//! Packing: what lands in the archive, and what is refused or skipped.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::codec::Compression;
use crate::extract::{ExtractOptions, extract};
use crate::limits::ArchiveLimits;

fn pack_dir_at(root: &Path, opts: &PackOptions<'_>) -> Result<(Vec<u8>, PackStats), ArchiveError> {
    let dir = fs::File::open(root).expect("open");
    pack(dir.as_fd(), opts, Vec::new())
}

/// The paths of an archive's entries, in order.
fn names(tar: &[u8]) -> Vec<String> {
    let mut a = tar::Archive::new(tar);
    a.entries()
        .expect("entries")
        .map(|e| String::from_utf8_lossy(&e.expect("entry").path_bytes()).into_owned())
        .collect()
}

#[test]
fn a_tree_packs_and_extracts_back_the_same() {
    let src = tempfile::tempdir().expect("tempdir");
    let s = src.path();
    fs::create_dir_all(s.join("a/b")).expect("mkdir");
    fs::write(s.join("a/b/file"), b"content").expect("write");
    fs::set_permissions(s.join("a/b/file"), fs::Permissions::from_mode(0o640)).expect("chmod");
    fs::create_dir(s.join("empty")).expect("mkdir");
    let long = "l".repeat(150);
    fs::write(s.join(&long), b"long name").expect("write");
    // 101 bytes as "./NAME", 99 without: the tar crate's own path would
    // fit it in the header by dropping the "./".
    let edge = "e".repeat(99);
    fs::write(s.join(&edge), b"").expect("write");
    let far = format!("../{}", "t".repeat(150));
    std::os::unix::fs::symlink("a/b/file", s.join("near")).expect("symlink");
    std::os::unix::fs::symlink(&far, s.join("far")).expect("symlink");
    nix::unistd::mkfifo(&s.join("fifo"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");

    let (tar, stats) = pack_dir_at(s, &PackOptions::default()).expect("pack");
    assert_eq!(
        (
            stats.files,
            stats.dirs,
            stats.symlinks,
            stats.skipped_special
        ),
        (3, 3, 2, 1)
    );
    assert_eq!(stats.content_bytes, 16);
    assert!(stats.changed.is_empty());
    let listed = names(&tar);
    assert_eq!(listed[0], "./");
    // Every name keeps its "./", a long link's too.
    assert!(listed.iter().all(|n| n.starts_with("./")), "{listed:?}");
    assert!(listed.contains(&format!("./{edge}")), "{listed:?}");
    assert!(listed.contains(&"./a/b/".to_owned()), "{listed:?}");

    let dst = tempfile::tempdir().expect("tempdir");
    let d = dst.path();
    let root = fs::File::open(d).expect("open");
    let limits = ArchiveLimits::default();
    let opts = ExtractOptions {
        limits: &limits,
        compression: Compression::Auto,
        owner: None,
        merge: false,
    };
    extract(std::io::Cursor::new(tar), root.as_fd(), &opts).expect("extract");
    assert_eq!(fs::read(d.join("a/b/file")).expect("read"), b"content");
    let mode = fs::metadata(d.join("a/b/file"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o640);
    assert_eq!(fs::read(d.join(&long)).expect("read"), b"long name");
    assert!(d.join("empty").is_dir());
    assert_eq!(
        fs::read_link(d.join("near")).expect("link"),
        Path::new("a/b/file")
    );
    assert_eq!(fs::read_link(d.join("far")).expect("link"), Path::new(&far));
    assert!(!d.join("fifo").exists());
}

#[test]
fn max_depth_bounds_the_walk() {
    let src = tempfile::tempdir().expect("tempdir");
    fs::create_dir_all(src.path().join("a/b/c")).expect("mkdir");
    let opts = |max_depth| PackOptions {
        max_depth,
        ..PackOptions::default()
    };
    pack_dir_at(src.path(), &opts(3)).expect("3 deep");
    match pack_dir_at(src.path(), &opts(2)) {
        Err(ArchiveError::Limit { limit, detail }) => {
            assert_eq!(limit, "max_depth");
            assert!(detail.contains("'a/b/c'"), "{detail}");
        }
        other => panic!("expected a max_depth limit, got {other:?}"),
    }
}

#[test]
fn hidden_and_excluded_names_are_left_out_with_what_is_below() {
    let src = tempfile::tempdir().expect("tempdir");
    let s = src.path();
    fs::create_dir_all(s.join(".state/x")).expect("mkdir");
    fs::create_dir_all(s.join("sub/.state")).expect("mkdir");
    fs::create_dir_all(s.join("skip/deep")).expect("mkdir");
    fs::write(s.join("skip/deep/f"), b"x").expect("write");
    fs::write(s.join("keep"), b"x").expect("write");
    let exclude = |p: &Path| p == Path::new("skip");
    let opts = PackOptions {
        hidden: Some(OsStr::new(".state")),
        exclude: Some(&exclude),
        ..PackOptions::default()
    };
    let (tar, _) = pack_dir_at(s, &opts).expect("pack");
    assert_eq!(names(&tar), vec!["./", "./keep", "./sub/", "./sub/.state/"]);
}

#[test]
fn a_cancelled_walk_ends_with_cancelled() {
    let src = tempfile::tempdir().expect("tempdir");
    fs::create_dir(src.path().join("d")).expect("mkdir");
    let cancelled = AtomicBool::new(true);
    let opts = PackOptions {
        cancelled: Some(&cancelled),
        ..PackOptions::default()
    };
    assert!(matches!(
        pack_dir_at(src.path(), &opts),
        Err(ArchiveError::Cancelled(_))
    ));
}

#[test]
fn a_cancelled_dump_stops_inside_a_file() {
    let src = tempfile::tempdir().expect("tempdir");
    let p = src.path().join("f");
    fs::write(&p, b"abc").expect("write");
    let cancelled = AtomicBool::new(true);
    let mut r = Exact::new(File::open(&p).expect("open"), 3, Some(&cancelled));
    let e = r.read(&mut [0; 8]).expect_err("cancelled");
    assert_eq!(e.to_string(), "the dump was cancelled");
}

#[test]
fn a_file_that_shrank_is_padded_to_its_size() {
    let src = tempfile::tempdir().expect("tempdir");
    let p = src.path().join("f");
    fs::write(&p, b"abc").expect("write");
    let mut r = Exact::new(File::open(&p).expect("open"), 6, None);
    let mut out = Vec::new();
    r.read_to_end(&mut out).expect("read");
    assert_eq!(out, b"abc\0\0\0");
    assert!(r.short);
}

/// A file swapped for a FIFO between the walk's stat and its open (a
/// tenant writes the workspace): the open never blocks (no writer ever
/// comes) and the entry is left out as changed; a FIFO the walk sees is
/// skipped as special.
#[test]
fn a_fifo_never_blocks_the_pack() {
    let src = tempfile::tempdir().expect("tempdir");
    let s = src.path();
    nix::unistd::mkfifo(&s.join("fifo"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    fs::write(s.join("file"), "x").expect("write");
    let dir = fs::File::open(s).expect("open");
    let mut stats = PackStats::default();
    let got = open_file(
        dir.as_fd(),
        std::ffi::OsStr::new("fifo"),
        Path::new("fifo"),
        &mut stats,
    )
    .expect("open_file");
    assert!(got.is_none());
    assert_eq!(stats.changed, ["fifo"]);
    let (tar, stats) = pack_dir_at(s, &PackOptions::default()).expect("pack");
    assert_eq!(stats.skipped_special, 1);
    assert_eq!(names(&tar), ["./", "./file"]);
}

/// A sparse file packs byte for byte: holes at its start, between data
/// and at its end come out as zeros, its data as written, whatever the
/// reads' sizes; and a file that shrinks while it is read is padded.
#[test]
fn sparse_files_pack_byte_for_byte() {
    use std::os::unix::fs::FileExt;
    let src = tempfile::tempdir().expect("tempdir");
    let path = src.path().join("sparse");
    let f = fs::File::create(&path).expect("create");
    let size: u64 = 5 << 20;
    f.set_len(size).expect("set_len");
    let mut want = vec![0u8; size as usize];
    // Data at 1 MiB + 3 (unaligned), at 3 MiB, and in the last bytes.
    for (at, len, byte) in [
        (1 << 20 | 3, 70_001, 0xa5u8),
        (3 << 20, 4096, 0x5a),
        (size - 10, 10, 0x33),
    ] {
        f.write_all_at(&vec![byte; len], at).expect("write");
        want[at as usize..at as usize + len].fill(byte);
    }
    for chunk in [1usize, 4093, 8192, 1 << 20] {
        let file = fs::File::open(&path).expect("open");
        let mut r = Exact::new(file, size, None);
        let mut got = Vec::with_capacity(size as usize);
        let mut buf = vec![0xffu8; chunk];
        loop {
            let n = r.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(got == want, "chunk {chunk}: the bytes differ");
        assert!(!r.short);
    }
    // Shrunk after opening: the rest reads as zeros, reported short.
    let file = fs::File::open(&path).expect("open");
    let mut r = Exact::new(file, size, None);
    f.set_len(2 << 20).expect("shrink");
    let mut got = Vec::new();
    r.read_to_end(&mut got).expect("read");
    assert_eq!(got.len() as u64, size);
    assert!(got[..2 << 20] == want[..2 << 20] && got[2 << 20..].iter().all(|b| *b == 0));
    assert!(r.short, "a shrunk file is reported");
}
