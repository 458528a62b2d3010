//! Upload streams (Initialize, Exec.Upload): the client's messages → the
//! blocking extractor's input.

use tokio::sync::mpsc;
use tonic::Streaming;

use crate::workspace::stream::Feed;
use crate::workspace::{ArchiveError, MAX_CHUNK_BYTES};

/// One message of an upload stream.
pub(super) enum Part {
    Header,
    Chunk(bytes::Bytes),
    Empty,
}

/// Feeds an upload stream's chunks to the blocking extractor through
/// `tx`, turning a second header, an oversized chunk or a broken stream
/// into the extractor's error; then closes `tx` and never completes (the
/// caller selects it against the extractor's result).
pub(super) async fn forward<M>(
    mut stream: Streaming<M>,
    tx: mpsc::Sender<Feed>,
    header: &'static str,
    part: fn(M) -> Part,
) {
    loop {
        let feed = match stream.message().await {
            Ok(Some(m)) => match part(m) {
                Part::Chunk(b) if b.len() > MAX_CHUNK_BYTES => Err(ArchiveError::invalid(format!(
                    "a chunk of {} bytes is larger than the {MAX_CHUNK_BYTES}-byte limit",
                    b.len()
                ))),
                Part::Chunk(b) => Ok(b),
                Part::Header => Err(ArchiveError::invalid(format!(
                    "a second {header} arrived; send one header, then chunks"
                ))),
                Part::Empty => continue,
            },
            Ok(None) => break,
            Err(s) => Err(ArchiveError::Cancelled(format!(
                "the upload stream broke: {}",
                s.message()
            ))),
        };
        let stop = feed.is_err();
        if tx.send(feed).await.is_err() || stop {
            break;
        }
    }
    // End of input for the extractor; then wait for its result.
    drop(tx);
    std::future::pending::<()>().await
}
