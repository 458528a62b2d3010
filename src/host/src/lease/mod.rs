//! The lease service: Acquire, Release and Reset for both of Klavis's
//! APIs, the owners' caps, TTLs, the sandboxes' requests in flight, their
//! executions and per-server data, and the streams from the upload store
//! to an agent; the rules, with no HTTP in them (`api/` adapts them). Its errors are
//! [`LeaseError`], which `crate::error` maps to statuses.

mod acquire;
mod cleaning;
pub mod data;
mod end;
mod error;
pub mod executions;
pub mod inflight;
mod reaper;
pub mod stream;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::signed::Signer;
use crate::store::{SandboxRow, Store};
use crate::uploads::Uploads;

pub use acquire::{AcquireAsk, acquire_message, lease};
pub use end::{release_in_background, reset};
pub use error::{LeaseError, LeaseResult};
pub use reaper::{probe, reap};

/// The host's state, which every request and background task shares.
pub struct Host {
    pub metrics: crate::metrics::Metrics,
    pub store: Store,
    /// Where the sandboxes come from: the pool's slots, or claimed pods.
    pub fleet: Arc<dyn crate::fleet::Fleet>,
    pub signer: Signer,
    /// API key → owner.
    pub keys: HashMap<String, String>,
    pub public_url: String,
    pub uploads: Uploads,
    /// Multiplies TTLs (tests shorten the clock with it).
    pub time_scale: f64,
    /// When servers start (`--server-start`).
    pub server_start: crate::pool::ServerStart,
    /// Live sandboxes per owner (`--max-sandboxes-per-key`).
    pub max_per_owner: usize,
    /// Acquires in flight per owner, counted against `max_per_owner`
    /// until their sandbox is stored.
    pub acquiring: std::sync::Mutex<HashMap<String, usize>>,
    /// Released sandboxes per owner still being cleaned up, counted
    /// against `max_per_owner` until they are clean.
    pub cleaning: Arc<cleaning::OwnerCount>,
    /// Releases running in the background; a shutdown waits for them, so a
    /// released sandbox is back in the pool (and stopped with it), never
    /// left running outside it.
    pub releases: tokio_util::task::TaskTracker,
    /// Requests in flight per sandbox, stopped at its Release and Reset.
    pub inflight: inflight::Inflight,
}

pub type Shared = Arc<Host>;

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn timestamp() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, false)
}

/// The agent of a live sandbox, every call bound to its lease: the agent
/// refuses them once the lease has ended (`sandbox_client::lease`). Each
/// call fails past `within` (one of [`crate::pool::Deadlines`]).
pub async fn agent_of(
    h: &Host,
    s: &SandboxRow,
    within: Duration,
) -> LeaseResult<sandbox_client::Client> {
    let slot = slot_of(h, s)?;
    let c = slot
        .client(within)
        .await
        .map_err(LeaseError::AgentUnreachable)?;
    Ok(c.for_lease(&s.id))
}

/// The slot a live sandbox runs in: the pool's, or its claimed pod.
pub fn slot_of(h: &Host, s: &SandboxRow) -> LeaseResult<crate::pool::Slot> {
    Ok(h.fleet.slot_of(s)?)
}

/// A protobuf Struct as JSON.
pub fn struct_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &prost_types::Value) -> Value {
    use prost_types::value::Kind;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9e15 => Value::from(*n as i64),
        Some(Kind::NumberValue(n)) => Value::from(*n),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}
