//! Expiring, HMAC-SHA256-signed URLs for the archive transfers the host
//! serves itself (the upload PUT and the dump GET), in place of a cloud
//! bucket's signed URLs. The signature covers the action, the sandbox and
//! the expiry, so a URL cannot be reused for another sandbox, another
//! action or after it expires.

use hmac::{KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = hmac::Hmac<Sha256>;

pub struct Signer {
    key: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Invalid {
    Expired,
    BadSignature,
}

impl Signer {
    pub fn new(key: Vec<u8>) -> Signer {
        Signer { key }
    }

    fn mac(&self, action: &str, id: &str, expires: u64) -> HmacSha256 {
        // A key of any length is accepted by HMAC.
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(format!("{action}\n{id}\n{expires}").as_bytes());
        m
    }

    /// The query string for `action` on sandbox `id`, valid until `expires`
    /// (unix seconds).
    pub fn sign(&self, action: &str, id: &str, expires: u64) -> String {
        let sig = self.mac(action, id, expires).finalize().into_bytes();
        format!("expires={expires}&signature={}", hex::encode(sig))
    }

    /// A capability for `action` on sandbox `id` that never expires by
    /// itself (the caller checks the sandbox is still live): the MCP URLs'
    /// token.
    pub fn token(&self, action: &str, id: &str) -> String {
        hex::encode(self.mac(action, id, 0).finalize().into_bytes())
    }

    /// Whether `token` is [`Signer::token`]'s for `action` and `id`
    /// (constant-time).
    pub fn check_token(&self, action: &str, id: &str, token: &str) -> bool {
        unhex(token).is_some_and(|t| self.mac(action, id, 0).verify_slice(&t).is_ok())
    }

    pub fn verify(
        &self,
        action: &str,
        id: &str,
        expires: u64,
        signature: &str,
        now: u64,
    ) -> Result<(), Invalid> {
        let Some(sig) = unhex(signature) else {
            return Err(Invalid::BadSignature);
        };
        // Constant-time comparison.
        self.mac(action, id, expires)
            .verify_slice(&sig)
            .map_err(|_| Invalid::BadSignature)?;
        if now > expires {
            return Err(Invalid::Expired);
        }
        Ok(())
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_bind_action_and_sandbox() {
        let s = Signer::new(b"k".to_vec());
        let t = s.token("mcp", "sb1");
        assert!(s.check_token("mcp", "sb1", &t));
        assert!(!s.check_token("mcp", "sb2", &t));
        assert!(!s.check_token("upload", "sb1", &t));
        assert!(!Signer::new(b"other".to_vec()).check_token("mcp", "sb1", &t));
        assert!(!s.check_token("mcp", "sb1", "zz"));
        assert!(!s.check_token("mcp", "sb1", ""));
    }

    #[test]
    fn signatures_bind_action_sandbox_and_expiry() {
        let s = Signer::new(b"k".to_vec());
        let q = s.sign("upload", "sb1", 100);
        let sig = q.split("signature=").nth(1).unwrap();
        assert_eq!(s.verify("upload", "sb1", 100, sig, 50), Ok(()));
        assert_eq!(
            s.verify("upload", "sb1", 100, sig, 101),
            Err(Invalid::Expired)
        );
        assert_eq!(
            s.verify("dump", "sb1", 100, sig, 50),
            Err(Invalid::BadSignature)
        );
        assert_eq!(
            s.verify("upload", "sb2", 100, sig, 50),
            Err(Invalid::BadSignature)
        );
        assert_eq!(
            s.verify("upload", "sb1", 999, sig, 50),
            Err(Invalid::BadSignature)
        );
        assert_eq!(
            s.verify("upload", "sb1", 100, "zz", 50),
            Err(Invalid::BadSignature)
        );
    }
}
