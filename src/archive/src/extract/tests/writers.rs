//! The writer pool (`archive.extract_writers`): files whole whatever the
//! number of writers, limits and errors mid-stream, bounded buffers, and
//! entries that meet a file a writer creates.

use super::*;

/// Files of every size (empty, small, exactly one piece, several pieces)
/// come out the same whatever the number of writers, with their modes and
/// mtimes (set after their last byte).
#[test]
fn files_are_written_whole_with_their_metadata_whatever_the_writers() {
    use super::super::writers::BATCH;
    let sizes = [0, 1, 4096, BATCH - 1, BATCH, BATCH + 1, 3 * BATCH + 17];
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

/// Hands `w` one file of `n` bytes (`fill`), opened by the caller, as
/// the extractor does: straight into the open batch, closed with `last`.
fn hand(w: &mut super::super::writers::Writers, file: fs::File, n: usize, last: bool) {
    use super::super::meta::FileMeta;
    use super::super::writers::Dest;
    use std::sync::Arc;
    let mut left = n;
    let mut dest = Dest::Open(file);
    loop {
        let room = w.room().expect("room");
        let k = left.min(room.len());
        room[..k].fill(b'x');
        w.filled(k);
        left -= k;
        if left == 0 {
            let meta = last.then_some(FileMeta {
                mode: 0o644,
                mtime: 0,
                chmod: false,
                owner: None,
            });
            w.part(dest, meta, Arc::new("f".into())).expect("part");
            return;
        }
        if w.full() {
            let d = std::mem::replace(&mut dest, Dest::Same);
            w.part(d, None, Arc::new("f".into())).expect("part");
        }
    }
}

/// A writer's failure is the extraction's error, as the same cause
/// (a full disk is `DiskFull`), and later hand-offs say so too.
#[test]
fn a_writer_s_error_surfaces_as_its_archive_error() {
    use super::super::writers::{BATCH, Writers};
    let mut w = Writers::start(2, None).expect("writers");
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    hand(&mut w, full, 10, true);
    match w.finish() {
        Err(ArchiveError::DiskFull(m)) => assert!(m.contains("writing f"), "{m}"),
        other => panic!("expected DiskFull, got {other:?}"),
    }

    let d = dirs();
    fs::write(d.ws.join("ro"), b"").expect("file");
    let mut w = Writers::start(1, None).expect("writers");
    let ro = fs::File::open(d.ws.join("ro")).expect("open");
    // A whole batch: sent at once, so the writer fails on it.
    hand(&mut w, ro, BATCH, false);
    let mut later = Ok(());
    for _ in 0..1000 {
        later = w.room().map(|_| ());
        if later.is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(
        matches!(&later, Err(ArchiveError::Io { context, .. }) if context == "writing f"),
        "{later:?}"
    );
}

/// Buffers are reused and batches bounded: however many files go
/// through, small or spanning batches, the pool keeps no more buffers than
/// its bound, and no batch holds more than its files.
#[test]
fn the_writer_pool_s_buffers_are_bounded() {
    use super::super::writers::{BATCH, MAX_OPEN, Writers};
    let d = dirs();
    let mut w = Writers::start(2, None).expect("writers");
    for i in 0..500 {
        let f = fs::File::create(d.ws.join(format!("f{i}"))).expect("create");
        let n = if i % 50 == 0 { 2 * BATCH + 1 } else { i };
        hand(&mut w, f, n, true);
        assert!(w.free_buffers() <= w.max_buffers());
        assert!(
            w.parts_open() < MAX_OPEN,
            "files opened by the extractor per batch"
        );
    }
    w.finish().expect("written");
    for i in 0..500 {
        let n = if i % 50 == 0 { 2 * BATCH + 1 } else { i };
        let md = fs::metadata(d.ws.join(format!("f{i}"))).expect("stat");
        assert_eq!(md.len(), n as u64, "f{i}");
    }
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
