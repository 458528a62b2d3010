//! The servers' side of bearer-token authentication: the policy of one
//! listener and the tower layer that enforces it.
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
//! Tokens are compared in constant time ([`Token::matches`]).

use std::sync::Arc;
use std::task::{Context, Poll};

use sandbox_client::auth::Token;
use tonic::Status;

/// gRPC path prefix that is exempt from authentication.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";

/// Authentication policy of one listener.
#[derive(Clone, Debug)]
pub struct AuthPolicy {
    pub token: Option<Token>,
    /// Reject requests that carry no token.
    pub required: bool,
    /// When set, the token is this one instead of `token`: a token that
    /// lives only as long as a lease ([`LeaseToken`]: the scripts' token, or
    /// the agent's own once a host bound it); while it is unset every
    /// request is refused.
    pub lease: Option<LeaseToken>,
}

/// A token made for one lease and revoked when it ends (the scripts'
/// data-plane token), or one replaced at each lease (the agent's token,
/// which `BindToken` swaps for every listener at once): shared by the
/// listeners' policies and whoever rotates it. A request is checked
/// against the token in force when it arrives, so one admitted before a
/// swap may finish.
#[derive(Clone, Debug, Default)]
pub struct LeaseToken(Arc<std::sync::RwLock<Option<Token>>>);

impl LeaseToken {
    /// A token in force from the start (an agent's configured token,
    /// until a host binds one of its own).
    pub fn new(token: Token) -> LeaseToken {
        LeaseToken(Arc::new(std::sync::RwLock::new(Some(token))))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::new("0123456789abcdef-secret\n", "test").expect("valid token")
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

    #[test]
    fn a_swapped_token_refuses_the_one_before_on_every_policy_sharing_it() {
        let shared = LeaseToken::new(token());
        let policy = |required| AuthPolicy {
            token: None,
            required,
            lease: Some(shared.clone()),
        };
        let (tcp, local) = (policy(true), policy(false));
        let m = "/sandbox.agent.v1.Agent/GetInfo";
        let old = b"Bearer 0123456789abcdef-secret".as_slice();
        let new = b"Bearer fedcba9876543210-lease1".as_slice();
        assert!(tcp.check(m, Some(old)).is_ok());
        assert!(tcp.check(m, Some(new)).is_err());
        shared.set(Token::new("fedcba9876543210-lease1", "test").expect("valid token"));
        for p in [&tcp, &local] {
            let refused = p.check(m, Some(old)).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated);
            assert_eq!(refused.message(), "wrong bearer token");
            assert!(p.check(m, Some(new)).is_ok());
            assert!(p.check("/grpc.health.v1.Health/Check", None).is_ok());
        }
        // A local listener still admits no token at all; TCP never does.
        assert!(local.check(m, None).is_ok());
        assert!(tcp.check(m, None).is_err());
    }
}
