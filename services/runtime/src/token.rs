//! Random tokens and constant-time comparison.
use secrecy::{ExposeSecret, SecretString};
use subtle::ConstantTimeEq;

/// Returns 32 random bytes from the OS CSPRNG as 64 lowercase hex characters.
///
/// # Panics
/// If the operating system has no randomness source (never on Linux or macOS).
pub fn random_token() -> SecretString {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf).expect("OS randomness source");
    SecretString::from(hex::encode(buf))
}

/// Compares a presented token with the expected one in time independent of where they differ.
/// Lengths are not secret (tokens have a fixed length).
pub fn token_matches(expected: &SecretString, presented: &[u8]) -> bool {
    let e = expected.expose_secret().as_bytes();
    e.len() == presented.len() && bool::from(e.ct_eq(presented))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex_and_compare() {
        let a = random_token();
        let b = random_token();
        assert_eq!(a.expose_secret().len(), 64);
        assert_ne!(a.expose_secret(), b.expose_secret());
        assert!(token_matches(&a, a.expose_secret().as_bytes()));
        assert!(!token_matches(&a, b.expose_secret().as_bytes()));
        assert!(!token_matches(&a, b"short"));
        assert!(!token_matches(&a, b""));
    }
}
