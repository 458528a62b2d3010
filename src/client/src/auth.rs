//! Bearer-token authentication of the control plane.
//!
//! Policy (enforced by [`AuthLayer`], one instance per listener):
//! - TCP listeners always require the token; the agent refuses to start a TCP
//!   listener without one.
//! - unix and vsock listeners accept requests without a token (the socket's
//!   0600 mode and the VM boundary protect them), unless configured to
//!   require it. A token that *is* sent must still be right: a wrong token is
//!   a client misconfiguration worth reporting, never silently ignored.
//! - `grpc.health.v1.Health` is always open, so probes need no secret.
//!
//! Tokens are compared in constant time.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use subtle::ConstantTimeEq;
use tonic::Status;
use tonic::metadata::{Ascii, MetadataValue};

/// Shortest token the agent accepts: 16 characters.
pub const MIN_TOKEN_LEN: usize = 16;

/// A shared secret. `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

/// A token that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read token file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot create token file {path}: {source}")]
    Create {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{origin}: the token is empty")]
    Empty { origin: String },
    #[error("{origin}: the token is {len} characters; use at least {MIN_TOKEN_LEN}")]
    TooShort { origin: String, len: usize },
    #[error("{origin}: the token must be printable ASCII without spaces")]
    NotPrintable { origin: String },
}

impl Token {
    /// Validates a token given as text. Surrounding whitespace (such as the
    /// trailing newline of a file) is ignored.
    pub fn new(text: &str, origin: &str) -> Result<Token, TokenError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(TokenError::Empty {
                origin: origin.to_owned(),
            });
        }
        if !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotPrintable {
                origin: origin.to_owned(),
            });
        }
        if t.len() < MIN_TOKEN_LEN {
            return Err(TokenError::TooShort {
                origin: origin.to_owned(),
                len: t.len(),
            });
        }
        Ok(Token(t.into()))
    }

    /// Reads and validates a token file.
    pub fn from_file(path: &Path) -> Result<Token, TokenError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: origin.clone(),
            source,
        })?;
        Token::new(&text, &origin)
    }

    /// Reads the token file at `path`, first creating it (mode 0600, with a
    /// fresh token) when it does not exist.
    pub fn load_or_create(path: &Path) -> Result<Token, TokenError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let create = |source| TokenError::Create {
            path: path.display().to_string(),
            source,
        };
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(mut f) => {
                let t = Token::generate().map_err(create)?;
                writeln!(f, "{}", t.expose()).map_err(create)?;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(create(e)),
        }
        Token::from_file(path)
    }

    /// A fresh random token: 32 bytes from the OS, hex encoded.
    pub fn generate() -> io::Result<Token> {
        Ok(Token(crate::random::hex_token(32)?.into()))
    }

    /// The secret itself, for writing a token file or a header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time comparison (only the length can leak).
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(presented).into()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// gRPC path prefix that is exempt from authentication.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Authentication policy of one listener.
#[derive(Clone, Debug)]
pub struct AuthPolicy {
    pub token: Option<Token>,
    /// Reject requests that carry no token.
    pub required: bool,
    /// When set, the token is this one instead of `token`: a token that
    /// lives only as long as a lease ([`LeaseToken`]); while it is unset
    /// every request is refused.
    pub lease: Option<LeaseToken>,
}

/// A token made for one lease and revoked when it ends (the scripts'
/// data-plane token): shared by the listener's policy and whoever rotates
/// it.
#[derive(Clone, Debug, Default)]
pub struct LeaseToken(Arc<std::sync::RwLock<Option<Token>>>);

