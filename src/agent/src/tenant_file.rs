//! Reading a file from a tree a tenant can write (an execution's `work/`,
//! the workspace), as the agent (root): the one way the agent does it.
//!
//! - The path is resolved beneath the tree's directory handle
//!   (`openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, `O_NOFOLLOW`): a
//!   symlink anywhere on the way is refused, never followed.
//! - It is first opened `O_PATH` (nothing is opened for reading: a FIFO
//!   does not block, a device is never opened) and must be a regular file;
//!   then opened for reading `O_NONBLOCK` and checked again by `fstat`
//!   (the same inode), so a swap in between is refused too.
//! - At most `cap` bytes are read; a longer file is refused.
//!
//! Errors name the file and what it is, never its content.

use std::io::{self, Read};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, OFlags};

/// Why a tenant's file was not read. The message names the file, never
/// what is in it.
#[derive(Debug, thiserror::Error)]
pub enum TenantFileError {
    #[error("{path} is a symbolic link (or lies behind one); it must be a regular file")]
    Symlink { path: PathBuf },
    #[error("{path} is {what}; it must be a regular file")]
    NotRegular { path: PathBuf, what: &'static str },
    #[error("{path} is larger than {cap} bytes ({key})")]
    TooLarge {
        path: PathBuf,
        cap: u64,
        key: &'static str,
    },
    #[error("{path} was replaced while it was being opened")]
    Swapped { path: PathBuf },
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What a file type is, for a message.
pub fn describe(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO (named pipe)",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "not a regular file",
    }
}

/// Opens `rel` beneath `dir` for reading, only if it is a regular file
/// (see the module). `Ok(None)`: there is no such file.
pub fn open_regular(
    dir: BorrowedFd<'_>,
    rel: &Path,
) -> Result<Option<(std::fs::File, rustix::fs::Stat)>, TenantFileError> {
    let path = rel.to_owned();
    let err = |e: io::Error| match e.raw_os_error() {
        Some(nix::libc::ELOOP) => TenantFileError::Symlink { path: path.clone() },
        Some(nix::libc::EXDEV) => TenantFileError::Symlink { path: path.clone() },
        _ => TenantFileError::Io {
            path: path.clone(),
            source: e,
        },
    };
    let probe = match sandbox_archive::confine::open(dir, rel, OFlags::PATH) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let st = rustix::fs::fstat(&probe).map_err(|e| err(e.into()))?;
    let t = FileType::from_raw_mode(st.st_mode);
    if t == FileType::Symlink {
        return Err(TenantFileError::Symlink { path });
    }
    if t != FileType::RegularFile {
        return Err(TenantFileError::NotRegular {
            path,
            what: describe(t),
        });
    }
    let fd = match sandbox_archive::confine::open(
        dir,
        rel,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
    ) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(TenantFileError::Swapped { path });
        }
        Err(e) => return Err(err(e)),
    };
    let st2 = rustix::fs::fstat(&fd).map_err(|e| err(e.into()))?;
    if FileType::from_raw_mode(st2.st_mode) != FileType::RegularFile
        || (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino)
    {
        return Err(TenantFileError::Swapped { path });
    }
    Ok(Some((std::fs::File::from(fd), st2)))
}

/// Reads `rel` beneath `dir` (see the module), at most `cap` bytes (`key`
/// names the setting in the message). `Ok(None)`: there is no such file.
pub fn read_capped(
    dir: BorrowedFd<'_>,
    rel: &Path,
    cap: u64,
    key: &'static str,
) -> Result<Option<Vec<u8>>, TenantFileError> {
    let Some((f, _)) = open_regular(dir, rel)? else {
        return Ok(None);
    };
    let mut out = Vec::new();
    f.take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|source| TenantFileError::Io {
            path: rel.to_owned(),
            source,
        })?;
    if out.len() as u64 > cap {
        return Err(TenantFileError::TooLarge {
            path: rel.to_owned(),
            cap,
            key,
        });
    }
    Ok(Some(out))
}

