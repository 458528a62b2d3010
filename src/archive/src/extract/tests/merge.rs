//! Duplicates, and what merge mode may replace.

use super::*;

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
