//! Readiness probe of an HTTP server: its MCP path answers on loopback.

use std::time::Duration;

use http_body_util::Empty;
use hyper_util::rt::TokioIo;

/// One probe: `GET http://127.0.0.1:port/path`. Any answer other than 404
/// or a 5xx means the endpoint is served (an MCP endpoint may well answer a
/// bare GET with 400, 405 or 406).
pub async fn http_ready(port: u16, path: &str, timeout: Duration) -> Result<(), ProbeError> {
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| ProbeError::Connect(port, e))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(ProbeError::Handshake)?;
        let driver = tokio::spawn(conn);
        let req = http::Request::get(path)
            .header(http::header::HOST, format!("127.0.0.1:{port}"))
            .header(http::header::ACCEPT, "text/event-stream, application/json")
            .body(Empty::<bytes::Bytes>::new())
            .map_err(ProbeError::Request)?;
        let resp = send.send_request(req).await;
        driver.abort();
        let status = resp
            .map_err(|e| ProbeError::Get(path.to_owned(), e))?
            .status();
        if status == http::StatusCode::NOT_FOUND || status.is_server_error() {
            return Err(ProbeError::Status(path.to_owned(), status));
        }
        Ok(())
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(ProbeError::Timeout(path.to_owned(), timeout)))
}

/// Why an HTTP server is not ready (yet).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("connect 127.0.0.1:{0}: {1}")]
    Connect(u16, std::io::Error),
    #[error("HTTP handshake: {0}")]
    Handshake(hyper::Error),
    #[error("building the probe request: {0}")]
    Request(http::Error),
    #[error("GET {0}: {1}")]
    Get(String, hyper::Error),
    #[error("GET {0} answered {1}")]
    Status(String, http::StatusCode),
    #[error("GET {0} got no answer within {1:?}")]
    Timeout(String, Duration),
}
