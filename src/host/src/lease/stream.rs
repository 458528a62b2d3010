//! Streams from this host's upload store to an agent: a read failure of
//! the stored archive cancels the call, so the agent never takes a
//! truncated archive for whole.

use std::future::Future;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use super::{LeaseError, LeaseResult};

/// A stored archive as chunks for an agent's client stream, and the read
/// failure that ends it early, if any (see [`stream_to_agent`]).
pub fn stored_chunks(
    file: tokio::fs::File,
) -> (
    impl Stream<Item = Bytes> + Send + 'static,
    tokio::sync::oneshot::Receiver<std::io::Error>,
) {
    let (failed, failure) = tokio::sync::oneshot::channel();
    let reader = tokio_util::io::ReaderStream::with_capacity(file, 256 << 10);
    let chunks = futures_util::stream::unfold(
        (reader, Some(failed)),
        |(mut reader, mut failed)| async move {
            match reader.next().await {
                Some(Ok(b)) => Some((b, (reader, failed))),
                None => None,
                Some(Err(e)) => {
                    if let Some(f) = failed.take() {
                        let _ = f.send(e);
                    }
                    // Never ends: the call is cancelled instead, so the
                    // agent never takes a truncated archive for whole.
                    std::future::pending().await
                }
            }
        },
    );
    (chunks, failure)
}

/// Runs an agent call fed by [`stored_chunks`]: a read failure of the
/// stored archive cancels the call (the agent then changes nothing) and
/// fails the request.
pub async fn stream_to_agent<T>(
    what: &str,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    failure: tokio::sync::oneshot::Receiver<std::io::Error>,
) -> LeaseResult<T> {
    let failed = async {
        match failure.await {
            Ok(e) => e,
            // The stream ended whole: wait for the call.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        r = call => Ok(r.map_err(LeaseError::agent(what))?.into_inner()),
        e = failed => Err(LeaseError::Internal(format!(
            "{what}: reading the uploaded archive from this host's store: {e}"
        ))),
    }
}
