//! The per-server data of a sandbox's servers (google_cloud, mail,
//! canvas, localmemory): loaded by its agent, and dumped.

use sandbox_client::proto;
use serde_json::Value;
use tracing::info;

use super::{Host, LeaseError, LeaseResult, agent_of};
use crate::store::SandboxRow;

/// The largest dump the host takes from an agent (the agent's own
/// mail.max_data_bytes bounds it first).
const MAX_DUMP_BYTES: usize = 256 << 20;

/// Loads `data` (`None`: the server's defaults) into `server` of sandbox
/// `s`; the agent's summary of what it loaded.
pub async fn load(
    h: &Host,
    s: &SandboxRow,
    server: &str,
    data: Option<Value>,
) -> LeaseResult<String> {
    let c = agent_of(h, s, h.fleet.deadlines().transfer).await?;
    let r = c
        .servers()
        .load_data(proto::LoadDataRequest {
            server_name: server.to_owned(),
            default_data: data.is_none(),
            json: data.map(|d| d.to_string()).unwrap_or_default(),
        })
        .await
        .map_err(LeaseError::agent(format!("initializing {server}")))?
        .into_inner();
    info!(sandbox = %s.id, server = %server, summary = %r.summary, "server data loaded");
    Ok(r.summary)
}

/// `server`'s data of sandbox `s`, and when it was dumped (unix ms).
pub async fn dump(h: &Host, s: &SandboxRow, server: &str) -> LeaseResult<(Value, u64)> {
    let c = agent_of(h, s, h.fleet.deadlines().transfer).await?;
    let r = c
        .servers()
        .max_decoding_message_size(MAX_DUMP_BYTES)
        .dump_data(proto::DumpDataRequest {
            server_name: server.to_owned(),
        })
        .await
        .map_err(LeaseError::agent(format!("dumping {server}")))?
        .into_inner();
    let data: Value = serde_json::from_str(&r.json).map_err(|e| {
        LeaseError::BadAgentAnswer(format!("the sandbox's {server} dump is not JSON: {e}"))
    })?;
    Ok((data, r.dumped_at_ms))
}
