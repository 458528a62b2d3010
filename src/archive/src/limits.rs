//! Limits and settings of archive transfer (`[archive]` in the config).

use serde::{Deserialize, Serialize};

/// Largest data chunk a client may send in one `InitializeRequest`.
pub const MAX_CHUNK_BYTES: usize = 1 << 20;

/// Most writer threads one extraction may use.
pub const MAX_EXTRACT_WRITERS: usize = 16;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArchiveLimits {
    /// Compressed bytes one Initialize may send.
    pub max_archive_bytes: u64,
    /// Total size of all file contents in one archive.
    pub max_expanded_bytes: u64,
    /// Entries (files, dirs, links) in one archive.
    pub max_entries: u64,
    /// Bytes of one entry's path.
    pub max_path_bytes: usize,
    /// Tar metadata the reader takes in before one entry's data: its header
    /// blocks, a GNU long name or long link, PAX records (xattrs included)
    /// and a GNU sparse map. The reader holds these in memory, so this
    /// bounds what one hostile header can make the agent allocate. At least
    /// `2 × max_path_bytes + 2048` (a long name and a long link).
    pub max_header_bytes: u64,
    /// Directory nesting of one entry's path, in extraction, Dump and the
    /// merge clone alike (each walks with one open directory per level).
    pub max_depth: usize,
    /// Size of one file.
    pub max_file_bytes: u64,
    /// Expanded ÷ compressed bytes, checked once more than
    /// `ratio_grace_bytes` have been expanded: stops decompression bombs
    /// early. gzip cannot exceed about 1032:1, so the default only bites on
    /// zstd or nested tricks; `max_expanded_bytes` is the absolute bound.
    /// Highly repetitive real data (logs, `yes` output) reaches 250:1.
    pub max_compression_ratio: u64,
    pub ratio_grace_bytes: u64,
    /// Create FIFOs from archives (device nodes are always refused).
    pub allow_fifos: bool,
    /// Owner of extracted files, "UID:GID". Default: the owner of the
    /// workspace directory.
    pub owner: Option<String>,
    /// Archive chunks buffered between the gRPC stream and the extractor or
    /// compressor (memory per stream ≈ this × 1 MiB).
    pub queue_chunks: usize,
    /// Compression threads for Dump; 0 means one per CPU.
    pub dump_threads: usize,
    /// Threads creating and writing files while an extraction parses the
    /// next entries (default 1; 0: the extracting thread does it all). File
    /// data goes to them in batches of 256 KiB (at most 256 files, 16 of
    /// them opened by the extractor); each writer holds at most 5 batches
    /// in flight: 1.25 MiB per writer.
    pub extract_writers: usize,
    /// Initialize flushes the new contents to disk (`syncfs`) before it
    /// answers, unless the request says otherwise. Off: the swap is atomic
    /// either way and survives the agent being killed; only a crash of the
    /// whole VM could lose what was just written, and a crashed sandbox is
    /// discarded anyway.
    pub durable_initialize: bool,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        ArchiveLimits {
            max_archive_bytes: 8 << 30,
            max_expanded_bytes: 32 << 30,
            max_entries: 500_000,
            max_path_bytes: 4096,
            max_header_bytes: 1 << 20,
            max_depth: crate::pack::MAX_DEPTH,
            max_file_bytes: 16 << 30,
            max_compression_ratio: 1000,
            ratio_grace_bytes: 256 << 20,
            allow_fifos: false,
            owner: None,
            queue_chunks: 8,
            dump_threads: 0,
            extract_writers: 1,
            durable_initialize: false,
        }
    }
}

