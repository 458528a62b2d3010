//! Limits: each `[archive]` limit, checked while writing.

use super::*;

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
