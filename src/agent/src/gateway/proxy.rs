//! Reverse proxy for servers that speak streamable HTTP themselves.

use http::{Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use sandbox_client::mcp::NOT_FORWARDED;

use super::{Body, BoxError, Gateway, http_error};

impl Gateway {
    /// Reverse-proxies a request to a server that speaks streamable HTTP
    /// itself. The request body is read whole (within the limit), then the
    /// lease is checked again (`lease_ended`); answers stream, so SSE
    /// passes through as it is written.
    pub(super) async fn proxy(
        &self,
        req: http::Request<Incoming>,
        name: &str,
        lease: &str,
        port: u16,
        path: &str,
    ) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let body = match self.read_body(body).await {
            Ok(b) => http_body_util::Full::new(b),
            Err(refused) => return *refused,
        };
        if let Err(e) = self.conn_ready(name).await {
            return http_error(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
        }
        if let Some(refused) = self.lease_ended(name, lease) {
            return refused;
        }
        let mut up = http::Request::builder()
            .method(parts.method.clone())
            .uri(path)
            .header(header::HOST, format!("127.0.0.1:{port}"));
        for (k, v) in &parts.headers {
            if !NOT_FORWARDED.contains(&k.as_str()) {
                up = up.header(k, v);
            }
        }
        let up = match up.body(body) {
            Ok(r) => r,
            Err(e) => {
                return http_error(
                    StatusCode::BAD_REQUEST,
                    format!("cannot forward the request: {e}"),
                );
            }
        };
        let unreachable = |e: String| {
            http_error(
                StatusCode::BAD_GATEWAY,
                format!("server {name} is not answering on 127.0.0.1:{port}: {e}"),
            )
        };
        let tcp = match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(t) => t,
            Err(e) => return unreachable(e.to_string()),
        };
        let (mut send, conn) =
            match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await {
                Ok(x) => x,
                Err(e) => return unreachable(e.to_string()),
            };
        tokio::spawn(conn);
        let resp = match send.send_request(up).await {
            Ok(r) => r,
            Err(e) => return unreachable(e.to_string()),
        };
        let (parts, body) = resp.into_parts();
        let mut r = Response::from_parts(parts, body.map_err(BoxError::from).boxed_unsync());
        for h in ["connection", "keep-alive", "transfer-encoding"] {
            r.headers_mut().remove(h);
        }
        r
    }
}