impl ArchiveLimits {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), LimitsError> {
        for (k, v) in [
            ("max_archive_bytes", self.max_archive_bytes),
            ("max_expanded_bytes", self.max_expanded_bytes),
            ("max_entries", self.max_entries),
            ("max_path_bytes", self.max_path_bytes as u64),
            ("max_depth", self.max_depth as u64),
            ("max_file_bytes", self.max_file_bytes),
            ("max_compression_ratio", self.max_compression_ratio),
            ("queue_chunks", self.queue_chunks as u64),
        ] {
            if v == 0 {
                return Err(LimitsError::Zero(k));
            }
        }
        if self.extract_writers > MAX_EXTRACT_WRITERS {
            return Err(LimitsError::Writers(self.extract_writers));
        }
        let least = 2 * self.max_path_bytes as u64 + 2048;
        if self.max_header_bytes < least {
            return Err(LimitsError::HeaderRoom {
                got: self.max_header_bytes,
                least,
            });
        }
        if let Some(o) = &self.owner {
            parse_owner(o)?;
        }
        Ok(())
    }
}

/// An `[archive]` setting out of its bounds.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("archive.{0} must be greater than 0")]
    Zero(&'static str),
    #[error(
        "archive.max_header_bytes is {got}: it must be at least {least} (2 × max_path_bytes + 2048), \
         room for a GNU long name and long link"
    )]
    HeaderRoom { got: u64, least: u64 },
    #[error("archive.extract_writers is {0}: at most {MAX_EXTRACT_WRITERS}")]
    Writers(usize),
    #[error("archive.owner must be \"UID:GID\" with numeric ids, got {0:?}")]
    Owner(String),
}

/// Parses "UID:GID".
pub fn parse_owner(s: &str) -> Result<(u32, u32), LimitsError> {
    let bad = || LimitsError::Owner(s.to_owned());
    let (u, g) = s.split_once(':').ok_or_else(bad)?;
    Ok((u.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(ArchiveLimits::default().validate(), Ok(()));
    }

    #[test]
    fn every_bound_must_be_over_zero_and_is_named() {
        type Zeroed = (&'static str, fn(&mut ArchiveLimits));
        let zeroed: [Zeroed; 8] = [
            ("max_archive_bytes", |l| l.max_archive_bytes = 0),
            ("max_expanded_bytes", |l| l.max_expanded_bytes = 0),
            ("max_entries", |l| l.max_entries = 0),
            ("max_path_bytes", |l| l.max_path_bytes = 0),
            ("max_depth", |l| l.max_depth = 0),
            ("max_file_bytes", |l| l.max_file_bytes = 0),
            ("max_compression_ratio", |l| l.max_compression_ratio = 0),
            ("queue_chunks", |l| l.queue_chunks = 0),
        ];
        for (key, zero) in zeroed {
            let mut l = ArchiveLimits::default();
            zero(&mut l);
            assert_eq!(l.validate(), Err(LimitsError::Zero(key)));
            assert_eq!(
                LimitsError::Zero(key).to_string(),
                format!("archive.{key} must be greater than 0")
            );
        }
    }

    #[test]
    fn max_header_bytes_leaves_room_for_a_long_name_and_link() {
        let mut l = ArchiveLimits {
            max_path_bytes: 1000,
            max_header_bytes: 4048,
            ..ArchiveLimits::default()
        };
        assert_eq!(l.validate(), Ok(()));
        l.max_header_bytes = 4047;
        assert_eq!(
            l.validate(),
            Err(LimitsError::HeaderRoom {
                got: 4047,
                least: 4048
            })
        );
    }

    #[test]
    fn the_owner_is_two_numeric_ids() {
        assert_eq!(parse_owner("1000:100"), Ok((1000, 100)));
        for bad in ["1000", "a:b", "1000:", ":100", "1000:100:1", "-1:0"] {
            assert_eq!(parse_owner(bad), Err(LimitsError::Owner(bad.to_owned())));
            let l = ArchiveLimits {
                owner: Some(bad.to_owned()),
                ..ArchiveLimits::default()
            };
            assert_eq!(l.validate(), Err(LimitsError::Owner(bad.to_owned())));
        }
    }
}
