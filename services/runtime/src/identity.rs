//! Internal identities: who is calling an internal RPC, told apart by per-service tokens.
//!
//! The supervisor generates one random token per service (and one for itself) at every start.
//! Each child receives, in its environment only, its own token ([`crate::env::INTERNAL_TOKEN`])
//! and the SHA-256 digests of every identity's token ([`crate::env::PEER_DIGESTS`]). A receiver
//! hashes the token a caller presents and compares it in constant time with each digest: the
//! one that matches names the caller. A service holds no other service's token, only digests
//! (a preimage of a 256-bit random value cannot be found), so it cannot impersonate another.
use std::fmt;

use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Error reading identities or digests from the environment.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("environment variable {0} is not set: this binary is started by coffer-daemon")]
    Missing(&'static str),
    #[error("{var}: {entry:?} is not `<identity>=<64 hex characters>`")]
    Malformed { var: &'static str, entry: String },
    #[error("{var}: unknown identity {name:?} (known: {known})")]
    Unknown { var: &'static str, name: String, known: String },
}

/// Who is calling: the supervisor or one of the services in its table. Adding a service adds a
/// variant here (its name is its row's name in the supervisor's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// `coffer-daemon` itself (health checks of its children).
    Supervisor,
    /// `coffer-store`.
    Store,
    /// `coffer-gateway` (the edge and the MCP gateway).
    Gateway,
    /// `coffer-chat`.
    Chat,
    /// `coffer-retrieval`.
    Retrieval,
    /// `coffer-callback` (the SeaTalk webhook listener; on demand, while a SeaTalk channel is
    /// enabled): it calls only coffer-chat's `ChannelAdapters.DeliverSeatalkEvent`.
    Callback,
}

impl Identity {
    /// Every identity, in a fixed order.
    pub const ALL: [Identity; 6] = [
        Identity::Supervisor,
        Identity::Store,
        Identity::Gateway,
        Identity::Chat,
        Identity::Retrieval,
        Identity::Callback,
    ];

    /// The name used in the environment, in logs and in refusals (`gateway`, `store`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Supervisor => "supervisor",
            Self::Store => "store",
            Self::Gateway => "gateway",
            Self::Chat => "chat",
            Self::Retrieval => "retrieval",
            Self::Callback => "callback",
        }
    }

    /// The identity named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|i| i.as_str() == name)
    }

    /// The environment variable that holds this identity's internal listener address
    /// (`127.0.0.1:port`); the supervisor's is its control RPC.
    pub fn addr_var(self) -> &'static str {
        use crate::env;
        match self {
            Self::Supervisor => env::CONTROL_ADDR,
            Self::Store => env::STORE_ADDR,
            Self::Gateway => env::GATEWAY_GRPC_ADDR,
            Self::Chat => env::CHAT_ADDR,
            Self::Retrieval => env::RETRIEVAL_ADDR,
            Self::Callback => env::CALLBACK_ADDR,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The SHA-256 digest of one internal token.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    /// Digest of `token` (its hex text, as presented in the metadata header).
    pub fn of(token: &SecretString) -> Self {
        Self::of_bytes(token.expose_secret().as_bytes())
    }

    /// Digest of presented bytes.
    pub fn of_bytes(presented: &[u8]) -> Self {
        Self(Sha256::digest(presented).into())
    }

    /// 64 lowercase hex characters.
    pub fn to_hex(self) -> String {
        hex::encode(self.0)
    }

    fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }
}

impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not secret, but nothing needs it in a log either.
        f.write_str("TokenDigest(..)")
    }
}

/// The digests of the tokens a receiver accepts, each naming its identity.
#[derive(Debug, Clone, Default)]
pub struct PeerDigests {
    entries: Vec<(Identity, TokenDigest)>,
}

