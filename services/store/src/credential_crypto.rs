//! Credential encryption: encryption at rest of credential values under `COFFER_HOME/secret.key`.
//!
//! The key is 32 random bytes in `secret.key` (mode 0600, never in the database), created
//! exclusively on first use: written to a private temporary file, then `link()`ed into place, so
//! no reader ever sees a half-written key and two creators cannot both win. A key file of the
//! wrong size, or readable or writable by group or others, is refused with an error naming it.
//!
//! Values are sealed with XChaCha20-Poly1305 (draft-irtf-cfrg-xchacha-03: a random 24-byte
//! nonce per encryption, so random nonces never collide in practice) with the credential's name
//! as associated data: a ciphertext copied to another name's row fails to open. Plaintext
//! values live in memory only as [`SecretString`].
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use secrecy::zeroize::Zeroizing;
use secrecy::{ExposeSecret, SecretString};

/// Length of `secret.key` (bytes).
pub const KEY_LEN: usize = 32;
/// Length of a nonce (bytes).
pub const NONCE_LEN: usize = 24;
/// Longest credential value (bytes).
pub const MAX_VALUE_LEN: usize = 65_536;
/// Longest credential name (characters, all ASCII).
pub const MAX_NAME_LEN: usize = 64;

/// Why encrypting or decrypting a credential failed. No variant ever carries a credential value.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    #[error(
        "invalid credential name {0:?}: use 1-64 characters A-Z, a-z, 0-9, '_', '.' and '-', starting with a letter or digit"
    )]
    InvalidName(String),
    #[error("invalid credential value: {0}")]
    InvalidValue(&'static str),
    #[error(
        "{path} is missing but credentials are stored encrypted under it; restore that file, or delete the credentials and set them again"
    )]
    KeyMissing { path: PathBuf },
    #[error("{path}: {reason}")]
    KeyInvalid { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    KeyIo { path: PathBuf, source: std::io::Error },
    #[error(
        "credential {name:?} cannot be decrypted with {path}: the key file is not the one it was stored with, or the stored row was altered"
    )]
    Decrypt { name: String, path: PathBuf },
    #[error("no randomness from the operating system: {0}")]
    Random(String),
}

/// A sealed value as stored in the `credentials` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

/// Checks a credential name against `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`.
///
/// # Errors
/// [`CryptoError::InvalidName`] (the name, shortened, in the message).
pub fn validate_name(name: &str) -> Result<(), CryptoError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= MAX_NAME_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        let shown: String = name.chars().take(MAX_NAME_LEN + 1).collect();
        Err(CryptoError::InvalidName(shown))
    }
}

/// Checks a credential value: 1..=[`MAX_VALUE_LEN`] bytes and no NUL byte (it could not be
/// passed in a process environment). The message never shows the value.
///
/// # Errors
/// [`CryptoError::InvalidValue`].
pub fn validate_value(value: &SecretString) -> Result<(), CryptoError> {
    let v = value.expose_secret();
    if v.is_empty() {
        return Err(CryptoError::InvalidValue("it is empty"));
    }
    if v.len() > MAX_VALUE_LEN {
        return Err(CryptoError::InvalidValue("it is longer than 65536 bytes"));
    }
    if v.contains('\0') {
        return Err(CryptoError::InvalidValue("it contains a NUL byte"));
    }
    Ok(())
}

/// Credential encryption over one key file; the key is read (or created) on first use and then kept.
pub struct CredentialCrypto {
    path: PathBuf,
    cipher: Mutex<Option<Arc<XChaCha20Poly1305>>>,
}

impl CredentialCrypto {
    /// A vault whose key is (or will be) the file `path` (`CofferHome::secret_key`).
    pub fn new(path: PathBuf) -> Self {
        Self { path, cipher: Mutex::new(None) }
    }

