//! Workspace Initialize / Dump / Clear against the real agent over a unix
//! socket: hostile archives, limits, integrity, round trips, concurrency.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::ws::*;
use crate::common::*;
use sandbox_client::proto;
use tonic::Code;

fn header() -> proto::InitializeHeader {
    proto::InitializeHeader::default()
}

/// An agent whose workspace already holds a known tree, and a sibling
/// directory `outside/` that no archive may touch.
struct Fixture {
    agent: Agent,
    client: sandbox_client::Client,
    ws: PathBuf,
    outside: PathBuf,
    before: Snapshot,
    outside_before: Snapshot,
}

impl Fixture {
    async fn new(config: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), "outside").unwrap();
        let cfg = dir.path().join("agent.toml");
        std::fs::write(&cfg, config).unwrap();
        let agent = Agent::start_in(dir, &["--config", cfg.to_str().unwrap()], &[]);
        let client = sandbox_client::connect(&agent.unix_uri()).await.unwrap();
        let ws = agent.dir.path().join("ws");
        let good = Tar::new()
            .dir("./")
            .file("./a.txt", b"alpha")
            .dir("./d/")
            .file("./d/b.txt", b"beta")
            .symlink("./l", "a.txt")
            .end();
        initialize(&client, header(), gzip(&good))
            .await
            .expect("good archive");
        let before = snapshot(&ws, true);
        let outside_before = snapshot(&outside, true);
        Fixture {
            agent,
            client,
            ws,
            outside,
            before,
            outside_before,
        }
    }

    /// Sends `data`; asserts the code and message, and that nothing changed
    /// anywhere and no staging debris is left.
    async fn reject(&self, h: proto::InitializeHeader, data: Vec<u8>, code: Code, needle: &str) {
        let e = initialize(&self.client, h, data)
            .await
            .expect_err("hostile archive accepted");
        assert_eq!(e.code(), code, "{}", e.message());
        assert!(
            e.message().contains(needle),
            "expected '{needle}' in: {}",
            e.message()
        );
        self.assert_unchanged().await;
    }

    async fn assert_unchanged(&self) {
        assert_eq!(snapshot(&self.ws, true), self.before, "workspace changed");
        assert_eq!(
            snapshot(&self.outside, true),
            self.outside_before,
            "something was written outside the workspace"
        );
        self.assert_no_debris().await;
    }

    async fn assert_no_debris(&self) {
        wait_empty(&self.state_dir()).await;
    }

    async fn wait_staging(&self) {
        wait_staging(&self.state_dir()).await;
    }

    fn state_dir(&self) -> PathBuf {
        self.agent.dir.path().join(".ws.sandbox-agent")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_paths_are_refused_and_nothing_changes() {
    let f = Fixture::new("").await;
    let outside = f.outside.display().to_string();

    f.reject(
        header(),
        Tar::new().file("../escape.txt", b"x").end(),
        Code::InvalidArgument,
        "'..'",
    )
    .await;
    f.reject(
        header(),
        Tar::new().file("./d/../../escape.txt", b"x").end(),
        Code::InvalidArgument,
        "'..'",
    )
    .await;
    f.reject(
        header(),
        Tar::new().file(&format!("{outside}/abs.txt"), b"x").end(),
        Code::InvalidArgument,
        "absolute",
    )
    .await;

    // Symlink first, then a write through it: to an outside directory, to
    // /, and to a directory inside the archive.
    let t = Tar::new()
        .symlink("./out", &outside)
        .file("./out/pwned.txt", b"x")
        .end();
    f.reject(header(), t, Code::InvalidArgument, "symlink")
        .await;
    let t = Tar::new()
        .symlink("./root", "/")
        .file(&format!("./root{outside}/pwned.txt"), b"x")
        .end();
    f.reject(header(), t, Code::InvalidArgument, "symlink")
        .await;
    let t = Tar::new()
        .dir("./real/")
        .symlink("./alias", "real")
        .file("./alias/x", b"x")
        .end();
    f.reject(header(), t, Code::InvalidArgument, "symlink")
        .await;
    // A symlink entry named like an existing directory of the archive.
    let t = Tar::new()
        .dir("./x/")
        .symlink("./x", &outside)
        .file("./x/y", b"z")
        .end();
    f.reject(header(), t, Code::InvalidArgument, "twice").await;

    let t = Tar::new().hardlink("./passwd", "/etc/passwd").end();
    f.reject(header(), t, Code::InvalidArgument, "hardlink")
        .await;
    let t = Tar::new()
        .hardlink("./k", &format!("{outside}/keep.txt"))
        .end();
    f.reject(header(), t, Code::InvalidArgument, "hardlink")
        .await;
    let t = Tar::new().hardlink("./k", "../outside/keep.txt").end();
    f.reject(header(), t, Code::InvalidArgument, "hardlink")
        .await;

    f.reject(
        header(),
        Tar::new().special("./dev", tar::EntryType::Char).end(),
        Code::InvalidArgument,
        "device node",
    )
    .await;
    f.reject(
        header(),
        Tar::new().special("./blk", tar::EntryType::Block).end(),
        Code::InvalidArgument,
        "device node",
    )
    .await;
    f.reject(
        header(),
        Tar::new().special("./fifo", tar::EntryType::Fifo).end(),
        Code::InvalidArgument,
        "allow_fifos",
    )
    .await;

    f.reject(
        header(),
        Tar::new().file("./dup", b"1").file("./dup", b"2").end(),
        Code::InvalidArgument,
        "twice",
    )
    .await;
    f.reject(
        header(),
        Tar::new().dir("./p/").file("./p", b"file over dir").end(),
        Code::InvalidArgument,
        "directory",
    )
    .await;
    f.reject(
        header(),
        Tar::new().file("./q", b"f").dir("./q/").end(),
        Code::InvalidArgument,
        "directory replacing",
    )
    .await;
    f.reject(
        header(),
        Tar::new().file("./f", b"f").file("./f/under", b"x").end(),
        Code::InvalidArgument,
        "not a directory",
    )
    .await;

    let long = format!("./{}", "n/".repeat(2100));
    f.reject(
        header(),
        Tar::new().file(&long, b"x").end(),
        Code::ResourceExhausted,
        "max_path_bytes",
    )
    .await;
    let wide = format!("./{}", "w".repeat(300));
    f.reject(
        header(),
        Tar::new().file(&wide, b"x").end(),
        Code::InvalidArgument,
        "255",
    )
    .await;
    assert!(
        std::fs::read_to_string("/etc/passwd")
            .unwrap()
            .contains("root:")
    );
}

/// A tree nested deeper than `archive.max_depth` (a server can make one in
/// the workspace) is refused by name by Dump and by a merge Initialize,
/// and an archive entry that deep by Initialize, without a crash (these
/// walks recursed and overflowed the stack at ~1000 levels), and a tree
/// within the limit dumps. Of the clean-ups only the workspace's Clear is
/// here, of this 600-level tree: the other clean-ups (the seeds' wipe,
/// the host's discard of a slot) and trees far deeper are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_trees_are_refused_by_name() {
    let f = Fixture::new("[archive]\nmax_depth = 64\n").await;
    let deep = f.ws.join("d/".repeat(600));
    std::fs::create_dir_all(&deep).expect("deep tree");
    std::fs::write(deep.join("leaf.txt"), "leaf").expect("leaf");
    let e = dump(&f.client, proto::DumpRequest::default())
        .await
        .expect_err("a 600-level dump");
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert!(e.message().contains("max_depth"), "{}", e.message());
    let merge = proto::InitializeHeader {
        mode: proto::InitializeMode::Merge as i32,
        ..Default::default()
    };
    let small = Tar::new().file("./m.txt", b"m").end();
    let e = initialize(&f.client, merge, gzip(&small))
        .await
        .expect_err("a merge over a 600-level tree");
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert!(e.message().contains("max_depth"), "{}", e.message());
    assert!(
        deep.join("leaf.txt").is_file(),
        "the workspace is unchanged"
    );
    let mut t = Tar::new();
    t.file(&format!("./{}x.txt", "e/".repeat(100)), b"x");
    let e = initialize(&f.client, header(), gzip(&t.end()))
        .await
        .expect_err("a 100-level entry");
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
    assert!(e.message().contains("max_depth"), "{}", e.message());
    f.client
        .workspace()
        .clear(proto::ClearRequest {})
        .await
        .expect("Clear of the deep tree");
    assert!(!f.ws.join("d").exists(), "the deep tree is cleared");
    wait_empty(&f.state_dir()).await;
    std::fs::create_dir_all(f.ws.join("s/".repeat(60))).expect("a tree within the limit");
    let (archive, _) = dump(&f.client, proto::DumpRequest::default())
        .await
        .expect("a 60-level dump");
    assert!(!archive.is_empty());
}

