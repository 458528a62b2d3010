//! sandbox-archive: a sandbox workspace ⇄ a tar stream.
//!
//! - [`extract`]: tar (plain, gzip or zstd) → a directory, confined
//!   ([`confine`]: nothing lands outside it or through a symlink) and
//!   limited ([`limits`]: bytes, entries, path length, depth) while writing.
//! - [`pack`]: a directory → tar, walked by file descriptors.
//! - [`codec`]: format sniffing, decoding, parallel gzip/zstd encoding.
//! - [`stream`]: bounded channels between gRPC streams and the blocking
//!   archive code, in chunks of at most [`MAX_CHUNK_BYTES`].
//!
//! Every failure is an [`ArchiveError`] naming its cause. The agent's
//! workspace (staging, journaled swap, one operation at a time) builds on
//! this crate; `sandboxctl upload` packs with it; the fuzz target exercises
//! [`extract`] alone.

pub mod codec;
pub mod confine;
pub mod error;
pub mod extract;
pub mod limits;
pub mod pack;
pub mod stream;

pub use codec::Compression;
pub use error::ArchiveError;
pub use limits::{ArchiveLimits, MAX_CHUNK_BYTES};
