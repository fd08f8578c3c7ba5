//! The two protocol eras an upstream may speak, and what Coffer sends differently to each:
//! the stateless revision 2026-07-28 (per-request `_meta`, `server/discover`, no handshake; MCP
//! 2026-07-28 basic/index §_meta, server/discover, basic/versioning) and the handshake era
//! 2025-03-26…2025-11-25 (`initialize`). Pure functions; the probe itself is in
//! [`crate::mcp::upstream::Upstream::start`].
use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// The stateless revision's version (MCP 2026-07-28).
pub const MODERN: &str = "2026-07-28";
/// The newest handshake-era version: what a handshake-era upstream is offered when the
/// downstream session itself speaks [`MODERN`].
pub const NEWEST_LEGACY: &str = "2025-11-25";
/// Handshake-era versions Coffer offers an upstream in `initialize`.
const LEGACY: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// `_meta` keys of the stateless revision (MCP 2026-07-28 basic/index §_meta).
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_CLIENT_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_LOG_LEVEL: &str = "io.modelcontextprotocol/logLevel";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `UnsupportedProtocolVersion` (MCP 2026-07-28 basic/index §Error codes).
pub const UNSUPPORTED_VERSION: i64 = -32022;

/// Which protocol era an upstream speaks, learnt by probing it (`server/discover` first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2025-03-26…2025-11-25: `initialize` handshake, server→client requests, sessions.
    Legacy,
    /// 2026-07-28: stateless, `_meta` on every request, MRTR, `subscriptions/listen`.
    Modern,
}

impl Era {
    /// `"2026-07-28"` or `"handshake"`, for status and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Era::Legacy => "handshake",
            Era::Modern => MODERN,
        }
    }

    /// The era [`Era::as_str`] names, if any.
    pub fn parse(s: &str) -> Option<Era> {
        [Era::Legacy, Era::Modern].into_iter().find(|e| e.as_str() == s)
    }
}

/// The `_meta` object (JSON text) a modern upstream gets on every request, from the session's
/// `{protocolVersion, capabilities, clientInfo}` params: protocol version [`MODERN`], the
/// client's info and capabilities, and the log level the client asked for (if any: the
/// revision has no `logging/setLevel`, and servers log only for requests that carry it).
pub fn client_meta(init_params: &Value, log_level: Option<&str>) -> String {
    let mut meta = json!({
        META_VERSION: MODERN,
        META_CLIENT_INFO: init_params.get("clientInfo").cloned().unwrap_or_else(|| json!({"name": "coffer", "version": coffer_runtime::VERSION})),
        META_CLIENT_CAPS: init_params.get("capabilities").cloned().unwrap_or_else(|| json!({})),
    });
    if let Some(level) = log_level {
        meta[META_LOG_LEVEL] = json!(level);
    }
    meta.to_string()
}

/// `params` with `meta`'s keys set in its `_meta` (keys already there and not in `meta`, such
/// as a `progressToken`, stay); every other member stays verbatim. Params that are absent or
/// not an object become `{"_meta": meta}`.
pub fn with_meta(params: Option<&RawValue>, meta: &str) -> Box<RawValue> {
    let fields: Option<BTreeMap<String, &RawValue>> = params.and_then(|p| serde_json::from_str(p.get()).ok());
    let Some(mut fields) = fields else {
        return RawValue::from_string(format!("{{\"_meta\":{meta}}}")).expect("json");
    };
    let merged =
        match fields.get("_meta").and_then(|m| serde_json::from_str::<serde_json::Map<String, Value>>(m.get()).ok()) {
            Some(mut existing) => {
                let ours: serde_json::Map<String, Value> = serde_json::from_str(meta).expect("meta is an object");
                existing.extend(ours);
                Value::Object(existing).to_string()
            }
            None => meta.to_owned(),
        };
    let meta_raw = RawValue::from_string(merged).expect("json");
    fields.insert("_meta".to_owned(), &meta_raw);
    RawValue::from_string(serde_json::to_string(&fields).expect("json")).expect("json")
}