/// A tar header whose data is `size` bytes of `fill`, zstd-compressed as
/// it is generated (a hostile metadata entry: tiny compressed, huge read).
fn zstd_metadata_bomb(kind: tar::EntryType, size: u64, fill: u8) -> Vec<u8> {
    use std::io::Write;
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    h.set_mode(0o644);
    h.set_size(size);
    h.set_cksum();
    let mut z = zstd::Encoder::new(Vec::new(), 1).expect("zstd");
    z.write_all(h.as_bytes()).expect("header");
    let block = vec![fill; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        z.write_all(&block[..n]).expect("data");
        left -= n as u64;
    }
    z.finish().expect("zstd end")
}

/// Tar metadata cannot make the agent allocate what it likes: a GNU long
/// name or a PAX header of 256 MiB (a few KiB compressed) is refused after
/// `max_header_bytes`, and 20,000 entries naming the same 4 KB directory,
/// or 20,000 sibling directories under a 4 KB path, are tracked as names,
/// not paths. Peak memory stays far below what any of them would take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_metadata_cannot_exhaust_memory() {
    let f = Fixture::new("").await;
    let pid = f.agent.child.id();
    for kind in [tar::EntryType::GNULongName, tar::EntryType::XHeader] {
        let fill = if kind == tar::EntryType::XHeader {
            b'9'
        } else {
            b'a'
        };
        let bomb = zstd_metadata_bomb(kind, 256 << 20, fill);
        assert!(bomb.len() < 64 << 10, "{} bytes", bomb.len());
        f.reject(header(), bomb, Code::ResourceExhausted, "max_header_bytes")
            .await;
    }

    // A zstd window of 2 GiB (zstd --long=31 on a stream) is never allocated.
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("zstd");
    e.long_distance_matching(true).expect("ldm");
    e.window_log(31).expect("window");
    std::io::Write::write_all(&mut e, &Tar::new().file("./w.txt", b"w").end()).expect("tar");
    let long = e.finish().expect("zstd end");
    f.reject(header(), long, Code::InvalidArgument, "--long")
        .await;

    // 3,800 bytes of prefix in 19 components, then the leaf.
    let prefix = format!("./{}", format!("{}/", "p".repeat(199)).repeat(19));
    let mut t = Tar::new();
    for _ in 0..20_000 {
        t.dir(&format!("{prefix}same/"));
    }
    initialize(
        &f.client,
        header(),
        zstd::encode_all(&t.end()[..], 1).expect("zstd"),
    )
    .await
    .expect("20,000 entries of one directory");
    assert!(f.ws.join(&prefix).join("same").is_dir());
    let mut t = Tar::new();
    for i in 0..20_000 {
        t.dir(&format!("{prefix}d{i:05}/"));
    }
    let r = initialize(
        &f.client,
        header(),
        zstd::encode_all(&t.end()[..], 1).expect("zstd"),
    )
    .await
    .expect("20,000 sibling directories");
    assert_eq!(r.dirs, 20_000 + 19);
    assert!(f.ws.join(&prefix).join("d19999").is_dir());

    let peak = peak_rss(pid);
    assert!(peak < 96 << 20, "the agent peaked at {} MiB", peak >> 20);
}

