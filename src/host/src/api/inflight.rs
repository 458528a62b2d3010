//! A response body cut (an error mid-stream) when its sandbox's lease ends
//! or is reset (`crate::lease::inflight` keeps the tokens).

use axum::body::Body;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::error::{HostError, HostResult};
use crate::lease::Host;
use crate::store::SandboxRow;

/// The token a request for live sandbox `s` runs under
/// (`lease::inflight::admit`).
pub async fn admit(h: &Host, s: &SandboxRow) -> HostResult<CancellationToken> {
    Ok(crate::lease::inflight::admit(h, s).await?)
}

/// Runs `work` for sandbox `s` until it ends, or until the sandbox's lease
/// ends or is reset (409; `lease::inflight::run`).
pub async fn run<T>(
    h: &Host,
    s: &SandboxRow,
    work: impl std::future::Future<Output = HostResult<T>>,
) -> HostResult<T> {
    crate::lease::inflight::run(h, s, work).await
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
    crate::lease::inflight::ended(id).into()
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