    /// The key file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cipher, loading the key file or, when it is missing and `create` is set, creating it.
    fn cipher(&self, create: bool) -> Result<Arc<XChaCha20Poly1305>, CryptoError> {
        let mut slot = self.cipher.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let key = match load_key(&self.path)? {
            Some(k) => k,
            None if create => create_key(&self.path)?,
            None => return Err(CryptoError::KeyMissing { path: self.path.clone() }),
        };
        let c = Arc::new(XChaCha20Poly1305::new_from_slice(&key[..]).expect("key length is KEY_LEN"));
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Encrypts `value` for credential `name` under a fresh random nonce. `create_key` allows
    /// creating `secret.key` when it does not exist (callers pass false while ciphertexts under
    /// a previous key still exist, so a lost key is reported instead of silently replaced).
    ///
    /// # Errors
    /// [`CryptoError::InvalidName`], [`CryptoError::InvalidValue`], key file errors, or
    /// [`CryptoError::Random`].
    pub fn seal(&self, name: &str, value: &SecretString, create_key: bool) -> Result<Sealed, CryptoError> {
        validate_name(name)?;
        validate_value(value)?;
        let cipher = self.cipher(create_key)?;
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| CryptoError::Random(e.to_string()))?;
        let ciphertext = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload { msg: value.expose_secret().as_bytes(), aad: name.as_bytes() },
            )
            // Only a message beyond the cipher's ~256 GiB limit fails, and values are ≤ 64 KiB.
            .map_err(|_| CryptoError::InvalidValue("it cannot be encrypted"))?;
        Ok(Sealed { nonce: nonce.to_vec(), ciphertext })
    }

    /// Decrypts the stored `nonce` and `ciphertext` of credential `name`.
    ///
    /// # Errors
    /// [`CryptoError::KeyMissing`] and other key file errors; [`CryptoError::Decrypt`] when the
    /// key is another one, the row was altered, or it belongs to another name.
    pub fn open(&self, name: &str, nonce: &[u8], ciphertext: &[u8]) -> Result<SecretString, CryptoError> {
        let cipher = self.cipher(false)?;
        let fail = || CryptoError::Decrypt { name: name.to_owned(), path: self.path.clone() };
        if nonce.len() != NONCE_LEN {
            return Err(fail());
        }
        let plain = Zeroizing::new(
            cipher
                .decrypt(XNonce::from_slice(nonce), Payload { msg: ciphertext, aad: name.as_bytes() })
                .map_err(|_| fail())?,
        );
        let text = std::str::from_utf8(&plain).map_err(|_| fail())?;
        // `to_owned` allocates exactly once; the decrypted buffer is wiped when `plain` drops.
        Ok(SecretString::from(text.to_owned()))
    }
}

