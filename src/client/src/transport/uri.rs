//! Endpoint URIs.
//!
//! | form                              | listen | connect |
//! |-----------------------------------|--------|---------|
//! | `vsock://CID:PORT`                | yes (`any`/`-1` for all CIDs) | yes |
//! | `unix:///path/to/socket`          | yes    | yes     |
//! | `tcp://HOST:PORT`                 | yes    | yes     |
//! | `hvsock:///path/to/vsock.sock:PORT` | no   | yes     |
//!
//! `hvsock` is the hybrid vsock of Firecracker and Cloud Hypervisor: a unix
//! socket on the host on which the client asks for a guest port with
//! `CONNECT <port>\n`.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

/// `VMADDR_CID_ANY`: listen on every CID of this machine.
pub const VMADDR_CID_ANY: u32 = u32::MAX;

/// Where the agent listens when neither flags nor config say otherwise
/// (port [`crate::limits::AGENT_VSOCK_PORT`]; a unit test keeps them equal).
pub const DEFAULT_AGENT_LISTEN: &str = "vsock://any:1024";

/// Where the agent serves the MCP data plane by default (port
/// [`crate::limits::MCP_VSOCK_PORT`]).
pub const DEFAULT_MCP_LISTEN: &str = "vsock://any:1025";

/// Shown with every URI error so the user sees what would have worked.
pub const ACCEPTED_FORMS: &str = "accepted forms: vsock://CID:PORT (CID a number, or any/-1 to listen on every CID), \
unix:///path/to/socket, tcp://HOST:PORT (e.g. tcp://127.0.0.1:7070 or tcp://[::1]:7070), \
hvsock:///path/to/vsock.sock:PORT (connect only: Firecracker/Cloud Hypervisor hybrid vsock)";

/// Longest path a unix socket address can hold (`sun_path` minus the NUL).
const UNIX_PATH_MAX: usize = 107;

/// A parsed transport endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// AF_VSOCK. `cid` is [`VMADDR_CID_ANY`] for "listen on any CID".
    Vsock { cid: u32, port: u32 },
    /// AF_UNIX stream socket at a filesystem path.
    Unix(PathBuf),
    /// TCP. `host` is an IP literal (without brackets) or a DNS name.
    Tcp { host: String, port: u16 },
    /// Hybrid vsock: a unix socket plus the guest port to `CONNECT` to.
    HybridVsock { path: PathBuf, port: u32 },
}

/// A URI that is not one of the [accepted forms](ACCEPTED_FORMS).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid endpoint URI '{uri}': {reason}; {ACCEPTED_FORMS}")]
pub struct UriError {
    pub uri: String,
    pub reason: String,
}

impl Endpoint {
    /// True for TCP endpoints whose host is a loopback address or `localhost`.
    pub fn is_loopback_tcp(&self) -> bool {
        match self {
            Endpoint::Tcp { host, .. } => {
                host.eq_ignore_ascii_case("localhost")
                    || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
            }
            _ => false,
        }
    }

    /// Short transport name: `vsock`, `unix`, `tcp` or `hvsock`.
    pub fn scheme(&self) -> &'static str {
        match self {
            Endpoint::Vsock { .. } => "vsock",
            Endpoint::Unix(_) => "unix",
            Endpoint::Tcp { .. } => "tcp",
            Endpoint::HybridVsock { .. } => "hvsock",
        }
    }
}

/// Wraps IPv6 literals in brackets for `host:port` strings.
pub fn bracket_host(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Vsock { cid, port } if *cid == VMADDR_CID_ANY => {
                write!(f, "vsock://any:{port}")
            }
            Endpoint::Vsock { cid, port } => write!(f, "vsock://{cid}:{port}"),
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
            Endpoint::Tcp { host, port } => write!(f, "tcp://{}:{port}", bracket_host(host)),
            Endpoint::HybridVsock { path, port } => {
                write!(f, "hvsock://{}:{port}", path.display())
            }
        }
    }
}

impl FromStr for Endpoint {
    type Err = UriError;