/// The size of `rel` beneath `dir` if it is a regular file (`None`: no
/// such file); anything else is refused as [`open_regular`] does.
pub fn regular_size(dir: BorrowedFd<'_>, rel: &Path) -> Result<Option<u64>, TenantFileError> {
    Ok(open_regular(dir, rel)?.map(|(_, st)| st.st_size as u64))
}

/// Opens directory `rel` beneath `dir`, never through a symlink.
pub fn open_dir(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<std::os::fd::OwnedFd> {
    sandbox_archive::confine::open_dir(dir, rel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn dir() -> (tempfile::TempDir, std::fs::File) {
        let t = tempfile::tempdir().unwrap();
        let f = std::fs::File::open(t.path()).unwrap();
        (t, f)
    }

    #[test]
    fn a_regular_file_is_read_and_a_missing_one_is_none() {
        let (t, d) = dir();
        std::fs::write(t.path().join("p.txt"), "curl\n").unwrap();
        let got = read_capped(d.as_fd(), Path::new("p.txt"), 64, "k").unwrap();
        assert_eq!(got.as_deref(), Some(&b"curl\n"[..]));
        assert!(
            read_capped(d.as_fd(), Path::new("none"), 64, "k")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn over_the_cap_is_refused_without_its_content() {
        let (t, d) = dir();
        std::fs::write(t.path().join("big"), "SECRET".repeat(100)).unwrap();
        let e = read_capped(d.as_fd(), Path::new("big"), 64, "exec.max_packages_bytes")
            .unwrap_err()
            .to_string();
        assert!(e.contains("larger than 64 bytes"), "{e}");
        assert!(e.contains("exec.max_packages_bytes"), "{e}");
        assert!(!e.contains("SECRET"), "{e}");
        // Exactly the cap is fine.
        std::fs::write(t.path().join("cap"), "x".repeat(64)).unwrap();
        assert!(read_capped(d.as_fd(), Path::new("cap"), 64, "k").is_ok());
    }

    #[test]
    fn symlinks_anywhere_are_refused() {
        let (t, d) = dir();
        std::fs::write(t.path().join("secret"), "SECRET").unwrap();
        std::os::unix::fs::symlink(t.path().join("secret"), t.path().join("abs")).unwrap();
        std::os::unix::fs::symlink("secret", t.path().join("rel")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", t.path().join("zero")).unwrap();
        std::fs::create_dir(t.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(t.path(), t.path().join("sub/up")).unwrap();
        for p in ["abs", "rel", "zero", "sub/up/secret"] {
            let e = read_capped(d.as_fd(), Path::new(p), 64, "k").unwrap_err();
            assert!(matches!(e, TenantFileError::Symlink { .. }), "{p}: {e}");
            assert!(!e.to_string().contains("SECRET"), "{e}");
        }
        let e = read_capped(d.as_fd(), Path::new("../x"), 64, "k").unwrap_err();
        assert!(matches!(e, TenantFileError::Symlink { .. }), "{e}");
    }

    #[test]
    fn a_fifo_a_directory_and_a_socket_are_refused_without_blocking() {
        let (t, d) = dir();
        nix::unistd::mkfifo(&t.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::fs::create_dir(t.path().join("dir")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(t.path().join("sock")).unwrap();
        // No writer ever opens the FIFO: a blocking open would hang here.
        for (p, what) in [
            ("fifo", "a FIFO (named pipe)"),
            ("dir", "a directory"),
            ("sock", "a socket"),
        ] {
            let e = read_capped(d.as_fd(), Path::new(p), 64, "k").unwrap_err();
            assert!(
                matches!(e, TenantFileError::NotRegular { what: w, .. } if w == what),
                "{p}: {e}"
            );
            assert!(e.to_string().contains(p), "{e}");
        }
    }
}
