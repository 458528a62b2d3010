//! Creating entries as their owner. When the extractor runs as root and
//! every entry must belong to another user, the extracting thread takes that
//! user's filesystem identity (`setfsuid`/`setfsgid`, which are per thread)
//! for the extraction: each file and directory is then created with its
//! owner, and the `fchown` per entry, one syscall in five for small files,
//! is not needed. It also means the kernel checks every creation with the
//! owner's permissions rather than root's, and root's capabilities over
//! files (`CAP_DAC_OVERRIDE`, `CAP_CHOWN`, `CAP_FOWNER`, …) are off on that
//! thread meanwhile.
//!
//! Only where nothing but this extraction has been in the tree: never in
//! merge mode (replacing what the previous workspace held may need root's
//! rights), and only into a root the owner already owns and may write.
//! Writer threads take the same identity on their own ([`AsOwner::take`]).

use std::os::fd::BorrowedFd;

use nix::unistd::{Gid, Uid, setfsgid, setfsuid};

use super::ExtractOptions;

/// While it lives, this thread's filesystem identity is the owner's.
pub(super) struct AsOwner {
    /// The identity to go back to: (fsuid, fsgid).
    before: (Uid, Gid),
}

impl AsOwner {
    /// Takes the owner's filesystem identity on this thread when it
    /// applies (see the module); `None` leaves everything as it was.
    pub(super) fn enter(
        root: BorrowedFd<'_>,
        opts: &ExtractOptions<'_>,
    ) -> Option<(AsOwner, (u32, u32))> {
        let (uid, gid) = opts.owner?;
        if opts.merge || uid == 0 {
            return None;
        }
        if !rustix::process::geteuid().is_root() {
            return None;
        }
        let st = rustix::fs::fstat(root).ok()?;
        if st.st_uid != uid || st.st_gid != gid || st.st_mode & 0o300 != 0o300 {
            return None;
        }
        Self::take(uid, gid).map(|guard| (guard, (uid, gid)))
    }

    /// Takes the filesystem identity `uid:gid` on this thread; `None` if
    /// it did not take (then nothing changed).
    pub(super) fn take(uid: u32, gid: u32) -> Option<AsOwner> {
        // The group first, while the fsuid is still root's.
        let gid_before = setfsgid(Gid::from_raw(gid));
        let uid_before = setfsuid(Uid::from_raw(uid));
        let guard = AsOwner {
            before: (uid_before, gid_before),
        };
        // Both calls answer the previous value whether or not they worked:
        // asking again tells. If either did not take, the guard undoes it.
        let took = setfsuid(Uid::from_raw(uid)).as_raw() == uid
            && setfsgid(Gid::from_raw(gid)).as_raw() == gid;
        took.then_some(guard)
    }
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        // The uid first: setting the fsgid back needs root's fsuid.
        setfsuid(self.before.0);
        setfsgid(self.before.1);
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io::Cursor;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::Path;

    use tar::{Builder, EntryType, Header};

    use super::super::{ExtractOptions, extract};
    use crate::codec::Compression;
    use crate::error::ArchiveError;
    use crate::limits::ArchiveLimits;

    const OWNER: u32 = 4242;

    /// A directory with modes applied last, a file in it, a symlink and a
    /// hard link to it, a file under implicit directories; `then` more.
    fn archive(then: &[(&str, EntryType, &str)]) -> Vec<u8> {
        let mut b = Builder::new(Vec::new());
        let mut add = |path: &str, kind: EntryType, link: &str, mode: u32, data: &[u8]| {
            let mut h = Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(mode);
            h.set_mtime(1_000_000);
            h.set_size(data.len() as u64);
            if kind == EntryType::Regular || kind == EntryType::Directory {
                b.append_data(&mut h, path, data).expect("append");
            } else {
                b.append_link(&mut h, path, link).expect("append");
            }
        };
        add("ro/", EntryType::Directory, "", 0o555, b"");
        add("ro/f", EntryType::Regular, "", 0o644, b"data");
        add("ro/l", EntryType::Symlink, "f", 0o777, b"");
        add("h", EntryType::Link, "ro/f", 0o644, b"");
        add("x/y/z", EntryType::Regular, "", 0o600, b"deep");
        for (path, kind, link) in then {
            add(path, *kind, link, 0o644, b"");
        }
        b.into_inner().expect("finish")
    }