    fn from_str(uri: &str) -> Result<Self, UriError> {
        let err = |reason: &str| UriError {
            uri: uri.to_owned(),
            reason: reason.to_owned(),
        };
        let Some((scheme, rest)) = uri.split_once("://") else {
            return Err(err("missing scheme (expected SCHEME://...)"));
        };
        match scheme {
            "vsock" => {
                let (cid, port) = rest
                    .rsplit_once(':')
                    .ok_or_else(|| err("vsock needs CID:PORT"))?;
                let cid = match cid {
                    "any" | "-1" => VMADDR_CID_ANY,
                    c => c
                        .parse::<u32>()
                        .map_err(|_| err("vsock CID must be a number, 'any' or -1"))?,
                };
                let port = port
                    .parse::<u32>()
                    .map_err(|_| err("vsock port must be a number from 0 to 4294967295"))?;
                Ok(Endpoint::Vsock { cid, port })
            }
            "unix" => {
                if rest.is_empty() {
                    return Err(err("unix needs a socket path"));
                }
                check_unix_path(rest).map_err(|r| err(&r.to_string()))?;
                Ok(Endpoint::Unix(PathBuf::from(rest)))
            }
            "tcp" => {
                let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
                    let (h, p) = v6
                        .split_once("]:")
                        .ok_or_else(|| err("IPv6 hosts look like tcp://[::1]:PORT"))?;
                    (h, p)
                } else {
                    rest.rsplit_once(':')
                        .ok_or_else(|| err("tcp needs HOST:PORT"))?
                };
                if host.contains(':') && !rest.starts_with('[') {
                    return Err(err("IPv6 hosts must be in brackets, e.g. tcp://[::1]:PORT"));
                }
                if host.contains('/') {
                    return Err(err("tcp host must not contain '/'"));
                }
                let port = port
                    .parse::<u16>()
                    .map_err(|_| err("tcp port must be a number from 0 to 65535"))?;
                let host = if host.is_empty() { "127.0.0.1" } else { host };
                Ok(Endpoint::Tcp {
                    host: host.to_owned(),
                    port,
                })
            }
            "hvsock" => {
                let (path, port) = rest
                    .rsplit_once(':')
                    .ok_or_else(|| err("hvsock needs /path/to/vsock.sock:PORT"))?;
                if path.is_empty() {
                    return Err(err("hvsock needs the path of the VMM's vsock unix socket"));
                }
                check_unix_path(path).map_err(|r| err(&r.to_string()))?;
                let port = port
                    .parse::<u32>()
                    .map_err(|_| err("hvsock port must be a number from 0 to 4294967295"))?;
                Ok(Endpoint::HybridVsock {
                    path: PathBuf::from(path),
                    port,
                })
            }
            other => Err(err(&format!("unknown scheme '{other}'"))),
        }
    }
}

/// Why a unix socket path cannot be bound or dialed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnixPathError {
    #[error("unix socket path is {0} bytes, the limit is {UNIX_PATH_MAX}")]
    TooLong(usize),
    #[error("unix socket path contains a NUL byte")]
    Nul,
}

fn check_unix_path(path: &str) -> Result<(), UnixPathError> {
    if path.len() > UNIX_PATH_MAX {
        return Err(UnixPathError::TooLong(path.len()));
    }
    if path.contains('\0') {
        return Err(UnixPathError::Nul);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_listeners_use_the_named_ports() {
        use crate::limits::{AGENT_VSOCK_PORT, MCP_VSOCK_PORT};
        let any = |port| Endpoint::Vsock {
            cid: VMADDR_CID_ANY,
            port,
        };
        assert_eq!(ok(DEFAULT_AGENT_LISTEN), any(AGENT_VSOCK_PORT));
        assert_eq!(ok(DEFAULT_MCP_LISTEN), any(MCP_VSOCK_PORT));
    }

    fn ok(s: &str) -> Endpoint {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(
            ok("vsock://any:1024"),
            Endpoint::Vsock {
                cid: VMADDR_CID_ANY,
                port: 1024
            }
        );
        assert_eq!(ok("vsock://-1:5"), ok("vsock://any:5"));
        assert_eq!(
            ok("vsock://42:1024"),
            Endpoint::Vsock {
                cid: 42,
                port: 1024
            }
        );
        assert_eq!(
            ok("unix:///run/a.sock"),
            Endpoint::Unix("/run/a.sock".into())
        );
        assert_eq!(ok("unix://rel.sock"), Endpoint::Unix("rel.sock".into()));
        assert_eq!(
            ok("tcp://127.0.0.1:7070"),
            Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 7070
            }
        );
        assert_eq!(
            ok("tcp://[::1]:80"),
            Endpoint::Tcp {
                host: "::1".into(),
                port: 80
            }
        );
        assert_eq!(ok("tcp://:80").to_string(), "tcp://127.0.0.1:80");
        assert_eq!(
            ok("hvsock:///var/run/v.sock:1024"),
            Endpoint::HybridVsock {
                path: "/var/run/v.sock".into(),
                port: 1024
            }
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "vsock://any:1024",
            "vsock://3:1",
            "unix:///tmp/x.sock",
            "tcp://[::1]:9",
            "tcp://localhost:9",
            "hvsock:///a/b.sock:7",
        ] {
            assert_eq!(ok(s).to_string(), s);
        }
    }

    #[test]
    fn rejects_with_the_accepted_forms() {
        for bad in [
            "",
            "localhost:80",
            "http://x:1",
            "vsock://x:1",
            "vsock://3",
            "vsock://3:p",
            "unix://",
            "tcp://host",
            "tcp://h:99999",
            "tcp://::1:80",
            "hvsock://:1",
            "hvsock:///a.sock",
        ] {
            let e = bad.parse::<Endpoint>().expect_err(bad).to_string();
            assert!(e.contains("accepted forms"), "{bad}: {e}");
            assert!(e.contains(bad), "{bad}: {e}");
        }
        let long = format!("unix:///{}", "a".repeat(200));
        assert!(long.parse::<Endpoint>().is_err());
    }

    #[test]
    fn loopback_detection() {
        assert!(ok("tcp://127.0.0.1:1").is_loopback_tcp());
        assert!(ok("tcp://[::1]:1").is_loopback_tcp());
        assert!(ok("tcp://localhost:1").is_loopback_tcp());
        assert!(!ok("tcp://0.0.0.0:1").is_loopback_tcp());
        assert!(!ok("tcp://10.0.0.1:1").is_loopback_tcp());
    }
}
