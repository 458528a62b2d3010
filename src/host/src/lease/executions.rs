//! A sandbox's executions through its agent's `Exec` service: started
//! from an archive in the upload store, followed, exported. Each call is
//! bound to the lease (the agent refuses it once the lease ended); the
//! long ones stop when it ends or is reset.

use futures_util::StreamExt;
use sandbox_client::proto;

use super::stream::{stored_chunks, stream_to_agent};
use super::{Host, LeaseError, LeaseResult, agent_of, inflight};
use crate::store::SandboxRow;

/// Uploads execution `name`'s stored archive (`file`) to sandbox `s` and
/// starts it; what the upload replaced.
pub async fn start(
    h: &Host,
    s: &SandboxRow,
    name: &str,
    file: tokio::fs::File,
) -> LeaseResult<proto::ExecUploadResponse> {
    inflight::run(h, s, async {
        let c = agent_of(h, s, h.fleet.deadlines().transfer).await?;
        let up = upload_to_agent(&c, file, &s.id, name).await?;
        c.exec()
            .start(proto::ExecStartRequest {
                lease_id: s.id.clone(),
                execution_name: name.to_owned(),
            })
            .await
            .map_err(LeaseError::agent("execute"))?;
        Ok(up)
    })
    .await
}

/// Execution `name`'s status (an unknown one is the agent's NotFound),
/// asked for `what`.
pub async fn status(
    h: &Host,
    s: &SandboxRow,
    name: &str,
    what: &str,
) -> LeaseResult<proto::ExecStatus> {
    Ok(agent_of(h, s, h.fleet.deadlines().call)
        .await?
        .exec()
        .status(proto::ExecStatusRequest {
            lease_id: s.id.clone(),
            execution_name: name.to_owned(),
        })
        .await
        .map_err(LeaseError::agent(what))?
        .into_inner())
}

/// Execution `name`'s output from `cursor` on.
pub async fn logs(
    h: &Host,
    s: &SandboxRow,
    name: &str,
    cursor: u64,
) -> LeaseResult<proto::ExecLogsResponse> {
    Ok(agent_of(h, s, h.fleet.deadlines().call)
        .await?
        .exec()
        .logs(proto::ExecLogsRequest {
            lease_id: s.id.clone(),
            execution_name: name.to_owned(),
            cursor,
            max_bytes: 0,
        })
        .await
        .map_err(LeaseError::agent("execution-logs"))?
        .into_inner())
}

/// Execution `name`'s directory as the agent's archive stream.
pub async fn export(
    h: &Host,
    s: &SandboxRow,
    name: &str,
) -> LeaseResult<tonic::Response<tonic::Streaming<proto::DumpResponse>>> {
    inflight::run(h, s, async {
        agent_of(h, s, h.fleet.deadlines().call)
            .await?
            .exec()
            .export(proto::ExecExportRequest {
                lease_id: s.id.clone(),
                execution_name: name.to_owned(),
            })
            .await
            .map_err(LeaseError::agent("export-artifacts"))
    })
    .await
}

/// Streams an execution's stored archive to the agent's `Exec.Upload`.
async fn upload_to_agent(
    c: &sandbox_client::Client,
    file: tokio::fs::File,
    id: &str,
    name: &str,
) -> LeaseResult<proto::ExecUploadResponse> {
    let size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let head = proto::ExecUploadRequest {
        msg: Some(proto::exec_upload_request::Msg::Header(
            proto::ExecUploadHeader {
                lease_id: id.to_owned(),
                execution_name: name.to_owned(),
                compression: proto::Compression::Auto as i32,
                size_hint: size,
            },
        )),
    };
    let (chunks, failure) = stored_chunks(file);
    let chunks = chunks.map(|c| proto::ExecUploadRequest {
        msg: Some(proto::exec_upload_request::Msg::Chunk(c)),
    });
    let stream = futures_util::stream::iter([head]).chain(chunks);
    let mut exec = c.exec();
    stream_to_agent("execute", exec.upload(stream), failure).await
}