    fn extract_as(ws: &Path, data: Vec<u8>, writers: usize) -> Result<(), ArchiveError> {
        let root = fs::File::open(ws).expect("open ws");
        let l = ArchiveLimits {
            extract_writers: writers,
            ..ArchiveLimits::default()
        };
        let opts = ExtractOptions {
            limits: &l,
            compression: Compression::Auto,
            owner: Some((OWNER, OWNER)),
            merge: false,
        };
        extract(Cursor::new(data), root.as_fd(), &opts).map(|_| ())
    }

    /// This thread's filesystem uid and gid (the 4th field of each line).
    fn fs_ids() -> (u32, u32) {
        let status = fs::read_to_string("/proc/thread-self/status").expect("status");
        let field = |key: &str| -> u32 {
            let line = status.lines().find(|l| l.starts_with(key)).expect(key);
            line.split_whitespace()
                .nth(4)
                .expect("fs id")
                .parse()
                .expect("id")
        };
        (field("Uid:"), field("Gid:"))
    }

    fn owners(ws: &Path) -> Vec<(String, u32, u32)> {
        ["ro", "ro/f", "ro/l", "h", "x", "x/y", "x/y/z"]
            .iter()
            .map(|p| {
                let m = fs::symlink_metadata(ws.join(p)).expect(p);
                (p.to_string(), m.uid(), m.gid())
            })
            .collect()
    }

    /// Root, a root it has given to the owner, and whether root's own
    /// rights are back afterwards: a root-only directory it can write in.
    fn setup(give_root: bool) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
        if !rustix::process::geteuid().is_root() {
            // CI runs the tests as root: a skip there would leave this
            // untested without a word.
            let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
            assert!(
                !ci,
                "creating files as another user needs root, and CI=true: the test command must run as root in CI"
            );
            eprintln!("skipped: creating files as another user needs root");
            return None;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let ws = tmp.path().join("ws");
        fs::create_dir(&ws).expect("ws");
        if give_root {
            std::os::unix::fs::chown(&ws, Some(OWNER), Some(OWNER)).expect("chown");
        }
        let mine = tmp.path().join("root-only");
        fs::create_dir(&mine).expect("dir");
        fs::set_permissions(&mine, fs::Permissions::from_mode(0o700)).expect("chmod");
        Some((tmp, ws))
    }

    fn root_is_back(tmp: &tempfile::TempDir) {
        assert_eq!(
            fs_ids(),
            (0, 0),
            "the thread's filesystem identity is root's again"
        );
        // With the owner's identity this would be EACCES.
        fs::write(tmp.path().join("root-only/after"), b"x").expect("root writes again");
    }

    /// With or without writer threads (which take the identity too).
    #[test]
    fn entries_are_created_as_their_owner_and_the_thread_is_root_again() {
        for writers in [0, 1, 2] {
            let Some((tmp, ws)) = setup(true) else { return };
            extract_as(&ws, archive(&[]), writers).expect("extract");
            for (p, u, g) in owners(&ws) {
                assert_eq!((u, g), (OWNER, OWNER), "{p}, {writers} writers");
            }
            let m = fs::metadata(ws.join("ro")).expect("ro");
            assert_eq!(
                m.mode() & 0o777,
                0o555,
                "the directory's mode, applied last"
            );
            root_is_back(&tmp);
        }
    }

    /// A root the owner does not own: each entry is given to the owner.
    #[test]
    fn without_the_root_entries_are_still_given_to_the_owner() {
        for writers in [0, 1] {
            let Some((tmp, ws)) = setup(false) else {
                return;
            };
            extract_as(&ws, archive(&[]), writers).expect("extract");
            for (p, u, g) in owners(&ws) {
                assert_eq!((u, g), (OWNER, OWNER), "{p}, {writers} writers");
            }
            root_is_back(&tmp);
        }
    }

    /// An archive refused part-way still gives the thread back to root.
    #[test]
    fn a_refused_archive_leaves_the_thread_root() {
        let Some((tmp, ws)) = setup(true) else { return };
        let bad = archive(&[
            ("esc", EntryType::Symlink, "/etc"),
            ("esc/passwd", EntryType::Regular, ""),
        ]);
        let e = extract_as(&ws, bad, 1).expect_err("through a symlink");
        assert!(matches!(e, ArchiveError::Invalid(_)), "{e:?}");
        root_is_back(&tmp);
    }
}
