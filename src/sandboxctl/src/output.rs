//! Formatting shared by the verbs: RPC errors, statuses, sizes, durations.

use anyhow::anyhow;

/// `println!` that never panics: a reader that went away (`sandboxctl … |
/// head -1`) ends the program quietly with 141, as a tool killed by
/// SIGPIPE would; any other write failure is reported.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            $crate::output::stdout_failed(e)
        }
    }};
}

pub(crate) use outln;

/// Exit code of a program whose reader closed the pipe (128 + SIGPIPE).
pub(crate) const CLOSED_PIPE: u8 = 141;

/// Ends the program after a failed write to stdout.
pub(crate) fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        eprintln!("sandboxctl: writing to stdout: {e}");
        std::process::exit(1);
    }
    std::process::exit(i32::from(CLOSED_PIPE))
}

/// Whether `e` is a write to a reader that went away.
pub(crate) fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
use sandbox_client::error_chain;
use sandbox_client::proto;
use serde_json::{Value, json};

/// Formats a failed RPC as `Method: CODE: message`.
pub(crate) fn rpc_error(method: &str, s: tonic::Status) -> anyhow::Error {
    let detail = if s.message().is_empty() {
        error_chain(&s)
    } else {
        s.message().to_owned()
    };
    anyhow!("{method} failed: {:?}: {detail}", s.code())
}

/// Klavis spelling of a status.
pub(crate) fn status_name(s: proto::SandboxStatus) -> &'static str {
    match s {
        proto::SandboxStatus::Idle => "idle",
        proto::SandboxStatus::Occupied => "occupied",
        proto::SandboxStatus::Error => "error",
        proto::SandboxStatus::Unspecified => "unspecified",
    }
}

/// A status number in Klavis's spelling (`unknown` for a newer one).
pub(crate) fn status_str(v: i32) -> &'static str {
    proto::SandboxStatus::try_from(v).map_or("unknown", status_name)
}

/// A benchmark number as Klavis names it (null for none or a newer one).
pub(crate) fn benchmark_name(v: i32) -> Value {
    proto::Benchmark::try_from(v)
        .ok()
        .and_then(proto::Benchmark::klavis_name)
        .map_or(Value::Null, |n| json!(n))
}

pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

pub(crate) fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}
