//! Credential references in MCP server `env` and `headers` values, in one place.
//!
//! On the REST wire a value is either a literal string or `{"credential_ref": "<name>"}`; in the
//! store (whose maps are `map<string,string>`) a reference is the string
//! `coffer-credential-ref:<name>` ([`REF_PREFIX`]). References are resolved into values only when
//! an upstream starts (`mcp::Shared::resolve_server`), and only into that child's environment or
//! HTTP headers; [`Redactor`] then keeps those values out of its stderr log.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use coffer_proto::store::McpServer;
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;

use crate::error::ApiError;

/// Prefix of a stored credential reference: `coffer-credential-ref:<name>`.
pub use coffer_types::secrets::REF_PREFIX;
/// What a redacted credential value is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// The stored form of a reference to credential `name`.
pub fn encode_ref(name: &str) -> String {
    format!("{REF_PREFIX}{name}")
}

/// The credential name a stored value references, or `None` for a literal.
pub fn decode_ref(stored: &str) -> Option<&str> {
    stored.strip_prefix(REF_PREFIX)
}

/// An `env` or `headers` value on the REST wire: a literal or `{"credential_ref": "<name>"}`
/// (the contract's type).
pub use coffer_api::servers::{CredentialRef, EnvValue as WireValue};

/// Converts a wire map (`field` is `env` or `headers`, for messages) to its stored form.
///
/// # Errors
/// `INVALID_ARGUMENT` for a reference whose name is not a valid credential name, or a literal
/// that starts with [`REF_PREFIX`] (which would read back as a reference).
pub fn to_stored(
    field: &str,
    map: impl IntoIterator<Item = (String, WireValue)>,
) -> Result<HashMap<String, String>, ApiError> {
    map.into_iter()
        .map(|(k, v)| match v {
            WireValue::Literal(s) if s.starts_with(REF_PREFIX) => Err(ApiError::invalid(format!(
                "{field} value of {k:?} starts with the reserved prefix {REF_PREFIX:?}; reference a credential with {{\"credential_ref\": \"<name>\"}}"
            ))
            .with_details(json!({"field": field, "key": k}))),
            WireValue::Literal(s) => Ok((k, s)),
            WireValue::Ref(r) => {
                if !valid_name(&r.credential_ref) {
                    return Err(ApiError::invalid(format!(
                        "{field} value of {k:?} references {:?}, which is not a valid credential name",
                        truncate(&r.credential_ref, 80)
                    ))
                    .with_details(json!({"field": field, "key": k})));
                }
                Ok((k, encode_ref(&r.credential_ref)))
            }
        })
        .collect()
}

/// A stored map as the REST wire has it: keys sorted, references as `{"credential_ref": name}`.
pub fn render(map: &HashMap<String, String>) -> BTreeMap<String, WireValue> {
    map.iter()
        .map(|(k, v)| {
            let v = match decode_ref(v) {
                Some(name) => WireValue::Ref(CredentialRef { credential_ref: name.to_owned() }),
                None => WireValue::Literal(v.clone()),
            };
            (k.clone(), v)
        })
        .collect()
}

/// Every credential name `env` and `headers` reference, sorted.
pub fn referenced<'a>(maps: impl IntoIterator<Item = &'a HashMap<String, String>>) -> BTreeSet<String> {
    maps.into_iter().flat_map(|m| m.values()).filter_map(|v| decode_ref(v)).map(str::to_owned).collect()
}

/// Checks a credential name (`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`, the store's rule).
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Fails with `INVALID_ARGUMENT` naming the first of `referenced` that is not in `existing`.
///
/// # Errors
/// As described; details carry `{"credential": name}`.
pub fn require_existing(referenced: &BTreeSet<String>, existing: &BTreeSet<String>) -> Result<(), ApiError> {
    match referenced.iter().find(|n| !existing.contains(*n)) {
        Some(missing) => Err(ApiError::invalid(format!(
            "credential {missing:?} does not exist; set it first (PUT /v1/credentials/{missing})"
        ))
        .with_details(json!({"credential": missing}))),
        None => Ok(()),
    }
}

/// Replaces references in `server`'s `env` and `headers` with the values in `values`; returns
/// the values used, for redaction.
///
/// # Errors
/// The name of the first referenced credential missing from `values`.
pub fn substitute(server: &mut McpServer, values: &HashMap<String, SecretString>) -> Result<Vec<SecretString>, String> {
    let mut used: Vec<SecretString> = Vec::new();
    for map in [&mut server.env, &mut server.headers] {
        for v in map.values_mut() {
            if let Some(name) = decode_ref(v) {
                let secret = values.get(name).ok_or_else(|| name.to_owned())?;
                *v = secret.expose_secret().to_owned();
                if !used.iter().any(|u| u.expose_secret() == secret.expose_secret()) {
                    used.push(secret.clone());
                }
            }
        }
    }
    Ok(used)
}

/// Shortest piece of a multi-line value that is redacted on its own (shorter lines of a value,
/// like a blank line inside a PEM block, say nothing and would blank out unrelated text).
const MIN_PIECE: usize = 8;

/// Replaces credential values in text an upstream wrote (its stderr) with [`REDACTED`].
///
/// Text is redacted a line at a time, so besides each whole value, each line of a multi-line
/// value (at least [`MIN_PIECE`] bytes) is redacted on its own.
#[derive(Default)]
pub struct Redactor {
    needles: Vec<SecretString>,
}

