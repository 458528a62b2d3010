//! Entry types: files, directories, symlinks, hard links, FIFOs, devices, PAX and GNU records.

use super::*;

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
    sparse_tar_of(4096)
}

/// A GNU sparse file with 5 bytes of data at 1024 and a hole to `real`.
fn sparse_tar_of(real: u64) -> Vec<u8> {
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::GNUSparse);
    h.set_mode(0o644);
    h.set_size(5);
    let gnu = h.as_gnu_mut().expect("gnu");
    gnu.sparse[0].set_offset(1024);
    gnu.sparse[0].set_length(5);
    gnu.sparse[1].set_offset(real);
    gnu.sparse[1].set_length(0);
    gnu.set_real_size(real);
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

/// A few hundred bytes declaring a huge sparse file: the zeros written for
/// its holes count against the compression ratio, like a bomb's.
#[test]
fn a_gnu_sparse_file_s_holes_count_against_the_compression_ratio() {
    let d = dirs();
    let l = with(|l| {
        l.max_compression_ratio = 100;
        l.ratio_grace_bytes = 1 << 20;
    });
    assert_eq!(
        limit(limited(&d.ws, sparse_tar_of(64 << 20), l)),
        "max_compression_ratio"
    );
    let written = fs::metadata(d.ws.join("sparse")).map_or(0, |m| m.len());
    assert!(written <= 2 << 20, "stopped early: {written} bytes written");
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
    assert_invalid(run(&d.ws, tar), "has an unsupported type 'V'");
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
