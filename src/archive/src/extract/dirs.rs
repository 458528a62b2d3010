//! The directories whose mode and mtime are applied once extraction ends.
//!
//! They are held as a tree of names (each at most 255 bytes) indexed by a
//! hash of the full path, so memory grows with the number of distinct
//! directories and not with their path lengths, and a directory the
//! archive names again (tar allows it) is held once, its last entry
//! winning as in GNU tar.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Parent of a top-level directory.
const ROOT: usize = usize::MAX;

struct Node {
    parent: usize,
    /// Range of the name in `DirTree::names`.
    name: (usize, usize),
    /// Mode and mtime from the archive; `None` for an ancestor kept only to
    /// name its children.
    meta: Option<(u32, u64)>,
}

#[derive(Default)]
pub(super) struct DirTree {
    hasher: RandomState,
    index: HashMap<u64, usize>,
    nodes: Vec<Node>,
    names: Vec<u8>,
}

impl DirTree {
    /// Records (or updates) the mode and mtime of the directory `path`, a
    /// normalized relative path.
    pub(super) fn set(&mut self, path: &Path, mode: u32, mtime: u64) {
        let n = self.node(path.as_os_str().as_bytes());
        if let Some(node) = self.nodes.get_mut(n) {
            node.meta = Some((mode, mtime));
        }
    }

    /// The node of `path`, adding it and any ancestor not yet known. The
    /// search goes up from the path itself, so a directory whose parent is
    /// known (the common case) costs one or two lookups.
    fn node(&mut self, path: &[u8]) -> usize {
        let ends: Vec<usize> = path
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .map(|(i, _)| i)
            .chain(std::iter::once(path.len()))
            .collect();
        let mut known = ends.len();
        let mut parent = ROOT;
        while known > 0 {
            let key = self.hasher.hash_one(&path[..ends[known - 1]]);
            if let Some(&n) = self.index.get(&key) {
                parent = n;
                break;
            }
            known -= 1;
        }
        for j in known..ends.len() {
            let start = if j == 0 { 0 } else { ends[j - 1] + 1 };
            let at = self.names.len();
            self.names.extend_from_slice(&path[start..ends[j]]);
            self.nodes.push(Node {
                parent,
                name: (at, self.names.len()),
                meta: None,
            });
            parent = self.nodes.len() - 1;
            let key = self.hasher.hash_one(&path[..ends[j]]);
            self.index.insert(key, parent);
        }
        parent
    }

    fn path(&self, mut n: usize) -> PathBuf {
        let mut parts = Vec::new();
        while let Some(node) = self.nodes.get(n) {
            parts.push(std::ffi::OsStr::from_bytes(
                &self.names[node.name.0..node.name.1],
            ));
            n = node.parent;
        }
        parts.iter().rev().collect()
    }

    /// The recorded directories, deepest first (creating entries inside a
    /// directory changes its mtime, so children are done before parents),
    /// with their mode and mtime.
    pub(super) fn deepest_first(self) -> impl Iterator<Item = (PathBuf, u32, u64)> {
        // Parents are always added before their children.
        let mut depth = vec![0u32; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            if node.parent != ROOT {
                depth[i] = depth[node.parent] + 1;
            }
        }
        let mut order: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].meta.is_some())
            .collect();
        order.sort_by_key(|&i| std::cmp::Reverse(depth[i]));
        order.into_iter().filter_map(move |i| {
            let (mode, mtime) = self.nodes[i].meta?;
            Some((self.path(i), mode, mtime))
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_named_twice_is_held_once_and_the_last_entry_wins() {
        let mut t = DirTree::default();
        let long = "x".repeat(200);
        let p = PathBuf::from(format!("a/{long}/c"));
        for i in 0..1000 {
            t.set(&p, 0o700, i);
        }
        t.set(Path::new("a"), 0o755, 5);
        assert_eq!(t.len(), 3);
        let all: Vec<_> = t.deepest_first().collect();
        assert_eq!(
            all,
            vec![(p.clone(), 0o700, 999), (PathBuf::from("a"), 0o755, 5)]
        );
    }

    #[test]
    fn siblings_share_their_ancestors() {
        let mut t = DirTree::default();
        let prefix = "p/".repeat(100);
        for i in 0..100 {
            t.set(&PathBuf::from(format!("{prefix}d{i}")), 0o755, 0);
        }
        // 100 ancestors once, 100 leaves.
        assert_eq!(t.len(), 200);
        let got: Vec<_> = t.deepest_first().map(|(p, _, _)| p).collect();
        assert_eq!(got.len(), 100);
        assert!(got.iter().all(|p| p.starts_with(&prefix)));
    }
}
