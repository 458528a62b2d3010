//! Emptying a temporary directory at Release and Reset: by handles,
//! whatever a tenant put there, but never what a backend mounted below it.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};

/// Removes the entries of `dir` (those owned by `owner` if given) by
/// handles, never following a symlink; `dir` itself stays as it is.
pub fn empty_dir(dir: &Path, owner: Option<u32>) -> io::Result<()> {
    let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let fd = match rustix::fs::open(dir, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    // What is mounted below `dir` (a file the process backend binds there
    // read-only) is not a temporary file: it and the directories leading
    // to it stay.
    let mounted = mounts_below(dir);
    let mut first = None;
    for name in sandbox_archive::confine::list(fd.as_fd())? {
        let path = dir.join(&name);
        if mounted.iter().any(|m| m.starts_with(&path)) {
            continue;
        }
        if let Some(uid) = owner {
            match rustix::fs::statat(&fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if st.st_uid == uid => {}
                _ => continue,
            }
        }
        if let Err(e) = sandbox_archive::confine::remove_at(fd.as_fd(), &name, &path) {
            first.get_or_insert_with(|| io::Error::other(e.to_string()));
        }
    }
    first.map_or(Ok(()), Err)
}

/// The mount points strictly below `dir`, from `/proc/self/mountinfo`.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mount(m)))
        .filter(|m| m.starts_with(dir) && m != dir)
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mount("/tmp/a\\040b"), "/tmp/a b");
        assert_eq!(unescape_mount("/tmp/x\\134y"), "/tmp/x\\y");
        assert_eq!(unescape_mount("/tmp/plain"), "/tmp/plain");
    }

    #[test]
    fn empty_dir_removes_everything_or_only_the_owners() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("tmp");
        std::fs::create_dir_all(d.join("dir/sub")).unwrap();
        std::fs::write(d.join("file"), "x").unwrap();
        std::os::unix::fs::symlink(t.path(), d.join("link")).unwrap();
        std::fs::write(t.path().join("outside"), "keep").unwrap();
        let me = std::fs::metadata(&d).unwrap().uid();
        empty_dir(&d, Some(me + 1)).unwrap();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 3);
        empty_dir(&d, None).unwrap();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        assert_eq!(
            std::fs::read_to_string(t.path().join("outside")).unwrap(),
            "keep"
        );
    }
}
