//! `exec upload|run|status|logs|export|cancel`: script executions in the
//! leased sandbox (the agent's `Exec` service).

use crate::output::outln;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use sandbox_client::Client;
use sandbox_client::proto;
use serde_json::json;
use tokio_stream::StreamExt;

use crate::output::{bytes, rpc_error};
use crate::transfer::{save, source};

/// Uploads `path` (a directory holding main.py, or an archive file) as
/// execution `name`.
pub async fn upload(
    client: &Client,
    name: &str,
    path: &Path,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    use proto::exec_upload_request::Msg;
    let src = source(path)?;
    let header = proto::ExecUploadRequest {
        msg: Some(Msg::Header(proto::ExecUploadHeader {
            lease_id: String::new(),
            execution_name: name.to_owned(),
            compression: src.compression as i32,
            size_hint: src.size.unwrap_or(0),
        })),
    };
    let requests = tokio_stream::once(header).chain(
        tokio_stream::wrappers::ReceiverStream::new(src.chunks).map(|b| proto::ExecUploadRequest {
            msg: Some(Msg::Chunk(b)),
        }),
    );
    let mut exec = client.exec();
    let call = exec.upload(requests);
    tokio::pin!(call);
    let mut producer = src.producer;
    let answer = tokio::select! {
        r = &mut call => r,
        p = &mut producer => match p {
            Ok(Ok(())) => call.await,
            Ok(Err(e)) => return Err(e.context("upload aborted")),
            Err(e) => anyhow::bail!("upload aborted: {e}"),
        },
    };
    let r = answer
        .map_err(|s| rpc_error("Exec.Upload", s))?
        .into_inner();
    if json_out {
        outln!(
            "{}",
            json!({"ok": true, "execution_name": r.execution_name, "files": r.files,
                   "bytes_written": r.bytes_written, "archive_bytes": r.archive_bytes,
                   "replaced": r.replaced, "killed_running": r.killed_running})
        );
    } else {
        outln!(
            "uploaded execution {} ({} files, {}){}",
            r.execution_name,
            r.files,
            bytes(r.bytes_written),
            match (r.replaced, r.killed_running) {
                (_, true) => "; the running execution of that name was killed and replaced",
                (true, false) => "; it replaces the previous one",
                _ => "",
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts `name` (uploading `path` first when given); with `follow`,
/// streams its log and exits with its outcome.
pub async fn run(
    client: &Client,
    name: &str,
    path: Option<&Path>,
    follow: bool,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    if let Some(p) = path {
        upload(client, name, p, json_out).await?;
    }
    let st = client
        .exec()
        .start(proto::ExecStartRequest {
            lease_id: String::new(),
            execution_name: name.to_owned(),
        })
        .await
        .map_err(|s| rpc_error("Exec.Start", s))?
        .into_inner();
    if !follow {
        print_status(&st, json_out);
        return Ok(ExitCode::SUCCESS);
    }
    logs(client, name, 0, true, json_out).await
}

fn print_status(st: &proto::ExecStatus, json_out: bool) {
    if json_out {
        outln!(
            "{}",
            json!({"execution_name": st.execution_name, "status": st.klavis_status,
                   "state": proto::ExecState::try_from(st.state).map(|s| s.as_str_name()).unwrap_or("?"),
                   "message": st.message, "exit_code": st.exit_code, "signal": st.signal,
                   "started_at_ms": st.started_at_ms, "finished_at_ms": st.finished_at_ms,
                   "log_bytes": st.log_bytes, "log_capped": st.log_capped, "directory": st.directory})
        );
        return;
    }
    let exit = match (st.exit_code, st.signal) {
        (Some(c), _) => format!(", exit code {c}"),
        (_, Some(s)) => format!(", signal {s}"),
        _ => String::new(),
    };
    let secs = match (st.started_at_ms, st.finished_at_ms) {
        (0, _) => String::new(),
        (s, 0) => format!(
            ", running for {:.1} s",
            (sandbox_client::now_ms() - s) as f64 / 1e3
        ),
        (s, f) => format!(", took {:.1} s", (f - s) as f64 / 1e3),
    };
    outln!(
        "{}: {}{exit}{secs}, log {}{}{}",
        st.execution_name,
        st.klavis_status,
        bytes(st.log_bytes),
        if st.log_capped { " (capped)" } else { "" },
        if st.message.is_empty() {
            String::new()
        } else {
            format!(" — {}", st.message)
        }
    );
}

/// One execution's status, or every execution's.
pub async fn status(
    client: &Client,
    name: Option<&str>,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let list = match name {
        Some(n) => vec![
            client
                .exec()
                .status(proto::ExecStatusRequest {
                    lease_id: String::new(),
                    execution_name: n.to_owned(),
                })
                .await
                .map_err(|s| rpc_error("Exec.Status", s))?
                .into_inner(),
        ],
        None => {
            client
                .exec()
                .list(proto::ExecListRequest::default())
                .await
                .map_err(|s| rpc_error("Exec.List", s))?
                .into_inner()
                .executions
        }
    };
    if list.is_empty() && !json_out {
        outln!("no executions in this lease");
    }
    for st in &list {
        print_status(st, json_out);
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the log from `cursor`; with `follow`, until the run ends, then
/// exits 0 only if it completed.
pub async fn logs(
    client: &Client,
    name: &str,
    cursor: u64,
    follow: bool,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let req = proto::ExecLogsRequest {
        lease_id: String::new(),
        execution_name: name.to_owned(),
        cursor,
        max_bytes: 0,
    };
    let mut out = std::io::stdout().lock();
    let mut last = None;
    if follow {
        let mut stream = client
            .exec()
            .follow_logs(req)
            .await
            .map_err(|s| rpc_error("Exec.FollowLogs", s))?
            .into_inner();
        while let Some(m) = stream.next().await {
            let m = m.map_err(|s| rpc_error("Exec.FollowLogs", s))?;
            emit(&mut out, &m, json_out)?;
            last = Some(m);
        }
    } else {
        let m = client
            .exec()
            .logs(req)
            .await
            .map_err(|s| rpc_error("Exec.Logs", s))?
            .into_inner();
        emit(&mut out, &m, json_out)?;
        last = Some(m);
    }
    let ok = last.is_some_and(|m| m.klavis_status != "failed");
    Ok(if !follow || ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn emit(out: &mut impl Write, m: &proto::ExecLogsResponse, json_out: bool) -> anyhow::Result<()> {
    let r = if json_out {
        writeln!(
            out,
            "{}",
            json!({"status": m.klavis_status, "logs": m.logs, "cursor": m.next_cursor, "complete": m.complete})
        )
    } else {
        out.write_all(m.logs.as_bytes()).and_then(|()| out.flush())
    };
    match r {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`): stop quietly.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(0);
        }
        Err(e) => Err(e).context("writing the log"),
    }
}

/// Saves an execution's directory as a tar.gz.
pub async fn export(
    client: &Client,
    name: &str,
    output: &str,
    json_out: bool,
) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let stream = client
        .exec()
        .export(proto::ExecExportRequest {
            lease_id: String::new(),
            execution_name: name.to_owned(),
        })
        .await
        .map_err(|s| rpc_error("Exec.Export", s))?
        .into_inner();
    save(stream, "Exec.Export", "exported", output, start, json_out).await
}

/// Kills a queued or running execution.
pub async fn cancel(client: &Client, name: &str, json_out: bool) -> anyhow::Result<ExitCode> {
    let st = client
        .exec()
        .cancel(proto::ExecCancelRequest {
            lease_id: String::new(),
            execution_name: name.to_owned(),
        })
        .await
        .map_err(|s| rpc_error("Exec.Cancel", s))?
        .into_inner();
    print_status(&st, json_out);
    Ok(ExitCode::SUCCESS)
}
