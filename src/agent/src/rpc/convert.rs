//! proto ⇄ domain: every conversion of the gRPC adapters, in one place.
//! A request value that has no domain meaning is `INVALID_ARGUMENT`.

use std::collections::BTreeMap;

use tonic::Status;

use crate::exec::{ExecState, ExecView};
use crate::info::Snapshot;
use crate::lifecycle::{self, Selection, ServerView, Ttl};
use crate::supervisor::State;
use crate::supervisor::logbuf::{self, Stream as LogStream};
use crate::supervisor::manifest::{Benchmark, Credentials, Transport};
use crate::supervisor::spawn::Exit;
use crate::workspace::{Compression, DumpMsg, DumpRequest, DumpSummary, InitRequest, InitStats};
use sandbox_client::proto;

// ---- the workspace and archives

pub(super) fn compression(v: i32) -> Result<Compression, Status> {
    match proto::Compression::try_from(v) {
        Ok(proto::Compression::Auto) => Ok(Compression::Auto),
        Ok(proto::Compression::Gzip) => Ok(Compression::Gzip),
        Ok(proto::Compression::Zstd) => Ok(Compression::Zstd),
        Ok(proto::Compression::None) => Ok(Compression::None),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown compression value {v}"
        ))),
    }
}

pub(super) fn init_request(h: proto::InitializeHeader) -> Result<InitRequest, Status> {
    let mode = proto::InitializeMode::try_from(h.mode)
        .map_err(|_| Status::invalid_argument(format!("unknown mode value {}", h.mode)))?;
    Ok(InitRequest {
        compression: compression(h.compression)?,
        merge: mode == proto::InitializeMode::Merge,
        expected_sha256: h.expected_sha256,
        size_hint: h.size_hint,
        durable: h.durable,
        fence: None,
    })
}

pub(super) fn init_response(stats: InitStats) -> proto::InitializeResponse {
    let x = stats.extract;
    proto::InitializeResponse {
        files: x.files,
        dirs: x.dirs,
        symlinks: x.symlinks,
        hardlinks: x.hardlinks,
        bytes_written: x.bytes_written,
        archive_bytes: stats.archive_bytes,
        archive_sha256: stats.archive_sha256,
        duration_ms: stats.duration.as_millis() as u64,
        durable: stats.durable,
    }
}

pub(super) fn dump_request(r: proto::DumpRequest) -> DumpRequest {
    DumpRequest {
        exclude: r.exclude,
        sub_path: r.sub_path,
        fence: None,
    }
}

pub(super) fn dump_response(m: DumpMsg) -> proto::DumpResponse {
    match m {
        DumpMsg::Chunk(b) => chunk(b),
        DumpMsg::Done(s) => trailer(s),
    }
}

/// One chunk of an archive stream (Dump, and Exec.Export).
pub(super) fn chunk(b: bytes::Bytes) -> proto::DumpResponse {
    proto::DumpResponse {
        msg: Some(proto::dump_response::Msg::Chunk(b)),
    }
}

/// The last message of an archive stream (Dump, and Exec.Export).
pub(super) fn trailer(s: DumpSummary) -> proto::DumpResponse {
    let stats = s.stats;
    proto::DumpResponse {
        msg: Some(proto::dump_response::Msg::Trailer(proto::DumpTrailer {
            sha256: s.sha256,
            archive_bytes: s.archive_bytes,
            files: stats.files,
            dirs: stats.dirs,
            symlinks: stats.symlinks,
            skipped_special: stats.skipped_special,
            changed_files: stats.changed,
            changed_truncated: stats.changed_truncated,
            content_bytes: stats.content_bytes,
            duration_ms: s.duration.as_millis() as u64,
        })),
    }
}

// ---- executions

