//! Listening sockets and the accepted-connection stream tonic serves.
//!
//! Invariants enforced here:
//! - a unix socket is created with mode 0600, a stale socket file (nobody
//!   listening) is replaced, and a live one or a non-socket file is never
//!   touched;
//! - the socket file is removed when its accept loop ends, but only if it is
//!   still the file this process created;
//! - each listener holds at most `max_connections` open connections; further
//!   clients wait in the kernel backlog until one closes.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_vsock::{VsockAddr, VsockListener};
use tracing::{info, warn};

use sandbox_client::transport::{Endpoint, Io, bracket_host};

/// Why a listener could not be created.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error(
        "{endpoint}: hvsock:// is a client-side transport; the agent listens on vsock:// inside the VM"
    )]
    ClientOnly { endpoint: String },
    #[error(
        "{endpoint}: another process is already listening on {path}; stop it or choose another path"
    )]
    UnixInUse { endpoint: String, path: PathBuf },
    #[error("{endpoint}: {path} exists and is not a socket; refusing to replace it")]
    NotASocket { endpoint: String, path: PathBuf },
    #[error(
        "{endpoint}: vsock is not available on this machine ({source}); is this a VM with a virtio-vsock device?"
    )]
    NoVsock {
        endpoint: String,
        #[source]
        source: io::Error,
    },
    #[error("{endpoint}: {what}: {source}")]
    Io {
        endpoint: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Who is on the other end of an accepted connection, for logs and auth.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Transport of the listener: `tcp`, `unix` or `vsock`.
    pub transport: &'static str,
    /// Peer address (`ip:port`, `cid:port`, or `unix` peer credentials).
    pub peer: String,
}

/// An accepted connection. Holds a slot of its listener's connection limit
/// until dropped.
pub struct Conn {
    io: Io,
    info: ConnInfo,
    _permit: OwnedSemaphorePermit,
    /// Until the client has sent its opening bytes: how many are still
    /// due, and by when (a silent or trickling client does not keep a slot
    /// of the connection limit).
    opening: Option<(usize, Pin<Box<tokio::time::Sleep>>)>,
}

/// Bytes a client must send within the opening timeout: the HTTP/2
/// connection preface is 24 bytes; an HTTP/1.1 request line is longer.
pub const OPENING_BYTES: usize = 24;

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.io).poll_read(cx, buf);
        let Some((due, deadline)) = me.opening.as_mut() else {
            return r;
        };
        match r {
            Poll::Ready(Ok(())) => {
                let got = buf.filled().len() - before;
                if got == 0 || got >= *due {
                    me.opening = None;
                } else {
                    *due -= got;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{}: no request within the opening timeout", me.info.peer),
                ))),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

enum Socket {
    Tcp(TcpListener),
    /// The socket file is removed when `_file` drops with the listener.
    Unix {
        listener: UnixListener,
        _file: SocketFile,
    },
    Vsock(VsockListener),
}

/// A bound listening socket.
pub struct Listener {
    endpoint: Endpoint,
    socket: Socket,
}

impl Listener {
    /// Binds `endpoint`. For `tcp://HOST:0` the kernel picks the port and
    /// [`Listener::local_endpoint`] reports it.
    pub async fn bind(endpoint: &Endpoint) -> Result<Listener, ListenError> {
        let name = endpoint.to_string();
        let io_err = |what, source| ListenError::Io {
            endpoint: name.clone(),
            what,
            source,
        };
        match endpoint {
            Endpoint::Tcp { host, port } => {
                let addr = format!("{}:{port}", bracket_host(host));
                let l = TcpListener::bind(&addr)
                    .await
                    .map_err(|e| io_err("binding TCP address", e))?;
                let local = l
                    .local_addr()
                    .map_err(|e| io_err("reading bound address", e))?;
                Ok(Listener {
                    endpoint: Endpoint::Tcp {
                        host: local.ip().to_string(),
                        port: local.port(),
                    },
                    socket: Socket::Tcp(l),
                })
            }
            Endpoint::Unix(path) => {
                let (l, file) = bind_unix(&name, path)?;
                Ok(Listener {
                    endpoint: endpoint.clone(),
                    socket: Socket::Unix {
                        listener: l,
                        _file: file,
                    },
                })
            }
            Endpoint::Vsock { cid, port } => {
                let l =
                    VsockListener::bind(VsockAddr::new(*cid, *port)).map_err(
                        |source| match source.raw_os_error() {
                            Some(libc_code)
                                if [
                                    nix::libc::EAFNOSUPPORT,
                                    nix::libc::ENODEV,
                                    nix::libc::EADDRNOTAVAIL,
                                ]
                                .contains(&libc_code) =>
                            {
                                ListenError::NoVsock {
                                    endpoint: name.clone(),
                                    source,
                                }
                            }
                            _ => io_err("binding vsock port", source),
                        },
                    )?;
                Ok(Listener {
                    endpoint: endpoint.clone(),
                    socket: Socket::Vsock(l),
                })
            }
            Endpoint::HybridVsock { .. } => Err(ListenError::ClientOnly { endpoint: name }),
        }
    }