/// Sizes that are not in the header's size field still meet every limit
/// before anything is written: a PAX `size` record over a ustar size of 0,
/// and a GNU sparse file's real size (GNU tar `--format=gnu -S`, which is
/// extracted with the right content). PAX sparse files are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_outside_the_size_field_meet_the_limits() {
    let f = Fixture::new("[archive]\nmax_file_bytes = 1048576\n").await;
    let mut t = Tar::new();
    t.pax(&[("size", b"3145728")]).file("./p.bin", b"");
    let mut data = t.buf.clone();
    data.extend_from_slice(&vec![0x41u8; 3 << 20]);
    data.extend_from_slice(&[0u8; 1024]);
    f.reject(header(), data, Code::ResourceExhausted, "max_file_bytes")
        .await;

    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("src");
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut sparse = std::fs::File::create(src.join("sparse.bin")).expect("sparse");
        sparse.seek(SeekFrom::Start(40 << 20)).expect("seek");
        sparse.write_all(b"hello").expect("hello");
        sparse.set_len(50 << 20).expect("len");
    }
    let tar = |format: &str| {
        let out = dir.path().join(format!("{format}.tar.gz"));
        let st = std::process::Command::new("tar")
            .args(["-S", &format!("--format={format}"), "-czf"])
            .arg(&out)
            .arg("-C")
            .arg(&src)
            .arg("sparse.bin")
            .status()
            .expect("GNU tar");
        assert!(st.success());
        std::fs::read(&out).expect("archive")
    };
    let gnu = tar("gnu");
    f.reject(
        header(),
        gnu.clone(),
        Code::ResourceExhausted,
        "max_file_bytes",
    )
    .await;
    f.reject(header(), tar("pax"), Code::InvalidArgument, "PAX sparse")
        .await;
    // With room for it, the GNU sparse file comes out whole and right.
    let roomy = Fixture::new("").await;
    initialize(&roomy.client, header(), gnu)
        .await
        .expect("a GNU sparse file");
    let got = std::fs::read(roomy.ws.join("sparse.bin")).expect("extracted");
    assert_eq!(got.len(), 50 << 20);
    assert_eq!(&got[40 << 20..(40 << 20) + 5], b"hello");
    assert!(got[..40 << 20].iter().all(|&b| b == 0));
}