pub(super) fn exec_state(s: ExecState) -> proto::ExecState {
    match s {
        ExecState::Uploaded => proto::ExecState::Uploaded,
        ExecState::Queued => proto::ExecState::Queued,
        ExecState::Installing => proto::ExecState::Installing,
        ExecState::Running => proto::ExecState::Running,
        ExecState::Completed => proto::ExecState::Completed,
        ExecState::Failed => proto::ExecState::Failed,
    }
}

pub(super) fn exec_view(v: ExecView) -> proto::ExecStatus {
    proto::ExecStatus {
        execution_name: v.name,
        state: exec_state(v.state) as i32,
        klavis_status: v.state.klavis().into(),
        message: v.message,
        exit_code: v.exit_code,
        signal: v.signal,
        uploaded_at_ms: v.uploaded_at_ms,
        started_at_ms: v.started_at_ms,
        finished_at_ms: v.finished_at_ms,
        log_bytes: v.log_bytes,
        log_capped: v.log_capped,
        directory: v.directory.display().to_string(),
    }
}

// ---- the sandbox and its lease

pub(super) fn sandbox_status(s: lifecycle::SandboxStatus) -> i32 {
    (match s {
        lifecycle::SandboxStatus::Idle => proto::SandboxStatus::Idle,
        lifecycle::SandboxStatus::Occupied => proto::SandboxStatus::Occupied,
        lifecycle::SandboxStatus::Error => proto::SandboxStatus::Error,
    }) as i32
}

pub(super) fn benchmark_to_proto(b: Option<Benchmark>) -> i32 {
    (match b {
        None => proto::Benchmark::Unspecified,
        Some(Benchmark::McpAtlas) => proto::Benchmark::McpAtlas,
        Some(Benchmark::Toolathlon) => proto::Benchmark::Toolathlon,
        Some(Benchmark::McpMark) => proto::Benchmark::McpMark,
    }) as i32
}

pub(super) fn benchmark_from_proto(v: i32) -> Result<Option<Benchmark>, Status> {
    match proto::Benchmark::try_from(v) {
        Ok(proto::Benchmark::Unspecified) => Ok(None),
        Ok(proto::Benchmark::McpAtlas) => Ok(Some(Benchmark::McpAtlas)),
        Ok(proto::Benchmark::Toolathlon) => Ok(Some(Benchmark::Toolathlon)),
        Ok(proto::Benchmark::McpMark) => Ok(Some(Benchmark::McpMark)),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown benchmark value {v}; use MCP_Atlas, Toolathlon or MCP_Mark"
        ))),
    }
}

/// AcquireRequest.ttl_seconds: absent is the default, 0 is none.
pub(super) fn ttl(t: Option<u32>) -> Ttl {
    match t {
        None => Ttl::Default,
        Some(0) => Ttl::Never,
        Some(s) => Ttl::Seconds(s),
    }
}

/// Which servers an AcquireRequest names: exactly one of a list,
/// `all_servers` and `no_servers`.
pub(super) fn selection(r: &mut proto::AcquireRequest) -> Result<Selection, Status> {
    match (r.all_servers, r.no_servers, r.server_names.is_empty()) {
        (true, false, true) => Ok(Selection::All),
        (false, true, true) => Ok(Selection::Nothing),
        (false, false, false) => Ok(Selection::Names(std::mem::take(&mut r.server_names))),
        (false, false, true) => Err(Status::invalid_argument(
            "server_names is empty; name the servers to start, or set all_servers or no_servers",
        )),
        _ => Err(Status::invalid_argument(
            "give one of server_names, all_servers and no_servers",
        )),
    }
}

/// An AcquireRequest's auth_data and env, per server.
pub(super) fn credentials(
    auth_data: &std::collections::HashMap<String, prost_types::Struct>,
    env: std::collections::HashMap<String, proto::EnvVars>,
) -> Result<BTreeMap<String, Credentials>, Status> {
    let mut credentials: BTreeMap<String, Credentials> = BTreeMap::new();
    for (server, s) in auth_data {
        credentials.entry(server.clone()).or_default().auth = auth_strings(server, s)?;
    }
    for (server, e) in env {
        credentials.entry(server).or_default().env = e.vars.into_iter().collect();
    }
    Ok(credentials)
}

