//! The slots' id blocks: each slot's 65,536 subordinate ids, claimed
//! machine-wide so two hosts never give one uid to two sandboxes.

use std::path::Path;

use super::{IDS_PER_SLOT, Isolation, IsolationError, io};

impl Isolation {
    /// Takes the lowest free id block for the new slot `dir`, machine-wide:
    /// each block in use is a symlink `BLOCK_REGISTRY/<n>` to its slot's
    /// directory, made atomically, so two hosts of one user (two data
    /// dirs) never give a uid to two sandboxes. A link whose slot is gone
    /// is taken over. The block is also recorded in `dir/uid_block`.
    pub(in crate::pool) fn take_block(&self, dir: &Path) -> Result<u32, IsolationError> {
        let registry = Path::new(BLOCK_REGISTRY);
        std::fs::create_dir_all(registry)
            .map_err(io(format!("creating {}", registry.display())))?;
        // One taker at a time, machine-wide: two takers of one stale link
        // would otherwise both remove it and both believe the block theirs.
        let lock_path = registry.join(".lock");
        let lock = std::fs::File::create(&lock_path)
            .map_err(io(format!("creating {}", lock_path.display())))?;
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| io(format!("locking {}", lock_path.display()))(e.into()))?;
        for block in 0..self.blocks {
            let link = registry.join(block.to_string());
            let taken = match std::os::unix::fs::symlink(dir, &link) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A slot that is gone (a host stopped uncleanly) frees
                    // its block.
                    let stale = std::fs::read_link(&link).is_ok_and(|t| !t.exists());
                    stale
                        && std::fs::remove_file(&link).is_ok()
                        && std::os::unix::fs::symlink(dir, &link).is_ok()
                }
                Err(e) => return Err(io(format!("creating {}", link.display()))(e)),
            };
            if taken {
                std::fs::write(dir.join("uid_block"), block.to_string())
                    .map_err(io(format!("writing {}/uid_block", dir.display())))?;
                return Ok(block);
            }
        }
        Err(IsolationError::Exhausted(self.blocks))
    }

    pub(super) fn ids(&self, block: u32) -> (u32, u32) {
        (
            self.uid_start + block * IDS_PER_SLOT,
            self.gid_start + block * IDS_PER_SLOT,
        )
    }
}

/// Where the id blocks in use on this machine are claimed (see
/// [`Isolation::take_block`]).
const BLOCK_REGISTRY: &str = "/run/sandbox-host/uid-blocks";

/// Frees the id block the slot `dir` holds, if the registry still gives it
/// to that slot.
pub(super) fn release_block(dir: &Path) {
    let Some(block) = std::fs::read_to_string(dir.join("uid_block"))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
    else {
        return;
    };
    let link = Path::new(BLOCK_REGISTRY).join(block.to_string());
    if std::fs::read_link(&link).is_ok_and(|t| t == dir) {
        let _ = std::fs::remove_file(&link);
    }
}

/// The first range of `user` (by name or uid) in a subordinate id file.
pub(super) fn subids(file: &str, user: &str, uid: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.trim().split(':');
        let (name, start, count) = (f.next()?, f.next()?, f.next()?);
        if name != user && name != uid.to_string() {
            return None;
        }
        let (start, count) = (start.parse().ok()?, count.parse::<u32>().ok()?);
        (count >= IDS_PER_SLOT).then_some((start, count))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subordinate_ranges_are_found_by_name_or_uid() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("subuid");
        std::fs::write(&f, "alice:100000:65536\n1001:300000:131072\nbob:5:10\n").unwrap();
        let f = f.to_str().unwrap();
        assert_eq!(subids(f, "alice", 1000), Some((100000, 65536)));
        assert_eq!(subids(f, "carol", 1001), Some((300000, 131072)));
        // Too small for one slot.
        assert_eq!(subids(f, "bob", 7), None);
        assert_eq!(subids(f, "dave", 8), None);
    }
}