impl LeaseToken {
    /// Replaces the token (a new lease, or the same lease after a Reset).
    pub fn set(&self, token: Token) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(token);
    }
    /// Revokes it: nothing is admitted until the next [`LeaseToken::set`].
    pub fn revoke(&self) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = None;
    }
    pub fn get(&self) -> Option<Token> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl AuthPolicy {
    /// Checks the `authorization` header of a request to `path`.
    pub fn check(&self, path: &str, authorization: Option<&[u8]>) -> Result<(), Status> {
        if path.starts_with(HEALTH_PREFIX) {
            return Ok(());
        }
        let current;
        let token = match &self.lease {
            Some(lease) => {
                current = lease.get().ok_or_else(|| {
                    Status::unauthenticated(
                        "no lease: this listener's token was revoked when the lease ended",
                    )
                })?;
                Some(&current)
            }
            None => self.token.as_ref(),
        };
        match (authorization, token) {
            (None, _) if !self.required => Ok(()),
            (None, _) => Err(Status::unauthenticated(
                "missing bearer token: this listener requires 'authorization: Bearer <token>' \
                 (sandboxctl: --token or --token-file)",
            )),
            (Some(_), None) => Err(Status::unauthenticated(
                "a bearer token was sent, but this agent has no token configured",
            )),
            (Some(value), Some(token)) => {
                let presented = value
                    .strip_prefix(b"Bearer ")
                    .or_else(|| value.strip_prefix(b"bearer "))
                    .ok_or_else(|| {
                        Status::unauthenticated(
                            "malformed authorization header: expected 'Bearer <token>'",
                        )
                    })?;
                if token.matches(presented) {
                    Ok(())
                } else {
                    Err(Status::unauthenticated("wrong bearer token"))
                }
            }
        }
    }
}

/// Tower layer that applies an [`AuthPolicy`] to every request.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    policy: Arc<AuthPolicy>,
}

impl AuthLayer {
    pub fn new(policy: AuthPolicy) -> AuthLayer {
        AuthLayer {
            policy: Arc::new(policy),
        }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            policy: self.policy.clone(),
        }
    }
}

/// The service produced by [`AuthLayer`].
#[derive(Clone, Debug)]
pub struct AuthService<S> {
    inner: S,
    policy: Arc<AuthPolicy>,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for AuthService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures_util::future::Either<S::Future, BoxFuture<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let auth = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        match self.policy.check(req.uri().path(), auth) {
            Ok(()) => futures_util::future::Either::Left(self.inner.call(req)),
            Err(status) => {
                tracing::warn!(
                    path = req.uri().path(),
                    reason = status.message(),
                    "request rejected"
                );
                futures_util::future::Either::Right(Box::pin(async move { Ok(status.into_http()) }))
            }
        }
    }
}

/// Client interceptor adding `authorization: Bearer <token>` when a token is
/// configured.
#[derive(Clone, Default)]
pub struct BearerInterceptor {
    header: Option<MetadataValue<Ascii>>,
}

impl BearerInterceptor {
    pub fn new(token: Option<&Token>) -> BearerInterceptor {
        BearerInterceptor {
            // A validated token is printable ASCII, so this cannot fail; a
            // failure would only drop the header, never panic.
            header: token.and_then(|t| format!("Bearer {}", t.expose()).parse().ok()),
        }
    }
}

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::new("0123456789abcdef-secret\n", "test").expect("valid token")
    }

    #[test]
    fn token_validation() {
        assert!(matches!(
            Token::new("  ", "x"),
            Err(TokenError::Empty { .. })
        ));
        assert!(matches!(
            Token::new("short", "x"),
            Err(TokenError::TooShort { .. })
        ));
        assert!(matches!(
            Token::new("has a space in the middle", "x"),
            Err(TokenError::NotPrintable { .. })
        ));
        assert_eq!(token().expose(), "0123456789abcdef-secret");
        assert!(!format!("{:?}", token()).contains("secret"));
    }

    #[test]
    fn required_policy() {
        let p = AuthPolicy {
            token: Some(token()),
            required: true,
            lease: None,
        };
        let m = "/sandbox.agent.v1.Agent/GetInfo";
        assert!(p.check(m, Some(b"Bearer 0123456789abcdef-secret")).is_ok());
        assert_eq!(
            p.check(m, None).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        assert!(p.check(m, Some(b"Bearer 0123456789abcdef-secreT")).is_err());
        assert!(p.check(m, Some(b"0123456789abcdef-secret")).is_err());
        assert!(p.check("/grpc.health.v1.Health/Check", None).is_ok());
    }

    #[test]
    fn optional_policy_still_rejects_wrong_tokens() {
        let p = AuthPolicy {
            token: Some(token()),
            required: false,
            lease: None,
        };
        let m = "/sandbox.agent.v1.Agent/GetInfo";
        assert!(p.check(m, None).is_ok());
        assert!(p.check(m, Some(b"Bearer nope-nope-nope-nope")).is_err());
        let open = AuthPolicy {
            token: None,
            required: false,
            lease: None,
        };
        assert!(open.check(m, None).is_ok());
        assert!(open.check(m, Some(b"Bearer whatever-whatever")).is_err());
    }
}