/// `initialize` params for a handshake-era upstream: the session's own, with a version the
/// upstream can know ([`NEWEST_LEGACY`] when the session speaks [`MODERN`] or anything else
/// outside the handshake era).
pub fn legacy_init_params(init_params: &Value) -> Value {
    let version = init_params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
    if LEGACY.contains(&version) {
        return init_params.clone();
    }
    let mut p = init_params.clone();
    if p.is_object() {
        p["protocolVersion"] = json!(NEWEST_LEGACY);
    } else {
        p = json!({"protocolVersion": NEWEST_LEGACY, "capabilities": {}, "clientInfo": {"name": "coffer", "version": coffer_runtime::VERSION}});
    }
    p
}

/// `server/discover` params: only `_meta`.
pub fn discover_params(meta: &str) -> Box<RawValue> {
    with_meta(None, meta)
}

/// What a `server/discover` result says, as an `initialize`-shaped result
/// (`{protocolVersion, capabilities, serverInfo, instructions?}`) when the server supports
/// [`MODERN`]; `None` (fall back to `initialize`) when the result is not an object, lists no
/// modern version, or has no capabilities object (MCP 2026-07-28 basic/transports/stdio
/// §Backward Compatibility: anything but a usable `DiscoverResult` means a legacy server).
pub fn discovered(result: &RawValue) -> Option<Value> {
    let v: Value = serde_json::from_str(result.get()).ok()?;
    let versions = v.get("supportedVersions")?.as_array()?;
    if !versions.iter().any(|x| x.as_str() == Some(MODERN)) {
        return None;
    }
    let capabilities = v.get("capabilities").filter(|c| c.is_object())?.clone();
    let mut init = json!({"protocolVersion": MODERN, "capabilities": capabilities});
    if let Some(info) = v.pointer("/_meta").and_then(|m| m.get(META_SERVER_INFO)).or_else(|| v.get("serverInfo")) {
        init["serverInfo"] = info.clone();
    }
    if let Some(i) = v.get("instructions").filter(|i| i.is_string()) {
        init["instructions"] = i.clone();
    }
    Some(init)
}

/// The `code` of a raw JSON-RPC error object, if it has an integer one.
pub fn error_code(error: &RawValue) -> Option<i64> {
    #[derive(serde::Deserialize)]
    struct Code {
        code: i64,
    }
    serde_json::from_str::<Code>(error.get()).ok().map(|c| c.code)
}

/// The `Mcp-Name` header value of a request (MCP 2026-07-28 basic/transports/streamable-http
/// §Standard Request Headers): `params.name` of `tools/call` and `prompts/get`, `params.uri`
/// of `resources/read`, encoded by [`header_value`]; `None` for other methods.
pub fn mcp_name(method: &str, params: Option<&RawValue>) -> Option<String> {
    let field = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return None,
    };
    #[derive(serde::Deserialize)]
    struct Named {
        name: Option<String>,
        uri: Option<String>,
    }
    let named: Named = serde_json::from_str(params?.get()).ok()?;
    let value = if field == "name" { named.name } else { named.uri }?;
    Some(header_value(&value))
}

