//! The agent's own token, late-bound: every pod of a Kubernetes warm pool
//! starts with the pool's one bootstrap secret, so a claimed agent must
//! admit only its lease's token from then on (`Agent.BindToken`).
//!
//! One [`LeaseToken`] is shared by the policy of every listener that checks
//! the agent's token (the control plane and the MCP data plane); binding
//! swaps it for all of them at once, and the token before admits nothing
//! afterwards. The scripts' listener has its own token (`Executions`) and
//! is not touched.

use sandbox_client::auth::{Token, TokenError};
use sandbox_serve::auth::{AuthPolicy, LeaseToken};
use tracing::info;

/// The token the agent's token-checked listeners admit; `None` when the
/// agent has none configured (local listeners only).
#[derive(Clone, Debug)]
pub struct AgentToken(Option<LeaseToken>);

/// Why a BindToken changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "this agent has no token configured: its listeners check none, so there is nothing to bind (start it with --token-file)"
    )]
    NoToken,
    #[error(transparent)]
    Invalid(#[from] TokenError),
    #[error(
        "the new token is the one in force: binding it would leave the token of the call admitted; bind a fresh token"
    )]
    Unchanged,
}

impl AgentToken {
    /// The configured token (the bootstrap secret), in force until bound.
    pub fn new(configured: Option<Token>) -> AgentToken {
        AgentToken(configured.map(LeaseToken::new))
    }

    /// The policy of a listener checking the agent's token; `required`
    /// refuses requests without one (TCP, or `require_on_local`).
    pub fn policy(&self, required: bool) -> AuthPolicy {
        AuthPolicy {
            token: None,
            required,
            lease: self.0.clone(),
        }
    }

    /// Replaces the token every listener admits with `text`, validated as
    /// a configured token would be; on error nothing changed.
    pub fn bind(&self, text: &str) -> Result<(), BindError> {
        let shared = self.0.as_ref().ok_or(BindError::NoToken)?;
        let token = Token::new(text, "BindTokenRequest.token")?;
        if shared
            .get()
            .is_some_and(|now| now.matches(token.expose().as_bytes()))
        {
            return Err(BindError::Unchanged);
        }
        shared.set(token);
        info!("agent token bound: the token before it admits nothing now");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: &str = "/sandbox.agent.v1.Agent/GetInfo";

    fn bootstrap() -> AgentToken {
        AgentToken::new(Some(
            Token::new("bootstrap-0123456789", "test").expect("token"),
        ))
    }

    #[test]
    fn binding_refuses_the_token_before() {
        let t = bootstrap();
        let p = t.policy(true);
        t.bind("lease-one-0123456789").expect("bind");
        assert!(p.check(M, Some(b"Bearer bootstrap-0123456789")).is_err());
        assert!(p.check(M, Some(b"Bearer lease-one-0123456789")).is_ok());
    }

    #[test]
    fn a_refused_bind_changes_nothing() {
        let t = bootstrap();
        let p = t.policy(true);
        assert!(matches!(t.bind("short"), Err(BindError::Invalid(_))));
        assert!(matches!(
            t.bind("with space 0123456789"),
            Err(BindError::Invalid(_))
        ));
        assert!(matches!(
            t.bind("bootstrap-0123456789\n"),
            Err(BindError::Unchanged)
        ));
        assert!(p.check(M, Some(b"Bearer bootstrap-0123456789")).is_ok());
        let none = AgentToken::new(None);
        assert!(matches!(
            none.bind("lease-one-0123456789"),
            Err(BindError::NoToken)
        ));
        assert!(none.policy(false).check(M, None).is_ok());
    }
}
