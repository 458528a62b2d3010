//! Confinement: no entry lands outside the tree or through a symlink.

use super::*;

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