/// Reads the key file: `None` when it does not exist.
fn load_key(path: &Path) -> Result<Option<Zeroizing<[u8; KEY_LEN]>>, CryptoError> {
    let io = |source| CryptoError::KeyIo { path: path.to_owned(), source };
    let invalid = |reason: String| CryptoError::KeyInvalid { path: path.to_owned(), reason };
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    // Checked on the opened file, so the checks and the read see the same file.
    let meta = f.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(invalid("the key is not a regular file".into()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(invalid(format!(
            "the key file has mode {mode:04o}; it must be readable by its owner only (chmod 600 {})",
            path.display()
        )));
    }
    if meta.len() != KEY_LEN as u64 {
        return Err(invalid(format!("the key file holds {} bytes; it must hold exactly {KEY_LEN}", meta.len())));
    }
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    f.read_exact(&mut key[..]).map_err(io)?;
    let mut extra = [0u8; 1];
    if f.read(&mut extra).map_err(io)? != 0 {
        return Err(invalid(format!("the key file holds more than {KEY_LEN} bytes")));
    }
    Ok(Some(key))
}

/// Creates the key file exclusively (see the module docs) and returns the key now in it, which
/// is another creator's when that one won the race.
fn create_key(path: &Path) -> Result<Zeroizing<[u8; KEY_LEN]>, CryptoError> {
    let io = |source| CryptoError::KeyIo { path: path.to_owned(), source };
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    getrandom::fill(&mut key[..]).map_err(|e| CryptoError::Random(e.to_string()))?;
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix).map_err(|e| CryptoError::Random(e.to_string()))?;
    let tmp_name = format!(
        ".secret.key.tmp-{}-{}",
        std::process::id(),
        suffix.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
    let tmp = path.with_file_name(tmp_name);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        // The umask can only remove bits; set 0600 exactly so the owner can read it back.
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(&key[..])?;
        f.sync_all()
    };
    let linked = write().and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Some(dir) = path.parent()
                && let Ok(d) = std::fs::File::open(dir)
            {
                let _ = d.sync_all();
            }
            tracing::info!(path = %path.display(), "Created the credential key.");
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            load_key(path)?.ok_or_else(|| io(std::io::Error::other("the key file vanished while being created")))
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> SecretString {
        SecretString::from(s.to_owned())
    }

    fn vault() -> (tempfile::TempDir, CredentialCrypto) {
        let dir = tempfile::tempdir().unwrap();
        let v = CredentialCrypto::new(dir.path().join("secret.key"));
        (dir, v)
    }

    #[test]
    fn round_trip_and_fresh_nonces() {
        let (_dir, v) = vault();
        let a = v.seal("github", &secret("ghp_abc"), true).unwrap();
        let b = v.seal("github", &secret("ghp_abc"), true).unwrap();
        assert_eq!(a.nonce.len(), NONCE_LEN);
        assert_ne!(a.nonce, b.nonce, "every seal draws a new nonce");
        assert_ne!(a.ciphertext, b.ciphertext);
        assert!(!a.ciphertext.windows(7).any(|w| w == b"ghp_abc"), "ciphertext holds the plaintext");
        assert_eq!(v.open("github", &a.nonce, &a.ciphertext).unwrap().expose_secret(), "ghp_abc");
        let big = "x".repeat(MAX_VALUE_LEN);
        let s = v.seal("big", &secret(&big), true).unwrap();
        assert_eq!(v.open("big", &s.nonce, &s.ciphertext).unwrap().expose_secret(), big);
    }

    #[test]
    fn key_file_is_created_0600_with_32_bytes_and_reused() {
        let (dir, v) = vault();
        let path = dir.path().join("secret.key");
        assert!(!path.exists());
        let sealed = v.seal("a", &secret("one"), true).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary key files left: {leftovers:?}");
        // A second vault (a restarted store) reads the same key.
        let again = CredentialCrypto::new(path.clone());
        assert_eq!(again.open("a", &sealed.nonce, &sealed.ciphertext).unwrap().expose_secret(), "one");
        // Creation never replaces an existing key.
        let before = std::fs::read(&path).unwrap();
        assert_eq!(create_key(&path).unwrap()[..], before[..]);
        assert_eq!(std::fs::read(&path).unwrap(), before);
    }

    #[test]
    fn wrong_key_fails() {
        let (_d1, v1) = vault();
        let (_d2, v2) = vault();
        let s = v1.seal("github", &secret("value-1"), true).unwrap();
        v2.seal("other", &secret("x"), true).unwrap();
        let e = v2.open("github", &s.nonce, &s.ciphertext).unwrap_err();
        assert!(matches!(e, CryptoError::Decrypt { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("\"github\"") && msg.contains("secret.key"), "{msg}");
        assert!(!msg.contains("value-1"));
    }

    #[test]
    fn tampered_ciphertext_or_nonce_fails() {
        let (_dir, v) = vault();
        let s = v.seal("github", &secret("value-1"), true).unwrap();
        for i in [0, s.ciphertext.len() / 2, s.ciphertext.len() - 1] {
            let mut c = s.ciphertext.clone();
            c[i] ^= 1;
            assert!(matches!(v.open("github", &s.nonce, &c), Err(CryptoError::Decrypt { .. })), "byte {i}");
        }
        let mut n = s.nonce.clone();
        n[3] ^= 0x80;
        assert!(v.open("github", &n, &s.ciphertext).is_err());
        assert!(v.open("github", &s.nonce[..12], &s.ciphertext).is_err());
        assert!(v.open("github", &s.nonce, &s.ciphertext[..s.ciphertext.len() - 1]).is_err());
        assert!(v.open("github", &s.nonce, &[]).is_err());
    }

    #[test]
    fn associated_data_binds_the_name() {
        let (_dir, v) = vault();
        let s = v.seal("github", &secret("value-1"), true).unwrap();
        let e = v.open("gitlab", &s.nonce, &s.ciphertext).unwrap_err();
        assert!(matches!(e, CryptoError::Decrypt { ref name, .. } if name == "gitlab"), "{e}");
    }

    #[test]
    fn missing_key_is_not_recreated_for_reading() {
        let (dir, v) = vault();
        let e = v.open("a", &[0; NONCE_LEN], &[0; 32]).unwrap_err();
        assert!(matches!(e, CryptoError::KeyMissing { .. }), "{e}");
        assert!(e.to_string().contains(&dir.path().join("secret.key").display().to_string()));
        assert!(!dir.path().join("secret.key").exists());
        let e = v.seal("a", &secret("x"), false).unwrap_err();
        assert!(matches!(e, CryptoError::KeyMissing { .. }), "{e}");
    }

    #[test]
    fn bad_key_files_are_refused_naming_the_path() {
        let (dir, v) = vault();
        let path = dir.path().join("secret.key");
        let shown = path.display().to_string();

        std::fs::write(&path, [7u8; 16]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = v.seal("a", &secret("x"), true).unwrap_err().to_string();
        assert!(e.contains(&shown) && e.contains("16 bytes"), "{e}");

        std::fs::write(&path, [7u8; KEY_LEN]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = v.seal("a", &secret("x"), true).unwrap_err().to_string();
        assert!(e.contains(&shown) && e.contains("0644") && e.contains("chmod 600"), "{e}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = v.seal("a", &secret("x"), true).unwrap();
        assert_eq!(v.open("a", &s.nonce, &s.ciphertext).unwrap().expose_secret(), "x");
        assert_eq!(std::fs::read(&path).unwrap(), [7u8; KEY_LEN], "a valid key file is used as is");

        let (dir2, v2) = vault();
        std::fs::create_dir(dir2.path().join("secret.key")).unwrap();
        assert!(v2.seal("a", &secret("x"), true).unwrap_err().to_string().contains("not a regular file"));
    }

    #[test]
    fn names_and_values() {
        for ok in ["a", "GitHub_Token", "x.y-z_1", "0", &"a".repeat(64)] {
            validate_name(ok).unwrap();
        }
        for bad in ["", "_a", ".a", "-a", "a b", "a/b", "é", "a:b", &"a".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_value(&secret("")).is_err());
        assert!(validate_value(&secret("a\0b")).is_err());
        assert!(validate_value(&secret(&"x".repeat(MAX_VALUE_LEN + 1))).is_err());
        validate_value(&secret(&"x".repeat(MAX_VALUE_LEN))).unwrap();
        let e = validate_value(&secret("top-secret\0")).unwrap_err().to_string();
        assert!(!e.contains("top-secret"), "{e}");
    }
}