/// auth_data values as environment strings: strings as they are, numbers
/// and booleans in their JSON form; nested values are refused.
fn auth_strings(server: &str, s: &prost_types::Struct) -> Result<BTreeMap<String, String>, Status> {
    use prost_types::value::Kind;
    let mut out = BTreeMap::new();
    for (k, v) in &s.fields {
        let text = match &v.kind {
            Some(Kind::StringValue(t)) => t.clone(),
            Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 1e15 => {
                format!("{}", *n as i64)
            }
            Some(Kind::NumberValue(n)) => n.to_string(),
            Some(Kind::BoolValue(b)) => b.to_string(),
            Some(Kind::NullValue(_)) | None => continue,
            Some(_) => {
                return Err(Status::invalid_argument(format!(
                    "auth_data[{server:?}].{k}: only strings, numbers and booleans can be passed to a server"
                )));
            }
        };
        out.insert(k.clone(), text);
    }
    Ok(out)
}

/// The message of an Acquire's (or a Narrow's) answer.
pub(super) fn acquired_message(l: &lifecycle::Lease) -> String {
    format!(
        "{} server{} {}: {}{}",
        l.servers.len(),
        if l.servers.len() == 1 { "" } else { "s" },
        servers_are(l),
        l.servers.join(", "),
        skipped_note(&l.skipped)
    )
}

/// What a lease's servers are right after its Acquire or Reset.
pub(super) fn servers_are(l: &lifecycle::Lease) -> &'static str {
    if l.lazy {
        "to start on first use"
    } else {
        "ready"
    }
}

/// "; left out, ..." naming the servers an ALL Acquire did not start.
fn skipped_note(skipped: &[(String, String)]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = skipped.iter().map(|(n, _)| n.as_str()).collect();
    format!(
        "; left out, their outside service is not configured: {}",
        names.join(", ")
    )
}

pub(super) fn lease(l: &lifecycle::Lease) -> proto::Lease {
    proto::Lease {
        lease_id: l.id.clone(),
        benchmark: benchmark_to_proto(l.benchmark),
        server_names: l.servers.clone(),
        acquired_at_ms: l.acquired_at_ms,
        ttl_seconds: l.ttl_seconds,
        expires_at_ms: l.expires_at_ms,
        test_account_email: l.test_account_email.clone(),
        skipped: l
            .skipped
            .iter()
            .map(|(name, reason)| proto::SkippedServer {
                name: name.clone(),
                reason: reason.clone(),
            })
            .collect(),
        auth_data: l
            .auth_data
            .iter()
            .map(|(server, fields)| {
                let fields = fields
                    .iter()
                    .map(|(k, v)| (k.clone(), json_value(v)))
                    .collect();
                (server.clone(), prost_types::Struct { fields })
            })
            .collect(),
        lazy: l.lazy,
    }
}

/// A JSON value as a protobuf one.
fn json_value(v: &serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_value).collect(),
        }),
        J::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// GetInfo's answer: the system snapshot, the sandbox's state and its
