//! Random bytes from the OS: the one place the workspace's tokens, session
//! ids, passwords and unique names come from. A failure is an error for the
//! caller to report, never a zero or predictable value.

use std::io;

/// Fills `buf` from the OS's random source.
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    getrandom::fill(buf).map_err(|e| io::Error::other(format!("no randomness from the OS: {e}")))
}

/// `N` random bytes.
pub fn bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    fill(&mut b)?;
    Ok(b)
}

/// `n` random bytes, hex encoded (lowercase, `2 * n` characters).
pub fn hex_token(n: usize) -> io::Result<String> {
    let mut b = vec![0u8; n];
    fill(&mut b)?;
    Ok(hex::encode(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_token_has_two_characters_a_byte_and_varies() -> io::Result<()> {
        let a = hex_token(16)?;
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, hex_token(16)?);
        assert_ne!(bytes::<16>()?, [0u8; 16]);
        Ok(())
    }
}
