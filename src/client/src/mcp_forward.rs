//! Forwarding MCP HTTP requests to an agent's data plane, shared by the
//! host's MCP URLs and `sandboxctl mcp-proxy`: which requests a local proxy
//! admits (DNS rebinding: only local Host and Origin values, as the MCP
//! transport spec asks of local servers), and one request sent upstream
//! with its body streamed both ways.

use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::http::{HeaderMap, Request, Response, Uri, header};
use hyper_util::rt::TokioIo;

use crate::Endpoint;
use crate::mcp::NOT_FORWARDED;
use crate::transport::{DialError, HvsockOptions, dial};

/// The host names a local proxy answers to by default.
pub const LOCAL_HOSTS: &[&str] = &["localhost", "127.0.0.1", "[::1]", "::1"];

/// Why a request is not admitted.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("Host {0:?} is not allowed (DNS rebinding protection; allowed: {1})")]
    Host(String, String),
    #[error("Origin {0:?} is not allowed (allowed: web pages on {1})")]
    Origin(String, String),
}

/// The Host and Origin values a proxy admits: the hosts (ports are not
/// compared), and pages served from them.
#[derive(Debug, Clone)]
pub struct Admit {
    hosts: Vec<String>,
}

impl Default for Admit {
    fn default() -> Self {
        Admit::hosts(LOCAL_HOSTS.iter().map(|h| h.to_string()))
    }
}

impl Admit {
    pub fn hosts(hosts: impl IntoIterator<Item = String>) -> Admit {
        Admit {
            hosts: hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect(),
        }
    }

    fn allowed(&self, host_port: &str) -> bool {
        let h = host_port.to_ascii_lowercase();
        // "[::1]:8080", "localhost:8080", "localhost".
        let host = if h.starts_with('[') {
            h.split_inclusive(']').next().unwrap_or(&h).to_owned()
        } else {
            h.split(':').next().unwrap_or(&h).to_owned()
        };
        self.hosts.contains(&host)
    }

    /// Checks the request's Host (or HTTP/2 authority) and, when a browser
    /// sent one, its Origin.
    pub fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), Refused> {
        let list = || self.hosts.join(", ");
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| uri.authority().map(|a| a.to_string()))
            .unwrap_or_default();
        if !self.allowed(&host) {
            return Err(Refused::Host(host, list()));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let o = origin.to_str().unwrap_or("?");
            let ok = o
                .strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .is_some_and(|rest| self.allowed(rest.trim_end_matches('/')));
            if !ok {
                return Err(Refused::Origin(o.to_owned(), list()));
            }
        }
        Ok(())
    }
}

/// Why a request could not be forwarded (the caller answers 502).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error(transparent)]
    Dial(#[from] DialError),
    #[error("the data plane's HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("building the upstream request: {0}")]
    Request(#[from] hyper::http::Error),
}

/// How a forwarded request is admitted upstream.
#[derive(Debug, Clone, Copy, Default)]
pub struct Upstream<'a> {
    /// The data plane's bearer token.
    pub token: Option<&'a str>,
    /// The lease the request was admitted under ([`crate::lease`]): the
    /// agent refuses it once that lease has ended.
    pub lease: Option<&'a str>,
}

/// Sends `req` to `path` on the data plane at `target` over a connection of
/// its own: the hop-by-hop headers, Host, Authorization and any lease the
/// client named are dropped; `up` gives the data plane's bearer token and
/// the lease, if any. The answer's body streams as the agent writes it (SSE
/// included).
pub async fn forward<B>(
    target: &Endpoint,
    path: &str,
    req: Request<B>,
    up_auth: Upstream<'_>,
    timeout: Duration,
    hv: &HvsockOptions,
) -> Result<Response<Incoming>, ForwardError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = req.into_parts();
    let mut up = Request::builder()
        .method(parts.method)
        .uri(path)
        .header(header::HOST, "localhost");
    for (k, v) in &parts.headers {
        if !NOT_FORWARDED.contains(&k.as_str()) {
            up = up.header(k, v);
        }
    }
    if let Some(t) = up_auth.token {
        up = up.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    if let Some(l) = up_auth.lease {
        up = up.header(crate::lease::HEADER, l);
    }
    let up = up.body(body)?;
    let sock = dial(target, timeout, hv).await?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(sock)).await?;
    tokio::spawn(conn);
    let mut resp = send.send_request(up).await?;
    for h in ["connection", "keep-alive", "transfer-encoding"] {
        resp.headers_mut().remove(h);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(host: &str, origin: Option<&str>) -> bool {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().unwrap());
        if let Some(o) = origin {
            h.insert(header::ORIGIN, o.parse().unwrap());
        }
        Admit::default()
            .check(&Uri::from_static("/x/mcp"), &h)
            .is_ok()
    }

    #[test]
    fn only_local_hosts_and_origins_pass() {
        assert!(check("localhost:8080", None));
        assert!(check("127.0.0.1:9", Some("http://localhost:3000")));
        assert!(check("[::1]:9", Some("https://[::1]:3000")));
        assert!(!check("evil.example:8080", None));
        assert!(!check("localhost.evil.example", None));
        assert!(!check("localhost:8080", Some("http://evil.example")));
        assert!(!check("localhost:8080", Some("null")));
        assert!(!check(
            "localhost:8080",
            Some("http://localhost.evil.example:80")
        ));
    }
}
