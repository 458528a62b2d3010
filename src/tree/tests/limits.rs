//! The removal under the bounds an adversary picks: a 100,000-level chain
//! and generated trees (depth, width, links, FIFOs, sockets, sparse files),
//! on a thread with a 64 KiB stack, in a process whose open-file limit
//! leaves room for little more than the removal's own bound.
//!
//! One test function: the open-file limit is the process's, so nothing
//! else may run beside it.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rustix::fs::{Mode, OFlags};
use sandbox_tree::{MAX_OPEN_DIRS, Remover, remove_at};

const SMALL_STACK: usize = 64 << 10;

/// A generated tree.
#[derive(Debug, Clone)]
enum Node {
    File { sparse: bool },
    Link { outside: bool },
    Fifo,
    Socket,
    Dir { mode: u32, children: Vec<Node> },
}

fn node() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(|sparse| Node::File { sparse }),
        any::<bool>().prop_map(|outside| Node::Link { outside }),
        Just(Node::Fifo),
        Just(Node::Socket),
    ];
    leaf.prop_recursive(40, 400, 6, |inner| {
        (
            prop_oneof![Just(0o755u32), Just(0o500), Just(0o000), Just(0o1777)],
            prop::collection::vec(inner, 0..6),
        )
            .prop_map(|(mode, children)| Node::Dir { mode, children })
    })
}

/// Makes `n` as `name` in `at`; directories' modes are set after their
/// children.
fn make(
    at: &Path,
    name: &str,
    n: &Node,
    outside: &Path,
    keep: &mut Vec<std::os::unix::net::UnixListener>,
) {
    let p = at.join(name);
    match n {
        Node::File { sparse } => {
            let f = std::fs::File::create(&p).expect("file");
            if *sparse {
                f.set_len(1 << 40).expect("sparse");
            }
        }
        Node::Link { outside: o } => {
            let to = if *o {
                outside.to_owned()
            } else {
                PathBuf::from("..")
            };
            std::os::unix::fs::symlink(to, &p).expect("link");
        }
        Node::Fifo => rustix::fs::mkfifoat(rustix::fs::CWD, &p, Mode::RWXU).expect("fifo"),
        Node::Socket => {
            // Socket paths are short: bind in the directory by a relative
            // name is not possible, so long paths make a FIFO instead.
            if p.as_os_str().len() < 100 {
                keep.push(std::os::unix::net::UnixListener::bind(&p).expect("socket"));
            } else {
                rustix::fs::mkfifoat(rustix::fs::CWD, &p, Mode::RWXU).expect("fifo");
            }
        }
        Node::Dir { mode, children } => {
            std::fs::create_dir(&p).expect("dir");
            for (k, c) in children.iter().enumerate() {
                make(&p, &format!("{k}"), c, outside, keep);
            }
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).expect("chmod");
        }
    }
}

/// A chain of `depth` directories under `root/name`, made by handles (no
/// path is ever longer than one component), a file at its bottom.
fn chain(root: &Path, name: &str, depth: usize) {
    let dir = |fd: &OwnedFd, n: &str| {
        rustix::fs::mkdirat(fd, n, Mode::RWXU).expect("mkdir");
        rustix::fs::openat(
            fd,
            n,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open")
    };
    let top =
        rustix::fs::open(root, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).expect("open");
    let mut cur = dir(&top, name);
    for _ in 0..depth {
        cur = dir(&cur, "d");
    }
    rustix::fs::openat(&cur, "bottom", OFlags::CREATE | OFlags::WRONLY, Mode::RUSR).expect("file");
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Runs `f` on a thread with a 64 KiB stack.
fn small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .stack_size(SMALL_STACK)
        .spawn(f)
        .expect("thread")
        .join()
        .expect("the removal's thread panicked (a stack overflow aborts the process instead)")
}

#[test]
fn any_tree_goes_under_a_descriptor_limit_on_a_small_stack() {
    // In memory when the machine has a tmpfs there: the same removal, not
    // a journal's pace for a million metadata changes.
    let shm = Path::new("/dev/shm");
    let t = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("tempdir");
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(outside.join("keep"), "keep").expect("write");

    // Room for what is open now, the removal's own bound and a few more:
    // a removal that opened a directory per level would fail at once.
    let limit = (open_fds() + MAX_OPEN_DIRS + 8) as u64;
    let old = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(limit),
            maximum: old.maximum,
        },
    )
    .expect("setrlimit");

    // The chain: 100,000 levels, with the default bound.
    chain(t.path(), "chain", 100_000);
    let dir = t.path().to_owned();
    small_stack(move || {
        let fd = rustix::fs::open(&dir, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())
            .expect("open");
        remove_at(fd.as_fd(), OsStr::new("chain"), &dir.join("chain")).expect("remove the chain");
    });
    assert!(!t.path().join("chain").exists());

    // Generated trees, with a small bound so that moving up is exercised.
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let base = t.path().to_owned();
    let outside2 = outside.clone();
    runner
        .run(&(node(), 1usize..5), move |(n, max_open)| {
            let mut keep = Vec::new();
            make(&base, "tree", &n, &outside2, &mut keep);
            let dir = base.clone();
            let r = small_stack(move || {
                let fd = rustix::fs::open(&dir, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())
                    .expect("open");
                Remover::with_max_open(max_open)
                    .remove_at(fd.as_fd(), OsStr::new("tree"), &dir.join("tree"))
                    .map_err(|e| e.to_string())
            });
            prop_assert!(r.is_ok(), "{:?}", r);
            prop_assert!(!base.join("tree").exists());
            let kept = std::fs::read_to_string(outside2.join("keep")).ok();
            prop_assert_eq!(kept.as_deref(), Some("keep"));
            Ok(())
        })
        .expect("every generated tree is removed");
}
