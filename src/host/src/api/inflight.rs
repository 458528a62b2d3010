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

use axum::body::Body;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::error::{HostError, HostResult};
use crate::store::SandboxRow;

use super::Host;

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
pub async fn admit(h: &Host, s: &SandboxRow) -> HostResult<CancellationToken> {
    let token = h.inflight.lock().entry(s.id.clone()).or_default().clone();
    if matches!(h.store.admit_live(&s.id).await, Ok(Some(_))) {
        return Ok(token);
    }
    h.inflight.end(&s.id);
    Err(HostError::SandboxNotFound(s.id.clone()))
}

/// Runs `work` for sandbox `s` until it ends, or until the sandbox's lease
/// ends or is reset (409: nothing of the request reaches the next lease).
pub async fn run<T>(
    h: &Host,
    s: &SandboxRow,
    work: impl Future<Output = HostResult<T>>,
) -> HostResult<T> {
    let token = admit(h, s).await?;
    tokio::select! {
        r = work => r,
        _ = token.cancelled() => Err(ended(&s.id)),
    }
}

/// A response body that stops (an error mid-stream, so the client never
/// takes it for whole) when `token` is cancelled.
pub fn body(body: Body, token: CancellationToken, id: &str) -> Body {
    let state = (body.into_data_stream(), token, id.to_owned(), false);
    Body::from_stream(futures_util::stream::unfold(
        state,
        |(mut s, token, id, cut)| async move {
            if cut {
                return None;
            }
            tokio::select! {
                biased;
                _ = token.cancelled() => {
                    let e = axum::Error::new(ended(&id));
                    Some((Err(e), (s, token, id, true)))
                }
                item = s.next() => item.map(|i| (i, (s, token, id, false))),
            }
        },
    ))
}

/// `resp` with its body cut when `token` is cancelled ([`body`]).
pub fn response(
    resp: axum::response::Response,
    token: CancellationToken,
    id: &str,
) -> axum::response::Response {
    let (parts, b) = resp.into_parts();
    axum::response::Response::from_parts(parts, body(b, token, id))
}

/// Why a request stopped.
pub fn ended(id: &str) -> HostError {
    HostError::LeaseEnded(id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_cut_body_ends_with_an_error_never_as_if_whole() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(4);
        let upstream = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let token = CancellationToken::new();
        let mut b = body(upstream, token.clone(), "s1");
        tx.send(Ok("first".into())).await.expect("send");
        let first = b.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), "first");
        token.cancel();
        let cut = b.frame().await.expect("a frame");
        assert!(cut.unwrap_err().to_string().contains("released or reset"));
        assert!(b.frame().await.is_none());
    }

    #[tokio::test]
    async fn an_uncut_body_passes_whole() {
        let token = CancellationToken::new();
        let b = body(Body::from("all of it"), token, "s1");
        let bytes = b.collect().await.expect("whole").to_bytes();
        assert_eq!(bytes, "all of it");
    }
}
