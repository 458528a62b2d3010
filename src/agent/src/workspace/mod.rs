//! The workspace: the directory the MCP servers work in, loaded from and
//! dumped to tar archives.
//!
//! [`Workspace`] runs one operation at a time (Initialize, Dump or Clear;
//! a second one is refused, naming the first). The operations are blocking
//! and run on a blocking thread; [`Workspace::initialize_streamed`] and
//! [`Workspace::dump_streamed`] connect them to streams through bounded
//! channels ([`stream`]).
//!
//! - [`extract`]: tar → directory, confined ([`confine`]) and limited
//!   ([`limits`]).
//! - [`txn`]: staging, journaled swap, crash recovery.
//! - [`pack`]: directory → tar, for Dump and for `sandboxctl upload`.
//! - [`codec`]: gzip/zstd sniffing, decoding, parallel encoding.
//! - `ops`: [`Workspace`] itself, which ties these together.
//! - [`error`]: [`WorkspaceError`], the archive's [`ArchiveError`] and the
//!   workspace's own causes.
//! - [`data_path`]: the second path (e.g. `/data`) showing the workspace.
//! - [`volume`]: a mounted workspace's bookkeeping kept out of its tree.
//! - `root`: the root's own mode, owner, xattrs and times, put back at Clear.
//! - `transfer`: Initialize and Dump as streams (the blocking operation on
//!   its own thread, bounded channels, cancellation by a Release).
//!
//! The archive code (`extract`, `pack`, `codec`, `confine`, `limits`,
//! `stream`) is the `sandbox-archive` crate, re-exported here; `txn`,
//! `ops` and `error` are the agent's own.

pub use sandbox_archive::{codec, confine, extract, limits, pack, stream};
mod clone;
pub mod data_path;
pub mod error;
mod fault;
mod fence;
mod moves;
mod ops;
pub mod root;
mod transfer;
pub mod txn;
pub mod volume;

pub use codec::Compression;
pub use error::{ArchiveError, WorkspaceError};
pub use fence::Fence;
pub use limits::{ArchiveLimits, MAX_CHUNK_BYTES};
pub use ops::{DumpRequest, InitRequest, InitStats, OpGuard, Workspace};
pub use transfer::{DumpItem, DumpMsg, DumpSummary, TransferError};
