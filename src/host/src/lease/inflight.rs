//! Requests in flight per sandbox, stopped when its lease ends.
//!
//! A request is admitted once, when it arrives, against the sandbox its
//! caller holds then; a slow body (a stalled MCP POST, a multipart upload
//! at 1 B/s) can finish arriving after that lease ended and the next
//! tenant leased the same slot. Every request that talks to a sandbox's
//! agent runs under its sandbox's token: Release (DELETE, TTL, replace)
//! and Reset cancel it, so the request stops where it is. The agent holds
//! the same line on its side: each call names its lease
//! (`sandbox_client::lease`), refused once that lease is not current.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::store::SandboxRow;

use super::{Host, LeaseError, LeaseResult};

/// Sandbox id → the token its requests in flight run under.
#[derive(Default)]
pub struct Inflight {
    tokens: Mutex<HashMap<String, CancellationToken>>,
}

impl Inflight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops every request in flight for sandbox `id` (its lease ended or
    /// was reset); later requests get a token of their own.
    pub fn end(&self, id: &str) {
        if let Some(t) = self.lock().remove(id) {
            t.cancel();
        }
    }
}

/// The token a request for live sandbox `s` runs under. The sandbox is
/// looked up again after the token is taken: a Release that ran before
/// cannot have missed it (the store says released first, then the tokens
/// are ended).
pub async fn admit(h: &Host, s: &SandboxRow) -> LeaseResult<CancellationToken> {
    let token = h.inflight.lock().entry(s.id.clone()).or_default().clone();
    if matches!(h.store.admit_live(&s.id).await, Ok(Some(_))) {
        return Ok(token);
    }
    h.inflight.end(&s.id);
    Err(LeaseError::SandboxNotFound(s.id.clone()))
}

/// Runs `work` for sandbox `s` until it ends, or until the sandbox's lease
/// ends or is reset (409: nothing of the request reaches the next lease).
pub async fn run<T, E: From<LeaseError>>(
    h: &Host,
    s: &SandboxRow,
    work: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let token = admit(h, s).await?;
    tokio::select! {
        r = work => r,
        _ = token.cancelled() => Err(ended(&s.id).into()),
    }
}

/// Why a request stopped.
pub fn ended(id: &str) -> LeaseError {
    LeaseError::LeaseEnded(id.to_owned())
}
