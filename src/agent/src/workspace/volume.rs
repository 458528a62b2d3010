//! Keeping the agent's bookkeeping out of the tree tenants see.
//!
//! The journal, the staging trees and the old trees of a swap must be on
//! the workspace's filesystem (a swap is renames). When the workspace is a
//! directory, they sit next to it (`txn`); when it is a mount point (a VM's
//! disk, an isolated slot's bind mount) the only place is inside it, where
//! every listing, tree and dump of the root would show it. So, as root and
//! PID 1 (its mounts are its own; the caller checks), the agent takes the
//! mount for itself: it binds the volume at [`VOLUME_DIR`]
//! (only root can pass it), keeps the tree in `<volume>/tree`, and
//! binds that tree over the workspace path. Tenants and servers see
//! exactly the task's files at the workspace path; the agent works on
//! `<volume>/tree`, with its state next to it on the same mount.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, statx};

/// Where the agent keeps the workspace's volume when it takes it over: a
/// directory of its own (0700, root), never under the workspace.
pub const VOLUME_DIR: &str = "/run/sandbox-agent-volume";

/// The tree's name inside the volume.
const TREE: &str = "tree";

/// Why the workspace's volume cannot be taken over.
#[derive(Debug, thiserror::Error)]
#[error("separating the workspace {workspace} from the agent's state: {what}: {source}")]
pub struct VolumeError {
    workspace: String,
    what: String,
    #[source]
    source: io::Error,
}

/// Whether `path` is the root of a mount (`statx`'s `STATX_ATTR_MOUNT_ROOT`;
/// false when the kernel cannot tell).
pub fn is_mount_root(path: &Path) -> io::Result<bool> {
    let st = statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )?;
    let known = st.stx_attributes_mask;
    let attrs = st.stx_attributes;
    Ok(known.contains(StatxAttributes::MOUNT_ROOT) && attrs.contains(StatxAttributes::MOUNT_ROOT))
}

/// The directory the agent works on for `workspace`: `workspace` itself,
/// unless it is a mount point and the agent is root, when the volume is
/// taken over (see the module) and `<volume>/tree` is returned. Idempotent:
/// a workspace already showing the tree is left as it is. Entries a former
/// layout left at the volume's root (beside the agent's old inner state
/// directory) move into the tree.
pub fn separate(workspace: &Path, volume: &Path) -> Result<PathBuf, VolumeError> {
    let err = |what: &str| {
        let (workspace, what) = (workspace.display().to_string(), what.to_owned());
        move |source| VolumeError {
            workspace,
            what,
            source,
        }
    };
    let tree = volume.join(TREE);
    if same_dir(workspace, &tree) {
        return Ok(tree);
    }
    if !nix::unistd::geteuid().is_root() || !is_mount_root(workspace).map_err(err("statx"))? {
        return Ok(workspace.to_owned());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(volume)
        .map_err(err("creating the volume's mount point"))?;
    std::fs::set_permissions(volume, std::fs::Permissions::from_mode(0o700))
        .map_err(err("making the volume's mount point root's"))?;
    bind(workspace, volume).map_err(err("binding the volume"))?;
    let root_meta = std::fs::metadata(volume).map_err(err("reading the volume's root"))?;
    match std::fs::DirBuilder::new().mode(0o755).create(&tree) {
        Ok(()) => {
            // The tree takes the root's owner (the tenant's, as chown'd by
            // an earlier start) and mode; the volume's root becomes root's.
            std::os::unix::fs::chown(&tree, Some(root_meta.uid()), Some(root_meta.gid()))
                .map_err(err("giving the tree the root's owner"))?;
            std::fs::set_permissions(&tree, root_meta.permissions())
                .map_err(err("giving the tree the root's mode"))?;
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err("creating the tree")(e)),
    }
    std::os::unix::fs::chown(volume, Some(0), Some(0))
        .map_err(err("making the volume's root root's"))?;
    std::fs::set_permissions(volume, std::fs::Permissions::from_mode(0o700))
        .map_err(err("closing the volume's root"))?;
    adopt_former_entries(volume).map_err(err("moving a former layout's entries into the tree"))?;
    bind(&tree, workspace).map_err(err("binding the tree over the workspace"))?;
    Ok(tree)
}

/// Moves what a former layout kept at the volume's root (the task's files
/// beside `.sandbox-agent`) into the tree; the agent's own names stay.
fn adopt_former_entries(volume: &Path) -> io::Result<()> {
    let keep = |n: &std::ffi::OsStr| {
        n == TREE
            || n == super::txn::INNER_STATE_NAME
            || n.to_str()
                .is_some_and(|s| s.starts_with('.') && s.ends_with(".sandbox-agent"))
    };
    for e in std::fs::read_dir(volume)? {
        let name = e?.file_name();
        if !keep(&name) {
            std::fs::rename(volume.join(&name), volume.join(TREE).join(&name))?;
        }
    }
    Ok(())
}

fn bind(from: &Path, to: &Path) -> io::Result<()> {
    mount(Some(from), to, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(io::Error::from)
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_directory_is_not_taken_over() {
        let d = tempfile::tempdir().expect("tempdir");
        let ws = d.path().join("ws");
        std::fs::create_dir(&ws).expect("ws");
        assert!(!is_mount_root(&ws).expect("statx"));
        let got = separate(&ws, &d.path().join("volume")).expect("separate");
        assert_eq!(got, ws);
        assert!(!d.path().join("volume").exists());
    }

    #[test]
    fn the_root_of_the_filesystem_is_a_mount_root() {
        assert!(is_mount_root(Path::new("/")).expect("statx"));
    }
}