/// A value as an HTTP header value (MCP 2026-07-28 basic/transports/streamable-http §Value
/// Encoding): as is when it is visible ASCII and spaces without surrounding whitespace and
/// does not look like the sentinel; else `=?base64?<UTF-8, base64>?=`.
pub fn header_value(value: &str) -> String {
    let plain = value.bytes().all(|b| b == b' ' || b == b'\t' || (0x21..=0x7e).contains(&b))
        && value.trim() == value
        && !(value.starts_with("=?base64?") && value.ends_with("?="));
    if plain {
        value.to_owned()
    } else {
        format!("=?base64?{}?=", base64::engine::general_purpose::STANDARD.encode(value.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn meta_is_merged_into_params_and_everything_else_stays() {
        let init = json!({"protocolVersion": "2025-06-18", "capabilities": {"sampling": {}}, "clientInfo": {"name": "c", "version": "1"}});
        let meta = client_meta(&init, None);
        let out = with_meta(Some(&raw(r#"{"name":"x","arguments":{"a": [1, 2]},"_meta":{"progressToken":7}}"#)), &meta);
        let v: Value = serde_json::from_str(out.get()).unwrap();
        assert_eq!(v["_meta"]["progressToken"], 7);
        assert_eq!(v["_meta"][META_VERSION], MODERN);
        assert_eq!(v["_meta"][META_CLIENT_CAPS], json!({"sampling": {}}));
        assert_eq!(v["_meta"][META_CLIENT_INFO]["name"], "c");
        assert!(out.get().contains(r#""arguments":{"a": [1, 2]}"#), "verbatim: {}", out.get());
        let none = with_meta(None, &client_meta(&init, Some("debug")));
        let v: Value = serde_json::from_str(none.get()).unwrap();
        assert_eq!(v["_meta"][META_LOG_LEVEL], "debug");
        let not_object = with_meta(Some(&raw("[1]")), &meta);
        assert!(not_object.get().starts_with("{\"_meta\":"));
    }

    #[test]
    fn a_modern_session_offers_handshake_upstreams_the_newest_handshake_version() {
        let modern =
            json!({"protocolVersion": MODERN, "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}});
        assert_eq!(legacy_init_params(&modern)["protocolVersion"], NEWEST_LEGACY);
        let old = json!({"protocolVersion": "2025-03-26", "capabilities": {}});
        assert_eq!(legacy_init_params(&old), old);
    }

    #[test]
    fn only_a_usable_discover_result_means_a_modern_server() {
        let ok = discovered(&raw(
            r#"{"resultType":"complete","supportedVersions":["2026-07-28"],"capabilities":{"tools":{"listChanged":true}},"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"t","version":"2"}},"ttlMs":1000,"cacheScope":"public"}"#,
        ))
        .unwrap();
        assert_eq!(ok["serverInfo"]["name"], "t");
        assert_eq!(ok["protocolVersion"], MODERN);
        assert!(ok["capabilities"]["tools"].is_object());
        for garbage in [
            r#""hello""#,
            r#"{}"#,
            r#"{"supportedVersions":"2026-07-28","capabilities":{}}"#,
            r#"{"supportedVersions":["2025-11-25"],"capabilities":{}}"#,
            r#"{"supportedVersions":["2026-07-28"],"capabilities":[]}"#,
        ] {
            assert!(discovered(&raw(garbage)).is_none(), "{garbage}");
        }
    }

    #[test]
    fn names_are_mirrored_in_headers_encoded_when_unsafe() {
        assert_eq!(mcp_name("tools/call", Some(&raw(r#"{"name":"get_time"}"#))).as_deref(), Some("get_time"));
        assert_eq!(mcp_name("resources/read", Some(&raw(r#"{"uri":"file:///a b"}"#))).as_deref(), Some("file:///a b"));
        assert_eq!(mcp_name("tools/list", Some(&raw(r#"{"name":"x"}"#))), None);
        assert_eq!(header_value("Hello, 世界"), "=?base64?SGVsbG8sIOS4lueVjA==?=");
        assert_eq!(header_value(" padded "), "=?base64?IHBhZGRlZCA=?=");
        assert_eq!(header_value("=?base64?literal?="), "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?=");
        assert_eq!(header_value("line1\nline2"), "=?base64?bGluZTEKbGluZTI=?=");
    }

    #[test]
    fn error_codes_are_read_from_raw_errors() {
        assert_eq!(error_code(&raw(r#"{"code":-32022,"message":"x"}"#)), Some(-32022));
        assert_eq!(error_code(&raw(r#"{"message":"x"}"#)), None);
    }
}