/// The agent's own state name (`.sandbox-agent`, inside the workspace when
/// it is a mount point) is refused at the top of any archive: a swap would
/// fail half-way moving it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserved_name_is_refused() {
    let f = Fixture::new("").await;
    let mut t = Tar::new();
    t.file("./.sandbox-agent/x", b"x");
    f.reject(header(), gzip(&t.end()), Code::InvalidArgument, "reserved")
        .await;
    let mut t = Tar::new();
    t.dir("./.sandbox-agent/");
    f.reject(header(), gzip(&t.end()), Code::InvalidArgument, "reserved")
        .await;
}

/// A NUL byte in a path (a PAX `path`, a symlink target, Dump's sub_path)
/// is the request's fault; so is data after the end-of-archive marker,
/// whether appended plain or as a second gzip member (it would otherwise
/// be dropped silently). Zero padding after the marker is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_bytes_and_data_after_the_end_are_refused() {
    let f = Fixture::new("").await;
    let mut t = Tar::new();
    t.pax(&[("path", b"a\0b.txt")]).file("placeholder", b"x");
    f.reject(header(), t.end(), Code::InvalidArgument, "NUL")
        .await;
    let mut t = Tar::new();
    t.pax(&[("linkpath", b"tar\0get")])
        .symlink("l", "placeholder");
    f.reject(header(), t.end(), Code::InvalidArgument, "NUL")
        .await;
    let e = dump(
        &f.client,
        proto::DumpRequest {
            sub_path: "a\0b".into(),
            ..Default::default()
        },
    )
    .await
    .expect_err("NUL in sub_path");
    assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());

    let first = Tar::new().file("one.txt", b"1").end();
    let second = Tar::new().file("two.txt", b"2").end();
    let mut plain = first.clone();
    plain.extend_from_slice(&second);
    f.reject(
        header(),
        plain,
        Code::InvalidArgument,
        "after the tar end-of-archive marker",
    )
    .await;
    let mut members = gzip(&first);
    members.extend_from_slice(&gzip(&second));
    f.reject(
        header(),
        members,
        Code::InvalidArgument,
        "after the tar end-of-archive marker",
    )
    .await;
    let mut junk = first.clone();
    junk.extend_from_slice(b"trailing junk");
    f.reject(
        header(),
        junk,
        Code::InvalidArgument,
        "after the tar end-of-archive marker",
    )
    .await;
    // A record padded with zeros, as GNU tar writes it: accepted.
    let mut padded = first.clone();
    padded.resize(10240, 0);
    let r = initialize(&f.client, header(), gzip(&padded))
        .await
        .expect("zero padding after the marker");
    assert_eq!(r.files, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_truncated_and_mismatched_streams_change_nothing() {
    let f = Fixture::new("").await;
    let mut big = Tar::new();
    for i in 0..200 {
        big.file(&format!("./f{i}"), &vec![b'a' + (i % 26) as u8; 3000]);
    }
    let tar = big.end();
    let gz = gzip(&tar);

    f.reject(
        header(),
        gz[..gz.len() / 2].to_vec(),
        Code::InvalidArgument,
        "gzip",
    )
    .await;
    f.reject(
        header(),
        gz[..gz.len() - 4].to_vec(),
        Code::InvalidArgument,
        "gzip",
    )
    .await;
    let mut bad = gz.clone();
    let mid = bad.len() / 2;
    for b in &mut bad[mid..mid + 64] {
        *b ^= 0x5a;
    }
    f.reject(header(), bad, Code::InvalidArgument, "gzip").await;
    // Plain tar cut at a block boundary: only the missing end marker tells.
    f.reject(
        header(),
        tar[..512 * 35].to_vec(),
        Code::InvalidArgument,
        "end-of-archive",
    )
    .await;
    // Cut inside a file's data.
    f.reject(
        header(),
        tar[..512 * 40 + 100].to_vec(),
        Code::InvalidArgument,
        "truncated",
    )
    .await;
    f.reject(
        header(),
        b"this is not an archive at all, not even close".repeat(20),
        Code::InvalidArgument,
        "tar",
    )
    .await;

    let h = proto::InitializeHeader {
        expected_sha256: "0".repeat(64),
        ..header()
    };
    f.reject(h, gz.clone(), Code::DataLoss, "sha256").await;
    let h = proto::InitializeHeader {
        size_hint: gz.len() as u64 + 10,
        ..header()
    };
    f.reject(h, gz.clone(), Code::DataLoss, "announced").await;
    let h = proto::InitializeHeader {
        expected_sha256: "xyz".into(),
        ..header()
    };
    f.reject(h, gz.clone(), Code::InvalidArgument, "64 hex")
        .await;

    // The right checksum and size pass, and the result says what happened.
    let h = proto::InitializeHeader {
        expected_sha256: sha256(&gz),
        size_hint: gz.len() as u64,
        ..header()
    };
    let r = initialize(&f.client, h, gz.clone()).await.expect("valid");
    assert_eq!(
        (r.files, r.bytes_written, r.archive_bytes),
        (200, 600_000, gz.len() as u64)
    );
    assert_eq!(r.archive_sha256, sha256(&gz));
    assert!(
        !f.ws.join("a.txt").exists(),
        "replace mode drops the old contents"
    );
    assert_eq!(std::fs::read(f.ws.join("f3")).unwrap(), vec![b'd'; 3000]);
    f.assert_no_debris().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_are_invalid_argument() {
    let f = Fixture::new("").await;
    use proto::initialize_request::Msg;
    let chunk_first = vec![proto::InitializeRequest {
        msg: Some(Msg::Chunk(vec![0u8; 10].into())),
    }];
    let e = f
        .client
        .workspace()
        .initialize(tokio_stream::iter(chunk_first))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("first message"), "{}", e.message());

    let e = f
        .client
        .workspace()
        .initialize(tokio_stream::iter(Vec::new()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    let huge = vec![
        proto::InitializeRequest {
            msg: Some(Msg::Header(header())),
        },
        proto::InitializeRequest {
            msg: Some(Msg::Chunk(vec![0u8; (1 << 20) + 1].into())),
        },
    ];
    let e = f
        .client
        .workspace()
        .initialize(tokio_stream::iter(huge))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("1048576"), "{}", e.message());
    f.assert_unchanged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_name_themselves() {
    let cfg = "[archive]\nmax_entries = 1000\nmax_file_bytes = 100000\nmax_compression_ratio = 50\nratio_grace_bytes = 1048576\nmax_archive_bytes = 5000000\n";
    let f = Fixture::new(cfg).await;

    // A gzip bomb: 64 MiB of zeros in one file compress to ~64 KiB.
    let mut t = Tar::new();
    let zeros = vec![0u8; 64 << 20];
    let mut h = tar::Header::new_gnu();
    h.set_size(zeros.len() as u64);
    h.set_mode(0o644);
    h.as_old_mut().name[..6].copy_from_slice(b"./bomb");
    h.set_cksum();
    t.buf.extend_from_slice(h.as_bytes());
    t.buf.extend_from_slice(&zeros);
    let bomb = gzip(&t.end());
    assert!(bomb.len() < 1 << 20);
    let cfg_big =
        Fixture::new("[archive]\nmax_compression_ratio = 50\nratio_grace_bytes = 1048576\n").await;
    cfg_big
        .reject(
            header(),
            bomb,
            Code::ResourceExhausted,
            "max_compression_ratio",
        )
        .await;

    f.reject(
        header(),
        Tar::new().file("./big", &vec![7u8; 100_001]).end(),
        Code::ResourceExhausted,
        "max_file_bytes",
    )
    .await;
    f.reject(
        header(),
        vec![0u8; 5_000_001],
        Code::ResourceExhausted,
        "max_archive_bytes",
    )
    .await;
    let h = proto::InitializeHeader {
        size_hint: 6_000_000,
        ..header()
    };
    f.reject(
        h,
        Tar::new().end(),
        Code::ResourceExhausted,
        "max_archive_bytes",
    )
    .await;

    // A million tiny entries, generated lazily: the agent stops at the cap
    // without reading the rest.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let producer = std::thread::spawn(move || {
        use proto::initialize_request::Msg;
        let _ = tx.blocking_send(proto::InitializeRequest {
            msg: Some(Msg::Header(header())),
        });
        let mut t = Tar::new();
        for i in 0..1_000_000u32 {
            t.dir(&format!("./e{i}/"));
            if t.buf.len() >= 256 << 10 {
                let chunk = std::mem::take(&mut t.buf);
                if tx
                    .blocking_send(proto::InitializeRequest {
                        msg: Some(Msg::Chunk(chunk.into())),
                    })
                    .is_err()
                {
                    return i;
                }
            }
        }
        1_000_000
    });
    let started = Instant::now();
    let e = f
        .client
        .workspace()
        .initialize(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("max_entries"), "{}", e.message());
    let sent = producer.join().unwrap();
    assert!(
        sent < 100_000,
        "the agent read {sent} entries past a cap of 1000"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    f.assert_unchanged().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancel_mid_stream_changes_nothing() {
    let f = Fixture::new("").await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    use proto::initialize_request::Msg;
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Header(header())),
    })
    .await
    .unwrap();
    let mut t = Tar::new();
    for i in 0..500 {
        t.file(&format!("./c{i}"), b"partial");
    }
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Chunk(t.buf.clone().into())),
    })
    .await
    .unwrap();
    let mut ws = f.client.workspace();
    let call = tokio::spawn(async move {
        ws.initialize(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    f.wait_staging().await; // the agent is extracting
    call.abort(); // the client goes away mid-stream
    let _ = call.await;
    drop(tx);
    // The agent notices, discards the staging tree, and serves the next call.
    eventually_async(
        Duration::from_secs(10),
        "the workspace is free again",
        async || match f.client.workspace().clear(proto::ClearRequest {}).await {
            Err(e) if e.code() == Code::Aborted => Err(e.to_string()),
            Err(e) => panic!("{e}"),
            Ok(_) => Ok(()),
        },
    )
    .await;
    assert!(
        f.agent.stderr.all().contains("workspace unchanged"),
        "{}",
        f.agent.stderr.all()
    );
    assert!(
        snapshot(&f.ws, true).is_empty(),
        "clear empties the workspace"
    );
    f.assert_no_debris().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setuid_bits_are_stripped_and_owner_applied() {
    let f = Fixture::new("[archive]\nowner = \"4321:4322\"\n").await;
    let t = Tar::new()
        .file_raw(b"./suid", 0o6755, b"x")
        .file_raw(b"./sticky", 0o1777, b"y")
        .dir("./sub/")
        .symlink("./sub/l", "../suid")
        .end();
    initialize(&f.client, header(), t).await.expect("valid");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let md = std::fs::metadata(f.ws.join("suid")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o755);
    assert_eq!((md.uid(), md.gid()), (4321, 4322));
    assert_eq!(
        std::fs::metadata(f.ws.join("sticky"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o777
    );
    let l = std::fs::symlink_metadata(f.ws.join("sub/l")).unwrap();
    assert_eq!((l.uid(), l.gid()), (4321, 4322));
    assert_eq!(std::fs::metadata(f.ws.join("sub")).unwrap().uid(), 4321);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_lays_the_archive_over_the_workspace() {
    let f = Fixture::new("").await;
    let before_a = std::fs::read(f.ws.join("a.txt")).unwrap();
    let t = Tar::new()
        .file("./d/b.txt", b"new beta")
        .file("./new.txt", b"new")
        .dir("./e/")
        .end();
    let h = proto::InitializeHeader {
        mode: proto::InitializeMode::Merge as i32,
        ..header()
    };
    let r = initialize(&f.client, h, t).await.expect("merge");
    assert_eq!(r.files, 1 + 1);
    assert_eq!(std::fs::read(f.ws.join("a.txt")).unwrap(), before_a);
    assert_eq!(
        std::fs::read_to_string(f.ws.join("d/b.txt")).unwrap(),
        "new beta"
    );
    assert_eq!(
        std::fs::read_to_string(f.ws.join("new.txt")).unwrap(),
        "new"
    );
    assert!(f.ws.join("e").is_dir() && f.ws.join("l").is_symlink());
    // In merge mode the archive may replace what was there, whatever it was.
    let t = Tar::new().file("./d", b"d is a file now").end();
    initialize(
        &f.client,
        proto::InitializeHeader {
            mode: proto::InitializeMode::Merge as i32,
            ..header()
        },
        t,
    )
    .await
    .expect("merge over dir");
    assert_eq!(
        std::fs::read_to_string(f.ws.join("d")).unwrap(),
        "d is a file now"
    );
    assert!(f.ws.join("a.txt").exists());
    f.assert_no_debris().await;
}

/// A random tree with every kind of entry Dump must preserve.
fn random_tree(root: &Path, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut dirs = vec![PathBuf::new()];
    std::fs::create_dir_all(root).unwrap();
    for i in 0..rng.usize(20..80) {
        let parent = dirs[rng.usize(..dirs.len())].clone();
        let name: Vec<u8> = match rng.u8(..10) {
            0 => vec![b'n', 0xff, 0xfe, b'0' + (i % 10) as u8], // not UTF-8
            1 => format!("long-{}-{i}", "x".repeat(rng.usize(90..200))).into_bytes(),
            2 => format!("sp ace {i}").into_bytes(),
            _ => format!("e{i}").into_bytes(),
        };
        let rel = parent.join(std::ffi::OsStr::from_bytes(&name));
        let full = root.join(&rel);
        match rng.u8(..10) {
            0..=2 => {
                std::fs::create_dir(&full).unwrap();
                dirs.push(rel);
            }
            3 => std::os::unix::fs::symlink(
                if rng.bool() {
                    "../target"
                } else {
                    "/etc/hostname"
                },
                &full,
            )
            .unwrap(),
            _ => {
                let len = if rng.u8(..20) == 0 {
                    rng.usize(100_000..2_000_000)
                } else {
                    rng.usize(0..5000)
                };
                let data: Vec<u8> = (0..len)
                    .map(|_| if rng.bool() { rng.u8(..) } else { b'a' })
                    .collect();
                std::fs::write(&full, data).unwrap();
                let mode = [0o644, 0o600, 0o755, 0o444, 0o700][rng.usize(..5)];
                std::fs::set_permissions(&full, std::os::unix::fs::PermissionsExt::from_mode(mode))
                    .unwrap();
            }
        }
    }
    // mtimes last (directories' change as entries are created), deepest first.
    let mut all: Vec<_> = snapshot(root, false).into_keys().collect();
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in all {
        let t = filetime(1_600_000_000 + rng.i64(0..100_000_000));
        let full = root.join(&p);
        let _ = rustix::fs::utimensat(
            rustix::fs::CWD,
            &full,
            &t,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        );
    }
}

fn filetime(sec: i64) -> rustix::fs::Timestamps {
    let t = rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: 0,
    };
    rustix::fs::Timestamps {
        last_access: t,
        last_modification: t,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_trees_round_trip_between_agents() {
    let a = Agent::start(&[]);
    let b = Agent::start(&[]);
    let ca = sandbox_client::connect(&a.unix_uri()).await.unwrap();
    let cb = sandbox_client::connect(&b.unix_uri()).await.unwrap();
    let wa = a.dir.path().join("ws");
    let wb = b.dir.path().join("ws");
    for seed in 1..=6u64 {
        for entry in std::fs::read_dir(&wa).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(&p).unwrap()
            } else {
                std::fs::remove_file(&p).unwrap()
            }
        }
        random_tree(&wa, seed);
        // The workspace root's own mtime is not part of the contents.
        let want = snapshot(&wa, true);
        let compression = if seed % 2 == 0 {
            proto::Compression::Zstd
        } else {
            proto::Compression::Gzip
        };
        let (archive, trailer) = dump(
            &ca,
            proto::DumpRequest {
                compression: compression as i32,
                ..Default::default()
            },
        )
        .await
        .expect("dump");
        assert_eq!(trailer.sha256, sha256(&archive), "seed {seed}");
        assert_eq!(trailer.archive_bytes, archive.len() as u64);
        let r = initialize(&cb, proto::InitializeHeader::default(), archive.clone())
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(r.files, trailer.files, "seed {seed}");
        let got = snapshot(&wb, true);
        assert_eq!(
            got, want,
            "seed {seed}: tree differs after Dump → Initialize"
        );

        // GNU tar reads the same archive to the same tree.
        if seed <= 2 {
            let gnu = tempfile::tempdir().unwrap();
            let file = gnu.path().join("x.tar");
            std::fs::write(&file, &archive).unwrap();
            let out = gnu.path().join("out");
            std::fs::create_dir(&out).unwrap();
            let flag = if compression == proto::Compression::Zstd {
                "--zstd"
            } else {
                "-z"
            };
            let st = std::process::Command::new("tar")
                .args([flag, "-xpf"])
                .arg(&file)
                .arg("-C")
                .arg(&out)
                .status()
                .unwrap();
            assert!(st.success(), "GNU tar failed on seed {seed}");
            assert_eq!(
                snapshot(&out, true),
                want,
                "seed {seed}: GNU tar extracts a different tree"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_options_and_special_files() {
    let f = Fixture::new("").await;
    std::fs::create_dir_all(f.ws.join("node_modules/x")).unwrap();
    std::fs::write(f.ws.join("node_modules/x/i.js"), "x").unwrap();
    std::fs::write(f.ws.join("d/skip.log"), "log").unwrap();
    nix::unistd::mkfifo(
        &f.ws.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(f.ws.join("sock")).unwrap();

    let req = proto::DumpRequest {
        exclude: vec!["node_modules".into(), "**/*.log".into()],
        ..Default::default()
    };
    let (archive, t) = dump(&f.client, req).await.unwrap();
    assert_eq!(t.skipped_special, 2);
    let names = list_tgz(&archive);
    assert!(
        names.contains(&"./d/b.txt".to_owned()) && names.contains(&"./l".to_owned()),
        "{names:?}"
    );
    assert!(
        !names
            .iter()
            .any(|n| n.contains("node_modules") || n.ends_with(".log") || n.contains("fifo")),
        "{names:?}"
    );
    assert_eq!(names[0], "./");

    let req = proto::DumpRequest {
        sub_path: "d".into(),
        level: 9,
        ..Default::default()
    };
    let (archive, t) = dump(&f.client, req).await.unwrap();
    assert_eq!(t.files, 2);
    assert_eq!(list_tgz(&archive), ["./", "./b.txt", "./skip.log"]);

    for (sub, code) in [
        ("nope", Code::NotFound),
        ("../outside", Code::InvalidArgument),
        ("l", Code::InvalidArgument),
        ("a.txt", Code::InvalidArgument),
    ] {
        let e = dump(
            &f.client,
            proto::DumpRequest {
                sub_path: sub.into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), code, "{sub}: {}", e.message());
    }
    let e = dump(
        &f.client,
        proto::DumpRequest {
            level: 42,
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("level"), "{}", e.message());
}

fn list_tgz(archive: &[u8]) -> Vec<String> {
    let mut a = tar::Archive::new(flate2::read::MultiGzDecoder::new(archive));
    a.entries()
        .unwrap()
        .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_operation_at_a_time_and_the_agent_stays_responsive() {
    let f = Fixture::new("").await;
    // A slow upload: a chunk every 100 ms.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut ws = f.client.workspace();
    let slow = tokio::spawn(async move {
        ws.initialize(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    use proto::initialize_request::Msg;
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Header(header())),
    })
    .await
    .unwrap();
    let mut t = Tar::new();
    t.file("./slow.txt", b"slow");
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Chunk(std::mem::take(&mut t.buf).into())),
    })
    .await
    .unwrap();
    // Once the agent has taken the upload (its staging directory exists;
    // not after a guessed delay, nor by probing with a Dump that could win
    // the lock first), a Dump is refused.
    f.wait_staging().await;
    let e = dump(&f.client, proto::DumpRequest::default())
        .await
        .expect_err("a Dump beside a running Initialize");
    assert_eq!(e.code(), Code::Aborted);
    assert!(
        e.message().contains("Initialize is running"),
        "{}",
        e.message()
    );
    let e = f
        .client
        .workspace()
        .clear(proto::ClearRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);
    let e = initialize(&f.client, header(), Tar::new().end())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Aborted);

    for _ in 0..5 {
        let t0 = Instant::now();
        f.client
            .agent()
            .get_info(proto::GetInfoRequest {})
            .await
            .expect("GetInfo during a transfer");
        f.client
            .health()
            .check(proto::health::HealthCheckRequest::default())
            .await
            .expect("health during a transfer");
        // A blocked agent would not answer until the upload ends, and the
        // upload waits for this loop: any bound catches that. 5 s leaves
        // room for a loaded machine.
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "GetInfo and health took {:?} during a transfer",
            t0.elapsed()
        );
        tx.send(proto::InitializeRequest {
            msg: Some(Msg::Chunk(vec![0u8; 0].into())),
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tx.send(proto::InitializeRequest {
        msg: Some(Msg::Chunk(vec![0u8; 1024].into())),
    })
    .await
    .unwrap();
    drop(tx);
    let r = slow
        .await
        .unwrap()
        .expect("the slow upload completes")
        .into_inner();
    assert_eq!(r.files, 1);
    assert_eq!(
        std::fs::read_to_string(f.ws.join("slow.txt")).unwrap(),
        "slow"
    );
    // And the next operation may run.
    dump(&f.client, proto::DumpRequest::default())
        .await
        .expect("dump after");
}

#[test]
fn files_over_8_gib_are_dumped_with_their_real_size() {
    let agent = Agent::start(&[]);
    let ws = agent.dir.path().join("ws");
    let f = std::fs::File::create(ws.join("huge.bin")).unwrap();
    f.set_len(9 << 30).unwrap(); // sparse
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' --agent '{}' dump --zstd --level 1 -o - | tar --zstd -tvf -",
            &*CTL,
            agent.unix_uri()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    assert!(
        listing.contains(&format!("{}", 9u64 << 30)) && listing.contains("./huge.bin"),
        "{listing}"
    );
}

#[test]
fn sandboxctl_transfers_and_reports() {
    let agent = Agent::start(&[]);
    let uri = agent.unix_uri();
    let src = agent.dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/f.txt"), "via dir").unwrap();
    let out = ctl(&["--agent", &uri, "upload", src.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["files"], 1);
    assert_eq!(
        std::fs::read_to_string(agent.dir.path().join("ws/sub/f.txt")).unwrap(),
        "via dir"
    );

    let file = agent.dir.path().join("dump.tgz");
    let out = ctl(&["--agent", &uri, "dump", "-o", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("dumped 1 files"),
        "{}",
        text(&out.stderr)
    );
    let listing = std::process::Command::new("tar")
        .arg("-tzf")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(text(&listing.stdout), "./\n./sub/\n./sub/f.txt\n");
    assert!(!std::fs::read_dir(agent.dir.path()).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".partial")
    }));

    std::fs::write(agent.dir.path().join("ws/extra"), "x").unwrap();
    let out = ctl(&["--agent", &uri, "upload", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!agent.dir.path().join("ws/extra").exists());

    // A corrupt archive file fails with the agent's reason, nothing changes.
    let bad = agent.dir.path().join("bad.tgz");
    std::fs::write(&bad, &std::fs::read(&file).unwrap()[..20]).unwrap();
    let out = ctl(&["--agent", &uri, "upload", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("InvalidArgument"),
        "{}",
        text(&out.stderr)
    );
    assert!(agent.dir.path().join("ws/sub/f.txt").exists());

    let out = ctl(&["--agent", &uri, "clear"]);
    assert!(out.status.success());
    assert_eq!(
        std::fs::read_dir(agent.dir.path().join("ws"))
            .unwrap()
            .count(),
        0
    );
}
