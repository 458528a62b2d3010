use super::*;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;

fn dir_fd(p: &Path) -> File {
    File::open(p).expect("open dir")
}

/// FIFOs, sockets and links in a tree are unlinked, never opened (a FIFO
/// would block), never followed.
#[test]
fn never_opens_a_fifo_nor_follows_a_link() {
    let t = tempfile::tempdir().expect("tempdir");
    let tree = t.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).expect("mkdir");
    rustix::fs::mkfifoat(rustix::fs::CWD, tree.join("a/fifo"), Mode::RWXU).expect("fifo");
    rustix::fs::mkfifoat(rustix::fs::CWD, tree.join("a/b/fifo"), Mode::RWXU).expect("fifo");
    let _sock = std::os::unix::net::UnixListener::bind(tree.join("a/sock")).expect("sock");
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(outside.join("keep"), "keep").expect("write");
    std::os::unix::fs::symlink(&outside, tree.join("a/b/link")).expect("link");
    std::os::unix::fs::symlink(&outside, tree.join("top-link")).expect("link");
    remove_at(dir_fd(t.path()).as_fd(), OsStr::new("tree"), &tree).expect("remove");
    assert!(!tree.exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).expect("read"),
        "keep"
    );
}

/// A link given as the tree itself is removed, not followed.
#[test]
fn a_link_named_is_unlinked() {
    let t = tempfile::tempdir().expect("tempdir");
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(outside.join("keep"), "keep").expect("write");
    std::os::unix::fs::symlink(&outside, t.path().join("l")).expect("link");
    remove_path(&t.path().join("l")).expect("remove");
    assert!(outside.join("keep").exists());
    assert!(empty_path(&t.path().join("missing")).is_err());
    remove_path(&t.path().join("missing")).expect("a missing name is not an error");
}

/// Directories of mode 0 and 0500 go too (the remover opens them up when
/// it lacks root's bypass).
#[test]
fn unreadable_and_read_only_directories_go() {
    let t = tempfile::tempdir().expect("tempdir");
    let tree = t.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b/c")).expect("mkdir");
    std::fs::write(tree.join("a/b/c/f"), "x").expect("write");
    std::fs::set_permissions(tree.join("a/b/c"), std::fs::Permissions::from_mode(0o500))
        .expect("chmod");
    std::fs::set_permissions(tree.join("a/b"), std::fs::Permissions::from_mode(0o000))
        .expect("chmod");
    Remover::with_max_open(2)
        .remove_at(dir_fd(t.path()).as_fd(), OsStr::new("tree"), &tree)
        .expect("remove");
    assert!(!tree.exists());
}

/// Emptying keeps the directory itself, and everything below goes, also
/// when chains are deeper than the open bound.
#[test]
fn empty_dir_keeps_the_directory() {
    let t = tempfile::tempdir().expect("tempdir");
    let home = t.path().join("home");
    let mut deep = home.clone();
    for _ in 0..50 {
        deep.push("d");
    }
    std::fs::create_dir_all(&deep).expect("mkdir");
    std::fs::write(deep.join("f"), "x").expect("write");
    std::fs::write(home.join("top"), "x").expect("write");
    Remover::with_max_open(3)
        .empty_dir(dir_fd(&home).as_fd(), &home)
        .expect("empty");
    assert!(home.is_dir());
    assert_eq!(list(dir_fd(&home).as_fd()).expect("list").len(), 0);
}

/// An error names the path it happened at and is returned, not logged.
#[test]
fn an_error_names_its_path() {
    let t = tempfile::tempdir().expect("tempdir");
    let e = empty_path(&t.path().join("nothing")).expect_err("missing");
    assert!(e.to_string().contains("nothing"), "{e}");
}
