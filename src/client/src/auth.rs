//! Bearer tokens of the control plane: validated, generated, read from
//! files, compared in constant time, and attached to a client's requests
//! ([`BearerInterceptor`]).
//!
//! The servers' side (the per-listener policy and the tower layer that
//! enforces it) is `sandbox-serve`'s `auth`.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

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

/// Client interceptor adding `authorization: Bearer <token>` when a token is
/// configured, and the lease the calls are made for
/// ([`crate::lease::HEADER`]) when bound to one.
#[derive(Clone, Default)]
pub struct BearerInterceptor {
    header: Option<MetadataValue<Ascii>>,
    /// `Err`: a lease id that cannot be sent; every call fails rather than
    /// go out unbound.
    lease: Option<Result<MetadataValue<Ascii>, String>>,
}

impl BearerInterceptor {
    pub fn new(token: Option<&Token>) -> BearerInterceptor {
        BearerInterceptor {
            // A validated token is printable ASCII, so this cannot fail; a
            // failure would only drop the header, never panic.
            header: token.and_then(|t| format!("Bearer {}", t.expose()).parse().ok()),
            lease: None,
        }
    }

    /// The same, naming lease `id` on every call.
    pub fn with_lease(&self, id: &str) -> BearerInterceptor {
        BearerInterceptor {
            header: self.header.clone(),
            lease: Some(
                id.parse()
                    .map_err(|_| format!("lease id {id:?} is not printable ASCII")),
            ),
        }
    }
}

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        match &self.lease {
            None => {}
            Some(Ok(l)) => {
                req.metadata_mut().insert(crate::lease::HEADER, l.clone());
            }
            Some(Err(e)) => return Err(Status::invalid_argument(e.clone())),
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
    fn a_lease_goes_on_every_call_and_a_bad_one_fails_the_call() {
        use tonic::service::Interceptor;
        let mut i = BearerInterceptor::new(Some(&token())).with_lease("lease-1");
        let r = i.call(tonic::Request::new(())).expect("call");
        assert_eq!(
            r.metadata().get(crate::lease::HEADER).map(|v| v.as_bytes()),
            Some(&b"lease-1"[..])
        );
        assert!(r.metadata().get("authorization").is_some());
        // Never sent unbound: a lease that cannot be sent fails the call.
        let mut bad = BearerInterceptor::new(None).with_lease("bad\nlease");
        let e = bad.call(tonic::Request::new(())).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let mut none = BearerInterceptor::new(None);
        let r = none.call(tonic::Request::new(())).expect("call");
        assert!(r.metadata().get(crate::lease::HEADER).is_none());
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
}