/// manifest.
pub(super) fn info(
    s: Snapshot,
    view: lifecycle::View,
    manifest_path: String,
    manifest_servers: Vec<String>,
) -> proto::GetInfoResponse {
    proto::GetInfoResponse {
        agent_version: sandbox_client::VERSION.to_owned(),
        boot_id: s.boot_id,
        system_uptime_seconds: s.system_uptime_seconds,
        agent_uptime_ms: s.agent_uptime_ms,
        agent_pid: s.agent_pid,
        hostname: s.hostname,
        kernel_release: s.kernel_release,
        kernel_version: s.kernel_version,
        arch: s.arch,
        cpu_count: s.cpu_count,
        load_average: Some(proto::LoadAverage {
            one: s.load[0],
            five: s.load[1],
            fifteen: s.load[2],
        }),
        memory_total_bytes: s.memory_total_bytes,
        memory_available_bytes: s.memory_available_bytes,
        workspace: Some(proto::FilesystemUsage {
            path: s.workspace.path.display().to_string(),
            total_bytes: s.workspace.total_bytes,
            free_bytes: s.workspace.free_bytes,
            available_bytes: s.workspace.available_bytes,
        }),
        agent_rss_bytes: s.agent_rss_bytes,
        status: sandbox_status(view.status),
        lease: view.lease.as_ref().map(lease),
        last_release: view.last_release.map(|r| proto::ReleaseRecord {
            lease_id: r.lease_id,
            is_ttl: r.is_ttl,
            released_at_ms: r.at_ms,
        }),
        manifest_path,
        manifest_servers,
    }
}

// ---- servers

fn server_state(s: State) -> i32 {
    (match s {
        State::Stopped => proto::ServerState::Stopped,
        State::Starting => proto::ServerState::Starting,
        State::Ready => proto::ServerState::Ready,
        State::Backoff => proto::ServerState::Backoff,
        State::Failed => proto::ServerState::Failed,
        State::Stopping => proto::ServerState::Stopping,
        State::Idle => proto::ServerState::Idle,
    }) as i32
}

/// The proto status of one server.
pub(super) fn server_status(v: ServerView) -> proto::ServerStatus {
    let s = v.status;
    proto::ServerStatus {
        name: v.name,
        state: server_state(s.state),
        status: sandbox_status(v.klavis),
        transport: match v.transport {
            Transport::Stdio => proto::ServerTransport::Stdio,
            Transport::Http { .. } => proto::ServerTransport::Http,
        } as i32,
        mcp_path: v.mcp_path,
        pid: s.pid.map_or(0, |p| p as u32),
        restarts: s.restarts,
        state_since_ms: s.state_since_ms,
        last_exit: s.last_exit.map(|(e, at)| proto::ExitStatus {
            how: Some(match e {
                Exit::Code(c) => proto::exit_status::How::Code(c),
                Exit::Signal(g) => proto::exit_status::How::Signal(g),
            }),
            at_ms: at,
        }),
        message: s.message,
        started_at_ms: if s.pid.is_some() { s.started_at_ms } else { 0 },
        updated_at_ms: s.updated_at_ms,
        cpu_time_ms: v.usage.cpu_time_ms,
        rss_bytes: v.usage.rss_bytes,
        processes: v.usage.processes,
        stderr_tail: v.stderr_tail,
        in_lease: v.in_lease,
        id: v.id,
        benchmark: benchmark_to_proto(v.benchmark),
        metadata: v.metadata.into_iter().collect(),
    }
}

/// LogsRequest.stream: `None` is both.
pub(super) fn log_stream_filter(v: i32) -> Result<Option<LogStream>, Status> {
    match proto::LogStream::try_from(v) {
        Ok(proto::LogStream::All) => Ok(None),
        Ok(proto::LogStream::Stdout) => Ok(Some(LogStream::Stdout)),
        Ok(proto::LogStream::Stderr) => Ok(Some(LogStream::Stderr)),
        Err(_) => Err(Status::invalid_argument(format!(
            "unknown stream value {v}"
        ))),
    }
}

pub(super) fn log_line(server: String, f: logbuf::Followed) -> proto::LogLine {
    proto::LogLine {
        server,
        stream: match f.line.stream {
            LogStream::Stdout => proto::LogStream::Stdout,
            LogStream::Stderr => proto::LogStream::Stderr,
        } as i32,
        timestamp_ms: f.line.at_ms,
        line: f.line.text,
        truncated: f.line.truncated,
        dropped_before: f.dropped_before,
        seq: f.line.seq,
    }
}
