//! The workspace root's own attributes, put back when it is emptied.
//!
//! The root belongs to the tenant (its servers and scripts work there), so a
//! tenant can change the directory itself: its mode (0 locks every later
//! server out; 1777 or an ACL shows the next tenant what it chose), its
//! extended attributes (a message to the next lease), its inode flags
//! (`chattr +S` makes every later write synchronous, `+A`, `+d`, ...) and its
//! times. A Clear
//! (Release, Reset) swaps or empties only what is below the root; this puts
//! the root back as the agent found it at start, so nothing of one lease
//! reaches the next through it.

use std::ffi::CStr;
use std::os::fd::BorrowedFd;

use rustix::fs::{Gid, IFlags, Uid};
use rustix::fs::{Mode, Timestamps, fchmod, fchown, flistxattr, fremovexattr, fstat, futimens};

use super::error::{WorkspaceError, sys};

/// Most extended-attribute names a root may carry that are read at once
/// (the kernel's own list limit is 64 KiB).
const XATTR_LIST_BYTES: usize = 64 << 10;

/// The root's mode, owner and inode flags when the agent opened it.
#[derive(Debug, Clone, Copy)]
pub struct RootAttrs {
    mode: u32,
    uid: u32,
    gid: u32,
    /// `None` on a filesystem without inode flags.
    flags: Option<IFlags>,
}

impl RootAttrs {
    pub fn capture(root: BorrowedFd<'_>) -> Result<RootAttrs, WorkspaceError> {
        let st = fstat(root).map_err(|e| WorkspaceError::io("stat workspace", sys(e)))?;
        let flags = match rustix::fs::ioctl_getflags(root) {
            Ok(f) => Some(f),
            Err(e) if no_flags(e) => None,
            Err(e) => {
                return Err(WorkspaceError::io(
                    "reading the workspace's inode flags",
                    sys(e),
                ));
            }
        };
        Ok(RootAttrs {
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            flags,
        })
    }

    /// Puts the root back: owner, mode, inode flags, no extended attributes
    /// a tenant can set (`user.*`, POSIX ACLs), times now. Other attributes
    /// (a security module's) are left as the system keeps them.
    pub fn restore(&self, root: BorrowedFd<'_>) -> Result<(), WorkspaceError> {
        let io = |what: &'static str| move |e| WorkspaceError::io(what, sys(e));
        if let Some(flags) = self.flags {
            set_flags(root, flags).map_err(io("restoring the workspace's inode flags"))?;
        }
        if rustix::process::geteuid().is_root() {
            let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
            fchown(root, Some(uid), Some(gid)).map_err(io("restoring the workspace's owner"))?;
        }
        fchmod(root, Mode::from_raw_mode(self.mode))
            .map_err(io("restoring the workspace's mode"))?;
        remove_tenant_xattrs(root)?;
        let now = rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        };
        futimens(
            root,
            &Timestamps {
                last_access: now,
                last_modification: now,
            },
        )
        .map_err(io("restoring the workspace's times"))
    }
}

/// A filesystem (or kernel) without inode flags answers so.
fn no_flags(e: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    matches!(
        e,
        Errno::NOTTY | Errno::NOTSUP | Errno::INVAL | Errno::NOSYS
    )
}

/// Sets a directory's inode flags to `flags` unless they are so already; a
/// filesystem without them has none to set.
fn set_flags(dir: BorrowedFd<'_>, flags: IFlags) -> rustix::io::Result<()> {
    match rustix::fs::ioctl_getflags(dir) {
        Ok(now) if now == flags => Ok(()),
        Ok(_) => rustix::fs::ioctl_setflags(dir, flags),
        Err(e) if no_flags(e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Takes off a directory that outlives its tenant (a home kept because it
/// is a mount point) what the tenant put on it: inode flags and the
/// extended attributes of [`remove_tenant_xattrs`].
pub fn scrub(dir: BorrowedFd<'_>) -> Result<(), WorkspaceError> {
    let io = |e| WorkspaceError::io("clearing a directory's inode flags", sys(e));
    match rustix::fs::ioctl_getflags(dir) {
        // The flags `chattr` sets, off; the filesystem's own (ext4's
        // extents, ...) stay.
        Ok(now) => set_flags(dir, now.difference(IFlags::all())).map_err(io)?,
        Err(e) if no_flags(e) => {}
        Err(e) => return Err(io(e)),
    }
    remove_tenant_xattrs(dir)
}

/// Removes every `user.*` attribute and POSIX ACL of the root.
fn remove_tenant_xattrs(root: BorrowedFd<'_>) -> Result<(), WorkspaceError> {
    let mut buf = vec![0u8; XATTR_LIST_BYTES];
    let n = match flistxattr(root, &mut buf[..]) {
        Ok(n) => n,
        // A filesystem without extended attributes has none to remove.
        Err(rustix::io::Errno::NOTSUP) => return Ok(()),
        Err(e) => return Err(WorkspaceError::io("listing the workspace's xattrs", sys(e))),
    };
    for name in buf[..n].split_inclusive(|b| *b == 0) {
        let Ok(name) = CStr::from_bytes_with_nul(name) else {
            continue;
        };
        let bytes = name.to_bytes();
        if bytes.starts_with(b"user.") || bytes.starts_with(b"system.posix_acl_") {
            match fremovexattr(root, name) {
                Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                Err(e) => {
                    return Err(WorkspaceError::io(
                        "removing a tenant's xattr from the workspace",
                        sys(e),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn mode_xattrs_and_times_come_back() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = std::fs::File::open(d.path()).expect("open");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let attrs = RootAttrs::capture(root.as_fd()).expect("capture");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let had_xattr = rustix::fs::fsetxattr(
            root.as_fd(),
            "user.msg",
            b"hi",
            rustix::fs::XattrFlags::empty(),
        )
        .is_ok();
        attrs.restore(root.as_fd()).expect("restore");
        let mode = std::fs::metadata(d.path())
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        if had_xattr {
            let mut buf = [0u8; 256];
            let n = flistxattr(root.as_fd(), &mut buf[..]).expect("list");
            assert!(!buf[..n].windows(8).any(|w| w == b"user.msg"), "xattr left");
        }
    }
}
