//! Readiness probe of an HTTP server: its MCP path answers on loopback.

use std::time::Duration;

use http_body_util::Empty;
use hyper_util::rt::TokioIo;

/// One probe: `GET http://127.0.0.1:port/path`. Any answer other than 404
/// or a 5xx means the endpoint is served (an MCP endpoint may well answer a
/// bare GET with 400, 405 or 406).
pub async fn http_ready(port: u16, path: &str, timeout: Duration) -> Result<(), String> {
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        let driver = tokio::spawn(conn);
        let req = http::Request::get(path)
            .header(http::header::HOST, format!("127.0.0.1:{port}"))
            .header(http::header::ACCEPT, "text/event-stream, application/json")
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| format!("building the probe request: {e}"))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("GET {path}: {e}"));
        driver.abort();
        let status = resp?.status();
        if status == http::StatusCode::NOT_FOUND || status.is_server_error() {
            return Err(format!("GET {path} answered {status}"));
        }
        Ok(())
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("GET {path} got no answer within {timeout:?}")))
}