impl PeerDigests {
    /// Digests from `(identity, token)` pairs (the supervisor, and tests with made-up tokens).
    pub fn from_tokens<'a>(tokens: impl IntoIterator<Item = (Identity, &'a SecretString)>) -> Self {
        Self { entries: tokens.into_iter().map(|(i, t)| (i, TokenDigest::of(t))).collect() }
    }

    /// The identity whose token was presented, if any. Hashes `presented` once and compares the
    /// digest with every entry in constant time (which entry matched is not secret: the caller
    /// knows who it is).
    pub fn identify(&self, presented: &[u8]) -> Option<Identity> {
        let d = TokenDigest::of_bytes(presented);
        let mut found = None;
        for (id, expected) in &self.entries {
            if bool::from(expected.0.ct_eq(&d.0)) {
                found = Some(*id);
            }
        }
        found
    }

    /// The value of [`crate::env::PEER_DIGESTS`]: `name=hex,name=hex,…`.
    pub fn to_env(&self) -> String {
        self.entries.iter().map(|(i, d)| format!("{i}={}", d.to_hex())).collect::<Vec<_>>().join(",")
    }

    /// Parses a value written by [`PeerDigests::to_env`].
    ///
    /// # Errors
    /// [`IdentityError::Malformed`] or [`IdentityError::Unknown`] naming the bad entry.
    pub fn parse(var: &'static str, value: &str) -> Result<Self, IdentityError> {
        let mut entries = Vec::new();
        for entry in value.split(',').filter(|e| !e.is_empty()) {
            let malformed = || IdentityError::Malformed { var, entry: entry.to_owned() };
            let (name, hex) = entry.split_once('=').ok_or_else(malformed)?;
            let id = Identity::from_name(name).ok_or_else(|| IdentityError::Unknown {
                var,
                name: name.to_owned(),
                known: Identity::ALL.map(Identity::as_str).join(", "),
            })?;
            entries.push((id, TokenDigest::from_hex(hex).ok_or_else(malformed)?));
        }
        Ok(Self { entries })
    }

    /// Reads [`crate::env::PEER_DIGESTS`].
    ///
    /// # Errors
    /// When it is missing or malformed.
    pub fn from_env() -> Result<Self, IdentityError> {
        let var = crate::env::PEER_DIGESTS;
        let value = std::env::var(var).map_err(|_| IdentityError::Missing(var))?;
        Self::parse(var, &value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_token_names_its_identity_and_nothing_else_matches() {
        let gw = crate::token::random_token();
        let rt = crate::token::random_token();
        let peers = PeerDigests::from_tokens([(Identity::Gateway, &gw), (Identity::Retrieval, &rt)]);
        assert_eq!(peers.identify(gw.expose_secret().as_bytes()), Some(Identity::Gateway));
        assert_eq!(peers.identify(rt.expose_secret().as_bytes()), Some(Identity::Retrieval));
        assert_eq!(peers.identify(crate::token::random_token().expose_secret().as_bytes()), None);
        assert_eq!(peers.identify(b""), None);
        // A digest presented as a token is not the token.
        assert_eq!(peers.identify(TokenDigest::of(&gw).to_hex().as_bytes()), None);
    }

    #[test]
    fn env_form_round_trips_and_bad_entries_are_named() {
        let gw = crate::token::random_token();
        let peers = PeerDigests::from_tokens([(Identity::Gateway, &gw), (Identity::Supervisor, &gw)]);
        let value = peers.to_env();
        assert!(!value.contains(gw.expose_secret()), "the env form holds digests, not tokens");
        let back = PeerDigests::parse("V", &value).unwrap();
        assert!(back.identify(gw.expose_secret().as_bytes()).is_some());
        let e = PeerDigests::parse("V", "nobody=00").unwrap_err().to_string();
        assert!(e.contains("unknown identity \"nobody\""), "{e}");
        let e = PeerDigests::parse("V", "gateway=zz").unwrap_err().to_string();
        assert!(e.contains("\"gateway=zz\""), "{e}");
        assert!(PeerDigests::parse("V", "").unwrap().identify(b"x").is_none());
        for i in Identity::ALL {
            assert_eq!(Identity::from_name(i.as_str()), Some(i));
        }
    }
}