    /// The endpoint actually bound (with the real port for `tcp://…:0`).
    pub fn local_endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Starts accepting. Returns the stream of connections for tonic and the
    /// accept task, which ends (removing a unix socket file) once the stream
    /// is dropped.
    pub fn incoming(
        self,
        max_connections: usize,
    ) -> (ReceiverStream<io::Result<Conn>>, JoinHandle<()>) {
        self.incoming_within(max_connections, None)
    }

    /// [`Listener::incoming`], each connection closed unless its client
    /// sends its first [`OPENING_BYTES`] within `opening` (idle or
    /// trickling connections would otherwise hold the connection slots).
    pub fn incoming_within(
        self,
        max_connections: usize,
        opening: Option<Duration>,
    ) -> (ReceiverStream<io::Result<Conn>>, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(1);
        let limit = Arc::new(Semaphore::new(max_connections.max(1)));
        let endpoint = self.endpoint.to_string();
        let socket = self.socket;
        let task = tokio::spawn(async move {
            loop {
                let permit = tokio::select! {
                    p = limit.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = tx.closed() => break,
                };
                let accepted = tokio::select! {
                    a = accept(&socket) => a,
                    _ = tx.closed() => break,
                };
                match accepted {
                    Ok((io, info)) => {
                        tracing::debug!(listener = %endpoint, peer = %info.peer, "accepted connection");
                        let conn = Conn {
                            io,
                            info,
                            _permit: permit,
                            opening: opening
                                .map(|t| (OPENING_BYTES, Box::pin(tokio::time::sleep(t)))),
                        };
                        if tx.send(Ok(conn)).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        // EMFILE, ENFILE, ECONNABORTED...: keep serving, but do
                        // not spin on a persistent error.
                        warn!(listener = %endpoint, error = %e, "accept failed; retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
            drop(socket);
        });
        (ReceiverStream::new(rx), task)
    }
}

async fn accept(socket: &Socket) -> io::Result<(Io, ConnInfo)> {
    match socket {
        Socket::Tcp(l) => {
            let (s, peer) = l.accept().await?;
            s.set_nodelay(true)?;
            Ok((
                Io::Tcp(s),
                ConnInfo {
                    transport: "tcp",
                    peer: peer.to_string(),
                },
            ))
        }
        Socket::Unix { listener: l, .. } => {
            let (s, _) = l.accept().await?;
            let peer = match s.peer_cred() {
                Ok(c) => format!("pid={:?} uid={}", c.pid(), c.uid()),
                Err(_) => "unix".to_owned(),
            };
            Ok((
                Io::Unix(s),
                ConnInfo {
                    transport: "unix",
                    peer,
                },
            ))
        }
        Socket::Vsock(l) => {
            let (s, peer) = l.accept().await?;
            Ok((
                Io::Vsock(s),
                ConnInfo {
                    transport: "vsock",
                    peer: format!("{}:{}", peer.cid(), peer.port()),
                },
            ))
        }
    }
}

/// The socket file a unix listener created; removed on drop if it is still
/// the same inode (another process may have replaced it meanwhile).
struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if let Ok(md) = std::fs::symlink_metadata(&self.path)
            && md.dev() == self.dev
            && md.ino() == self.ino
        {
            match std::fs::remove_file(&self.path) {
                Ok(()) => info!(path = %self.path.display(), "removed unix socket"),
                Err(e) => {
                    warn!(path = %self.path.display(), error = %e, "could not remove unix socket")
                }
            }
        }
    }
}

fn bind_unix(name: &str, path: &Path) -> Result<(UnixListener, SocketFile), ListenError> {
    let io_err = |what, source| ListenError::Io {
        endpoint: name.to_owned(),
        what,
        source,
    };
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(_) => {
                    return Err(ListenError::UnixInUse {
                        endpoint: name.to_owned(),
                        path: path.to_owned(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    info!(path = %path.display(), "removing stale unix socket (nobody listening)");
                    std::fs::remove_file(path).map_err(|e| io_err("removing stale socket", e))?;
                }
                Err(e) => return Err(io_err("probing existing socket", e)),
            }
        }
        Ok(_) => {
            return Err(ListenError::NotASocket {
                endpoint: name.to_owned(),
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("inspecting socket path", e)),
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| io_err("creating socket directory", e))?;
    }
    // Create the socket with mode 0600 from the start: there is no window in
    // which another user could connect. umask is process-wide, but this runs
    // while the agent is starting and creates no other files.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(|e| io_err("binding unix socket", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io_err("setting socket mode 0600", e))?;
    let md = std::fs::symlink_metadata(path).map_err(|e| io_err("inspecting new socket", e))?;
    Ok((
        listener,
        SocketFile {
            path: path.to_owned(),
            dev: md.dev(),
            ino: md.ino(),
        },
    ))
}