impl Redactor {
    /// A redactor for `secrets` (longest first, so a value containing another goes whole).
    pub fn new(secrets: &[SecretString]) -> Self {
        let mut needles: Vec<SecretString> = Vec::new();
        let mut push = |s: &str| {
            if !s.is_empty() && !needles.iter().any(|n| n.expose_secret() == s) {
                needles.push(SecretString::from(s.to_owned()));
            }
        };
        for s in secrets {
            let v = s.expose_secret();
            push(v);
            if v.contains('\n') {
                for piece in v.split('\n').map(|p| p.trim_end_matches('\r')).filter(|p| p.len() >= MIN_PIECE) {
                    push(piece);
                }
            }
        }
        needles.sort_by_key(|n| std::cmp::Reverse(n.expose_secret().len()));
        Self { needles }
    }

    /// True when there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// `line` with every occurrence of every value replaced by [`REDACTED`] (bytes, so text
    /// that is not UTF-8 is redacted too).
    pub fn redact<'a>(&self, line: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        let mut out = std::borrow::Cow::Borrowed(line);
        for n in &self.needles {
            let n = n.expose_secret().as_bytes();
            if let Some(replaced) = replace_all(&out, n, REDACTED.as_bytes()) {
                out = std::borrow::Cow::Owned(replaced);
            }
        }
        out
    }

    /// [`Redactor::redact`] for a string.
    pub fn redact_str(&self, text: &str) -> String {
        String::from_utf8_lossy(&self.redact(text.as_bytes())).into_owned()
    }
}

/// `hay` with every non-overlapping `needle` replaced by `with`; `None` when there is none.
fn replace_all(hay: &[u8], needle: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    let mut out: Option<Vec<u8>> = None;
    let (mut i, mut copied) = (0, 0);
    while i + needle.len() <= hay.len() {
        if &hay[i..i + needle.len()] == needle {
            let o = out.get_or_insert_with(|| Vec::with_capacity(hay.len()));
            o.extend_from_slice(&hay[copied..i]);
            o.extend_from_slice(with);
            i += needle.len();
            copied = i;
        } else {
            i += 1;
        }
    }
    out.map(|mut o| {
        o.extend_from_slice(&hay[copied..]);
        o
    })
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn wire(v: Value) -> HashMap<String, WireValue> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn wire_round_trip() {
        let m = wire(json!({"A": "plain", "B": {"credential_ref": "github"}}));
        let stored = to_stored("env", m).unwrap();
        assert_eq!(stored["A"], "plain");
        assert_eq!(stored["B"], "coffer-credential-ref:github");
        assert_eq!(decode_ref(&stored["B"]), Some("github"));
        assert_eq!(decode_ref("plain"), None);
        assert_eq!(
            serde_json::to_value(render(&stored)).unwrap(),
            json!({"A": "plain", "B": {"credential_ref": "github"}})
        );
        assert_eq!(referenced([&stored]).into_iter().collect::<Vec<_>>(), ["github"]);
    }

    #[test]
    fn bad_wire_values() {
        let e = to_stored("env", wire(json!({"A": "coffer-credential-ref:x"}))).unwrap_err();
        assert!(e.message.contains("reserved prefix"), "{}", e.message);
        let e = to_stored("headers", wire(json!({"A": {"credential_ref": "bad name"}}))).unwrap_err();
        assert!(e.message.contains("not a valid credential name"), "{}", e.message);
        for bad in [json!({"A": {"credential_ref": "x", "more": 1}}), json!({"A": 1}), json!({"A": {}})] {
            assert!(serde_json::from_value::<HashMap<String, WireValue>>(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn missing_references_are_named() {
        let refs: BTreeSet<String> = ["a".into(), "b".into()].into();
        let have: BTreeSet<String> = ["a".into()].into();
        let e = require_existing(&refs, &have).unwrap_err();
        assert!(e.message.contains("\"b\""), "{}", e.message);
        assert_eq!(e.details["credential"], "b");
        require_existing(&refs, &refs).unwrap();
    }

    #[test]
    fn substitution() {
        let mut s = McpServer {
            env: [("T".into(), encode_ref("tok")), ("L".into(), "lit".into()), ("U".into(), encode_ref("tok"))].into(),
            headers: [("Authorization".into(), encode_ref("h"))].into(),
            ..Default::default()
        };
        let values: HashMap<String, SecretString> =
            [("tok".into(), SecretString::from("v1")), ("h".into(), SecretString::from("v2"))].into();
        let used = substitute(&mut s, &values).unwrap();
        assert_eq!(s.env["T"], "v1");
        assert_eq!(s.env["U"], "v1");
        assert_eq!(s.env["L"], "lit");
        assert_eq!(s.headers["Authorization"], "v2");
        assert_eq!(used.len(), 2);
        let mut t = McpServer { env: [("T".into(), encode_ref("gone"))].into(), ..Default::default() };
        assert_eq!(substitute(&mut t, &values).unwrap_err(), "gone");
    }

    #[test]
    fn redaction() {
        let r = Redactor::new(&[
            SecretString::from("abc123secret"),
            SecretString::from("abc"),
            SecretString::from("-----BEGIN KEY-----\nMIIBOgIBAAJBAK\n\nx\n-----END KEY-----"),
        ]);
        assert_eq!(r.redact_str("token=abc123secret;"), "token=[REDACTED];");
        assert_eq!(r.redact_str("abcabc"), "[REDACTED][REDACTED]");
        assert_eq!(r.redact_str("nothing here"), "nothing here");
        assert_eq!(r.redact_str("line MIIBOgIBAAJBAK end"), "line [REDACTED] end");
        assert_eq!(r.redact_str("x marks"), "x marks", "short lines of a value are not redacted alone");
        let bytes = [b"\xff\xfeabc123secret\xff".as_slice()].concat();
        assert_eq!(&r.redact(&bytes)[..], b"\xff\xfe[REDACTED]\xff");
        assert!(Redactor::new(&[]).is_empty());
        assert!(matches!(Redactor::new(&[]).redact(b"x"), std::borrow::Cow::Borrowed(_)));
    }
}
