//! Streaming SHA-256 with an optional copy, shared by backup (store) and restore (CLI) so both
//! sides of a backup manifest hash files the same way.
use std::fs::File;
use std::io::{Read, Write};

use sha2::{Digest, Sha256};

/// Reads `input` to the end, writing it to `out` when given; returns (bytes read, SHA-256 as
/// 64 lowercase hex characters).
///
/// # Errors
/// Any read or write error (interrupted reads are retried).
pub fn sha256_copy(input: &mut impl Read, mut out: Option<&mut File>) -> std::io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        if let Some(o) = out.as_deref_mut() {
            o.write_all(&buf[..n])?;
        }
        total += n as u64;
    }
    Ok((total, hex::encode(hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest() {
        let (n, h) = sha256_copy(&mut &b"abc"[..], None).unwrap();
        assert_eq!(n, 3);
        assert_eq!(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
