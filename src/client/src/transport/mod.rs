//! Transports: where the agent listens and how clients reach it.
//!
//! An [`Endpoint`] is parsed from a URI (`vsock://`, `unix://`, `tcp://`,
//! and client-only `hvsock://`); [`dial`] opens a client connection,
//! including the hybrid-vsock `CONNECT` handshake ([`hvsock`]). Listening
//! on an endpoint is the servers' part: `sandbox-serve`'s `Listener`, which
//! accepts into the same [`Io`].

pub mod hvsock;
mod uri;

pub use hvsock::HvsockOptions;
pub use uri::{
    ACCEPTED_FORMS, DEFAULT_AGENT_LISTEN, DEFAULT_MCP_LISTEN, Endpoint, UriError, VMADDR_CID_ANY,
    bracket_host,
};

use std::io;
use std::time::Duration;

/// A connected byte stream over any transport (client or server side).
pub enum Io {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
    Vsock(tokio_vsock::VsockStream),
}

/// Errors from dialing an endpoint.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("connecting to {endpoint}: {source}")]
    Io {
        endpoint: String,
        #[source]
        source: io::Error,
    },
    #[error("connecting to {endpoint}: no answer within {timeout:?}")]
    Timeout { endpoint: String, timeout: Duration },
    #[error(transparent)]
    Hvsock(#[from] hvsock::HvsockError),
    #[error(
        "{endpoint}: listening on any CID is for servers; give the CID of the VM to connect to"
    )]
    AnyCid { endpoint: String },
}

/// Opens one client connection to `endpoint`.
///
/// `connect_timeout` bounds a single attempt on tcp, unix and vsock. The
/// hybrid-vsock handshake has its own timeout and retry deadline in `hv`.
pub async fn dial(
    endpoint: &Endpoint,
    connect_timeout: Duration,
    hv: &HvsockOptions,
) -> Result<Io, DialError> {
    let name = endpoint.to_string();
    match endpoint {
        Endpoint::Tcp { host, port } => {
            let addr = format!("{}:{port}", uri::bracket_host(host));
            let s = within(&name, connect_timeout, async move {
                let s = tokio::net::TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                Ok(s)
            })
            .await?;
            Ok(Io::Tcp(s))
        }
        Endpoint::Unix(path) => {
            let s = within(
                &name,
                connect_timeout,
                tokio::net::UnixStream::connect(path),
            )
            .await?;
            Ok(Io::Unix(s))
        }
        Endpoint::Vsock { cid, port } => {
            if *cid == VMADDR_CID_ANY {
                return Err(DialError::AnyCid { endpoint: name });
            }
            let addr = tokio_vsock::VsockAddr::new(*cid, *port);
            let s = within(
                &name,
                connect_timeout,
                tokio_vsock::VsockStream::connect(addr),
            )
            .await?;
            Ok(Io::Vsock(s))
        }
        Endpoint::HybridVsock { path, port } => {
            Ok(Io::Unix(hvsock::connect(path, *port, hv).await?))
        }
    }
}

/// Runs one connection attempt, mapping its failure to a [`DialError`].
async fn within<T>(
    endpoint: &str,
    timeout: Duration,
    attempt: impl Future<Output = io::Result<T>>,
) -> Result<T, DialError> {
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(source)) => Err(DialError::Io {
            endpoint: endpoint.to_owned(),
            source,
        }),
        Err(_) => Err(DialError::Timeout {
            endpoint: endpoint.to_owned(),
            timeout,
        }),
    }
}

macro_rules! delegate_io {
    ($ty:ident { $($variant:ident),+ }) => {
        impl tokio::io::AsyncRead for $ty {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => std::pin::Pin::new(s).poll_read(cx, buf),)+
                }
            }
        }

        impl tokio::io::AsyncWrite for $ty {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$variant(s) => std::pin::Pin::new(s).poll_write(cx, buf),)+
                }
            }

            fn poll_write_vectored(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    $($ty::$variant(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),)+
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    $($ty::$variant(s) => s.is_write_vectored(),)+
                }
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => std::pin::Pin::new(s).poll_flush(cx),)+
                }
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                match self.get_mut() {
                    $($ty::$variant(s) => std::pin::Pin::new(s).poll_shutdown(cx),)+
                }
            }
        }
    };
}
delegate_io!(Io { Tcp, Unix, Vsock });
