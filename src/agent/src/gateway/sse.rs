//! Server-sent event bodies (encoded by the `sse-stream` crate), with
//! keep-alive comments so idle streams survive proxies' read timeouts.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use http::{HeaderValue, Response, header};
use http_body_util::BodyExt;
use sse_stream::{KeepAlive, Sse, SseBody, Timer};

use super::{Body, BoxError};

/// The keep-alive timer of [`SseBody`] on tokio's clock.
pub struct TokioTimer(Pin<Box<tokio::time::Sleep>>);

impl Future for TokioTimer {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl Timer for TokioTimer {
    fn reset(mut self: Pin<&mut Self>, instant: std::time::Instant) {
        self.0
            .as_mut()
            .reset(tokio::time::Instant::from_std(instant));
    }
    fn from_duration(duration: Duration) -> Self {
        TokioTimer(Box::pin(tokio::time::sleep(duration)))
    }
}

/// A `text/event-stream` response: one `message` event per JSON-RPC
/// message (serialized), and a comment every `keep_alive` while nothing is
/// sent.
pub fn response<S>(messages: S, keep_alive: Duration) -> Response<Body>
where
    S: Stream<Item = String> + Send + 'static,
{
    let events = messages.map(|m| Ok::<_, Infallible>(Sse::default().event("message").data(m)));
    let body =
        SseBody::<_, TokioTimer>::new_keep_alive(events, KeepAlive::new().interval(keep_alive))
            .map_err(BoxError::from)
            .boxed_unsync();
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}
