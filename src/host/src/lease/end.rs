//! Reset and Release of a leased sandbox.

use sandbox_client::proto;
use tracing::warn;

use super::{LeaseError, LeaseResult, Shared, agent_of, timestamp};
use crate::store::{SandboxRow, Status};

/// The agent's Reset of sandbox `s`; returns it as it is after.
pub async fn reset(h: &Shared, s: SandboxRow) -> LeaseResult<SandboxRow> {
    // What the lease had in flight stops, and so does what arrives while
    // the Reset runs (ended again after it): nothing admitted before the
    // Reset is done lands after it.
    h.inflight.end(&s.id);
    let r = agent_of(h, &s, h.fleet.deadlines().acquire)
        .await?
        .agent()
        .reset(proto::ResetRequest {
            lease_id: s.id.clone(),
        })
        .await;
    h.inflight.end(&s.id);
    if let Err(e) = r {
        // Past its checks, a Reset that failed leaves the sandbox in error
        // (a clean-up or a server that failed): say so until a Reset or a
        // Release ends it.
        if !matches!(
            e.code(),
            tonic::Code::NotFound | tonic::Code::InvalidArgument
        ) {
            h.store
                .set_status(&s.id, Status::Error, &timestamp())
                .await?;
        }
        return Err(LeaseError::agent("reset")(e));
    }
    h.store
        .set_status(&s.id, Status::Occupied, &timestamp())
        .await?;
    Ok(h.store.get(&s.id, &s.owner).await?.unwrap_or(s))
}

/// Ends a sandbox: marked released now, then ended by its fleet in the
/// background ([`crate::fleet::Fleet::release`]).
pub async fn release_in_background(h: &Shared, s: &SandboxRow, is_ttl: bool) {
    // Until it is clean, it counts against its owner's cap: an owner
    // cannot leave more trash behind than it may hold sandboxes. Counted
    // before the store stops counting it as live (twice for a moment, never
    // not at all).
    let until_clean = h.cleaning.count(&s.owner);
    if let Err(e) = h.store.mark_released(&s.id, &timestamp()).await {
        warn!(sandbox = %s.id, error = %e, "cannot record the release");
    }
    h.uploads.release(&s.id);
    // After the store says released: a request admitted later finds it so
    // (`inflight::admit`); one in flight stops here.
    h.inflight.end(&s.id);
    h.fleet
        .release(s, is_ttl, &h.releases, Box::new(until_clean));
}
