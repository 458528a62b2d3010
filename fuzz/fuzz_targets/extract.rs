//! Fuzzes the archive extractor and asserts confinement: whatever the input,
//! nothing appears or changes outside the extraction root.
//!
//! The jail is a fixed path so seed archives can aim at it: absolute paths
//! into it, `../` escapes, symlinks to it followed by writes through them,
//! hardlinks to the sentinel. Seeds also carry GNU and PAX sparse files, a
//! PAX `size` record over a ustar size of 0, and long PAX and GNU names, so
//! the mutations reach the size and header paths; every run checks that no
//! file passed `max_file_bytes` and the tree passed `max_expanded_bytes`.
#![no_main]

use std::os::fd::AsFd;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sandbox_archive::extract::{ExtractOptions, extract};
use sandbox_archive::{ArchiveLimits, Compression};

const JAIL: &str = "/tmp/sandbox-agent-fuzz-jail";
const CANARY: &str = "/tmp/sandbox-agent-fuzz-canary";

fuzz_target!(|data: &[u8]| {
    let jail = Path::new(JAIL);
    let root = jail.join("root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("root");
    std::fs::write(jail.join("sentinel"), b"sentinel").expect("sentinel");
    let dir = std::fs::File::open(&root).expect("open root");
    let limits = ArchiveLimits {
        max_entries: 256,
        max_expanded_bytes: 8 << 20,
        max_file_bytes: 1 << 20,
        ratio_grace_bytes: 1 << 20,
        // Small enough that long names, PAX records and sparse maps the
        // fuzzer grows meet the metadata budget.
        max_path_bytes: 1024,
        max_header_bytes: 4096,
        ..ArchiveLimits::default()
    };
    let opts = ExtractOptions {
        limits: &limits,
        compression: Compression::Auto,
        owner: None,
        merge: false,
    };
    let _ = extract(std::io::Cursor::new(data.to_vec()), dir.as_fd(), &opts);

    let mut names: Vec<String> = std::fs::read_dir(jail)
        .expect("jail")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["root", "sentinel"],
        "something was created outside the root"
    );
    assert_eq!(
        std::fs::read(jail.join("sentinel")).expect("sentinel"),
        b"sentinel",
        "the sentinel was changed"
    );
    let md = std::fs::symlink_metadata(jail.join("sentinel")).expect("sentinel");
    assert!(md.is_file(), "the sentinel was replaced");
    assert_eq!(
        std::os::unix::fs::MetadataExt::nlink(&md),
        1,
        "the sentinel was hardlinked into the root"
    );
    assert!(!Path::new(CANARY).exists(), "an absolute path was written");

    // Whatever field carries a size (the header, a PAX `size` record, a GNU
    // sparse map), no more was written than the limits allow.
    let mut total = 0u64;
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(md) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if md.is_dir() {
                stack.push(e.path());
            } else if md.is_file() {
                assert!(
                    md.len() <= limits.max_file_bytes,
                    "a file of {} bytes passed max_file_bytes",
                    md.len()
                );
                total += md.len();
            }
        }
    }
    assert!(
        total <= limits.max_expanded_bytes,
        "{total} bytes written passed max_expanded_bytes"
    );
});
