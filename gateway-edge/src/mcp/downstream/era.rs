//! The two eras of MCP a downstream client may speak on `/mcp` (and on the shim's stream), and
//! what the modern one (MCP 2026-07-28) asks of every request and result, independent of the
//! transport:
//!
//! - **legacy** (2025-03-26 … 2025-11-25): an `initialize` handshake opens a session; nothing
//!   here applies (that path is unchanged);
//! - **modern** (2026-07-28, basic/versioning): no handshake; every request carries its
//!   protocol version, client info and capabilities in `params._meta`
//!   (`io.modelcontextprotocol/*`); every result carries `resultType`; list and read results
//!   carry `ttlMs` and `cacheScope` (server/utilities/caching); `server/discover` says what the
//!   server speaks.
//!
//! This module reads a modern request's metadata ([`meta`]), checks the Streamable HTTP request
//! headers against the body ([`check_headers`], basic/transports/streamable-http §Server
//! Validation), builds the modern errors (-32020 `HeaderMismatch`, -32022
//! `UnsupportedProtocolVersion`), the `server/discover` result ([`discover_result`]) and
//! decorates results ([`complete`]).
use axum::http::HeaderMap;
use base64::Engine as _;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::mcp::SUPPORTED_VERSIONS;
use crate::mcp::catalog::LIST_TTL;

/// Protocol revisions Coffer serves without a handshake (per-request `_meta`), newest first.
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];
/// `_meta` key of the request's protocol version (MCP 2026-07-28 basic §_meta).
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key of the client's identity.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// `_meta` key of the client's capabilities for this request.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key of the server's identity on results.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// `_meta` key tagging every message of a `subscriptions/listen` stream with its request id.
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
/// JSON-RPC error: the HTTP headers disagree with the body, or a required one is missing.
pub const HEADER_MISMATCH: i64 = -32020;
/// JSON-RPC error: the requested protocol version is not served; `data.supported` lists ours.
pub const UNSUPPORTED_VERSION: i64 = -32022;
/// `Mcp-Method` request header (basic/transports/streamable-http §Standard Request Headers).
pub const METHOD_HEADER: &str = "mcp-method";
/// `Mcp-Name` request header: `params.name` or `params.uri` of a call, read or prompt.
pub const NAME_HEADER: &str = "mcp-name";

/// Whether `version` is a modern (handshake-less) revision Coffer serves.
pub fn is_modern(version: &str) -> bool {
    MODERN_VERSIONS.contains(&version)
}

/// Every revision Coffer serves, modern first (`server/discover`, -32022's `data.supported`).
pub fn all_versions() -> Vec<&'static str> {
    MODERN_VERSIONS.iter().chain(SUPPORTED_VERSIONS).copied().collect()
}

/// The methods a modern client may call on `/mcp`; anything else gets -32601 (404 on HTTP).
pub fn is_modern_method(method: &str) -> bool {
    matches!(
        method,
        "server/discover"
            | "subscriptions/listen"
            | "tools/list"
            | "tools/call"
            | "prompts/list"
            | "prompts/get"
            | "resources/list"
            | "resources/templates/list"
            | "resources/read"
            | "completion/complete"
    )
}

/// Methods whose modern answer may be an `InputRequiredResult` (basic/patterns/mrtr §Supported
/// Requests), and which name their target in `Mcp-Name`.
pub fn is_call_like(method: &str) -> bool {
    matches!(method, "tools/call" | "prompts/get" | "resources/read")
}

/// A modern request's metadata, from `params._meta`.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub version: String,
    /// `io.modelcontextprotocol/clientInfo` (`{}` when absent).
    pub client_info: Value,
    /// `io.modelcontextprotocol/clientCapabilities` (`{}` when absent).
    pub capabilities: Value,
    /// Whether `_meta` carried the (required) client capabilities at all.
    pub has_capabilities: bool,
}

impl Meta {
    /// The `{protocolVersion, capabilities, clientInfo}` an `initialize` would have carried:
    /// what a modern client's gateway session is created with. `clientInfo` is the client's as
    /// sent, whatever it is: the session keeps only its name and version, and shows upstreams
    /// Coffer's own (`client.rs`).
    pub fn init_params(&self) -> Value {
        json!({"protocolVersion": self.version, "capabilities": self.capabilities, "clientInfo": self.client_info})
    }
}

/// Cheap test for a modern request: its params text names the version key at all.
pub fn mentions_meta(params: Option<&RawValue>) -> bool {
    params.is_some_and(|p| p.get().contains(META_VERSION))
}

/// Reads `params._meta` of a request. `None` when it carries no protocol version (a legacy
/// request, or a modern one missing its metadata: the caller decides).
pub fn meta(params: Option<&RawValue>) -> Option<Meta> {
    let p: Value = serde_json::from_str(params?.get()).ok()?;
    let m = p.get("_meta")?;
    let version = m.get(META_VERSION)?.as_str()?.to_owned();
    Some(Meta {
        version,
        client_info: m.get(META_CLIENT_INFO).cloned().unwrap_or_else(|| json!({})),
        capabilities: m.get(META_CLIENT_CAPABILITIES).cloned().unwrap_or_else(|| json!({})),
        has_capabilities: m.get(META_CLIENT_CAPABILITIES).is_some_and(Value::is_object),
    })
}

/// Why a request is refused before it runs: the JSON-RPC code, message and `data`, and
/// whether the HTTP status is 400 (every refusal here is).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl Refusal {
    fn mismatch(message: impl Into<String>) -> Self {
        Self { code: HEADER_MISMATCH, message: message.into(), data: None }
    }

    /// -32022 for `requested` (cut to 40 characters), listing every version Coffer serves.
    pub fn unsupported(requested: &str) -> Self {
        let requested: String = requested.chars().take(40).collect();
        Self {
            code: UNSUPPORTED_VERSION,
            message: format!("Unsupported protocol version {requested:?}; supported: {}", all_versions().join(", ")),
            data: Some(json!({"supported": all_versions(), "requested": requested})),
        }
    }

    /// The JSON-RPC error response text for request `id`.
    pub fn response(&self, id: Value) -> String {
        crate::mcp::jsonrpc::error_object(id, self.code, &self.message, self.data.clone()).to_string()
    }
}

/// Checks a modern request's version: the `_meta` one must be present and served. On HTTP the
/// header was checked against it first ([`check_headers`]).
///
/// # Errors
/// -32022 for a version Coffer does not serve (`data.supported` lists those it does), -32602
/// (as a [`Refusal`]) when `_meta` carries no version or no client capabilities.
pub fn check_version(meta: Option<&Meta>) -> Result<&Meta, Refusal> {
    match meta {
        None => Err(Refusal {
            code: crate::mcp::jsonrpc::INVALID_PARAMS,
            message: format!("Invalid params: a 2026-07-28 request carries params._meta[{META_VERSION:?}]"),
            data: None,
        }),
        Some(m) if !is_modern(&m.version) => Err(Refusal::unsupported(&m.version)),
        Some(m) if !m.has_capabilities => Err(Refusal {
            code: crate::mcp::jsonrpc::INVALID_PARAMS,
            message: format!(
                "Invalid params: a 2026-07-28 request carries params._meta[{META_CLIENT_CAPABILITIES:?}] (an object)"
            ),
            data: None,
        }),
        Some(m) => Ok(m),
    }
}

/// Decodes an `Mcp-Name`/`Mcp-Param-*` value: `=?base64?…?=` is the Base64 of the UTF-8 value
/// (basic/transports/streamable-http §Value Encoding); anything else is the value itself.
///
/// # Errors
/// A message naming the problem: bad Base64, not UTF-8.
pub fn decode_header_value(raw: &str) -> Result<String, String> {
    match raw.strip_prefix("=?base64?").and_then(|r| r.strip_suffix("?=")) {
        Some(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("its =?base64?…?= value is not Base64 ({e})"))?;
            String::from_utf8(bytes).map_err(|_| "its =?base64?…?= value is not UTF-8".to_owned())
        }
        None => Ok(raw.to_owned()),
    }
}

/// `params.name` (tools/call, prompts/get) or `params.uri` (resources/read) of a request.
fn target(method: &str, params: Option<&RawValue>) -> Option<String> {
    let key = if method == "resources/read" { "uri" } else { "name" };
    let p: Value = serde_json::from_str(params?.get()).ok()?;
    p.get(key)?.as_str().map(str::to_owned)
}

/// Streamable HTTP §Server Validation for a modern POST: `MCP-Protocol-Version` present and
/// equal to the `_meta` version (when the body carries one), `Mcp-Method` equal to `method`,
/// and for calls, reads and prompts `Mcp-Name` (Base64 sentinel decoded) equal to the body's
/// name or URI.
///
/// # Errors
/// -32020 naming the first header missing, malformed or disagreeing with the body.
pub fn check_headers(
    headers: &HeaderMap,
    method: &str,
    params: Option<&RawValue>,
    meta: Option<&Meta>,
) -> Result<(), Refusal> {
    let header = |name: &str| -> Result<Option<&str>, Refusal> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .map(Some)
                .map_err(|_| Refusal::mismatch(format!("Header mismatch: {name} holds characters a header may not"))),
        }
    };
    let version = header(crate::mcp::downstream::http::VERSION_HEADER)?
        .ok_or_else(|| Refusal::mismatch("Header mismatch: MCP-Protocol-Version is required on every POST"))?;
    match meta {
        // No version in the body: refused as invalid params by `check_version` (400 -32602).
        None => {}
        Some(meta) if meta.version != version => {
            return Err(Refusal::mismatch(format!(
                "Header mismatch: MCP-Protocol-Version {:?} does not match params._meta version {:?}",
                cut(version),
                cut(&meta.version)
            )));
        }
        Some(_) => {}
    }
    match header(METHOD_HEADER)? {
        None => return Err(Refusal::mismatch("Header mismatch: Mcp-Method is required on every POST")),
        Some(m) if m != method => {
            return Err(Refusal::mismatch(format!(
                "Header mismatch: Mcp-Method {:?} does not match body method {:?}",
                cut(m),
                cut(method)
            )));
        }
        Some(_) => {}
    }
    if is_call_like(method) {
        let Some(raw) = header(NAME_HEADER)? else {
            return Err(Refusal::mismatch(format!("Header mismatch: Mcp-Name is required on {method}")));
        };
        let name =
            decode_header_value(raw).map_err(|e| Refusal::mismatch(format!("Header mismatch: Mcp-Name: {e}")))?;
        let body = target(method, params).unwrap_or_default();
        if name != body {
            return Err(Refusal::mismatch(format!(
                "Header mismatch: Mcp-Name {:?} does not match body value {:?}",
                cut(&name),
                cut(&body)
            )));
        }
    }
    Ok(())
}

fn cut(s: &str) -> String {
    s.chars().take(100).collect()
}

/// Coffer's capabilities as a modern server: list changes reach `subscriptions/listen`;
/// there is no logging (deprecated, per-request in 2026-07-28) and no per-resource subscription.
pub fn capabilities() -> Value {
    json!({
        "tools": {"listChanged": true},
        "prompts": {"listChanged": true},
        "resources": {"listChanged": true},
        "completions": {}
    })
}

/// Coffer's identity, as `_meta[io.modelcontextprotocol/serverInfo]` carries it.
pub fn server_info() -> Value {
    json!({"name": "coffer", "title": "Coffer", "version": coffer_runtime::VERSION})
}

/// The `server/discover` result (server/discover §DiscoverResult): every version Coffer serves
/// (modern first), its capabilities and identity. Cacheable by anyone for an hour: it depends on
/// nothing but the build.
pub fn discover_result(instructions: &str) -> Value {
    json!({
        "resultType": "complete",
        "supportedVersions": all_versions(),
        "capabilities": capabilities(),
        "instructions": instructions,
        "_meta": {META_SERVER_INFO: server_info()},
        "ttlMs": 3_600_000,
        "cacheScope": "public"
    })
}

/// A modern result from a raw one: `resultType: "complete"` unless it says otherwise, Coffer's
/// `serverInfo` in `_meta`, and for lists and reads (`cacheable`) `ttlMs` (the gateway's own list
/// cache lifetime for lists; an upstream's value, else 0, for reads) and `cacheScope: "private"`
/// (what a list holds depends on the person's policy). A result that is not an object is
/// returned unchanged.
pub fn complete(result: &RawValue, method: &str) -> Box<RawValue> {
    let Ok(Value::Object(mut r)) = serde_json::from_str::<Value>(result.get()) else {
        return result.to_owned();
    };
    decorate(&mut r, method);
    RawValue::from_string(Value::Object(r).to_string()).expect("json")
}

fn decorate(r: &mut Map<String, Value>, method: &str) {
    r.entry("resultType").or_insert_with(|| json!("complete"));
    let meta = r.entry("_meta").or_insert_with(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.entry(META_SERVER_INFO).or_insert_with(server_info);
    }
    let ttl = match method {
        "tools/list" | "prompts/list" | "resources/list" | "resources/templates/list" => {
            Some(LIST_TTL.as_millis() as u64)
        }
        "resources/read" => Some(0),
        _ => None,
    };
    if let Some(ttl) = ttl {
        r.entry("ttlMs").or_insert_with(|| json!(ttl));
        r.insert("cacheScope".into(), json!("private"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn modern_params(name: &str) -> Box<RawValue> {
        raw(&json!({"name": name, "arguments": {}, "_meta": {META_VERSION: "2026-07-28", META_CLIENT_INFO: {"name": "c", "version": "1"}, META_CLIENT_CAPABILITIES: {}}}).to_string())
    }

    #[test]
    fn meta_is_read_from_params() {
        let p = modern_params("x");
        assert!(mentions_meta(Some(&p)));
        let m = meta(Some(&p)).unwrap();
        assert_eq!((m.version.as_str(), m.client_info["name"].as_str()), ("2026-07-28", Some("c")));
        assert_eq!(m.init_params()["capabilities"], json!({}));
        assert!(meta(Some(&raw(r#"{"name":"x"}"#))).is_none());
        assert!(meta(None).is_none());
        assert_eq!(check_version(None).unwrap_err().code, -32602);
        let old = Meta {
            version: "2099-01-01".into(),
            client_info: json!({}),
            capabilities: json!({}),
            has_capabilities: true,
        };
        let e = check_version(Some(&old)).unwrap_err();
        assert_eq!(e.code, UNSUPPORTED_VERSION);
        assert_eq!(e.data.unwrap()["supported"][0], "2026-07-28");
    }

    #[test]
    fn headers_must_agree_with_the_body() {
        let p = modern_params("srv__echo");
        let m = meta(Some(&p));
        let ok =
            headers(&[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", "srv__echo")]);
        assert_eq!(check_headers(&ok, "tools/call", Some(&p), m.as_ref()), Ok(()));
        let cases: [(&[(&'static str, &str)], &str); 6] = [
            (&[("mcp-method", "tools/call"), ("mcp-name", "srv__echo")], "MCP-Protocol-Version is required"),
            (
                &[("mcp-protocol-version", "2025-11-25"), ("mcp-method", "tools/call"), ("mcp-name", "srv__echo")],
                "does not match params._meta",
            ),
            (&[("mcp-protocol-version", "2026-07-28"), ("mcp-name", "srv__echo")], "Mcp-Method is required"),
            (
                &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/list"), ("mcp-name", "srv__echo")],
                "does not match body method",
            ),
            (&[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call")], "Mcp-Name is required"),
            (
                &[("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", "other")],
                "does not match body value",
            ),
        ];
        for (h, want) in cases {
            let e = check_headers(&headers(h), "tools/call", Some(&p), m.as_ref()).unwrap_err();
            assert_eq!(e.code, HEADER_MISMATCH);
            assert!(e.message.contains(want), "{} vs {want}", e.message);
        }
    }

    #[test]
    fn base64_sentinel_names_are_decoded_before_comparing() {
        assert_eq!(decode_header_value("=?base64?SGVsbG8sIOS4lueVjA==?=").unwrap(), "Hello, 世界");
        assert_eq!(decode_header_value("plain").unwrap(), "plain");
        assert!(decode_header_value("=?base64?***?=").unwrap_err().contains("not Base64"));
        assert!(decode_header_value("=?base64?/w==?=").unwrap_err().contains("UTF-8"));
        let p = modern_params("=?base64?literal?=");
        let m = meta(Some(&p));
        // A literal sentinel-looking name must itself be Base64-encoded by the client.
        let encoded = base64::engine::general_purpose::STANDARD.encode("=?base64?literal?=");
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", &format!("=?base64?{encoded}?=")),
        ]);
        assert_eq!(check_headers(&h, "tools/call", Some(&p), m.as_ref()), Ok(()));
        let h = headers(&[
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "=?base64?literal?="),
        ]);
        assert_eq!(check_headers(&h, "tools/call", Some(&p), m.as_ref()).unwrap_err().code, HEADER_MISMATCH);
    }

    #[test]
    fn results_get_result_type_and_cache_hints() {
        let r = complete(&raw(r#"{"tools":[]}"#), "tools/list");
        let v: Value = serde_json::from_str(r.get()).unwrap();
        assert_eq!(v["resultType"], "complete");
        assert_eq!((v["ttlMs"].clone(), v["cacheScope"].clone()), (json!(60000), json!("private")));
        assert_eq!(v["_meta"][META_SERVER_INFO]["name"], "coffer");
        let r = complete(&raw(r#"{"content":[],"resultType":"input_required"}"#), "tools/call");
        let v: Value = serde_json::from_str(r.get()).unwrap();
        assert_eq!(v["resultType"], "input_required");
        assert!(v.get("ttlMs").is_none());
        assert_eq!(complete(&raw("[1]"), "tools/call").get(), "[1]");
        let d = discover_result("hi");
        assert_eq!(d["supportedVersions"][0], "2026-07-28");
        assert!(d["supportedVersions"].as_array().unwrap().contains(&json!("2025-11-25")));
    }
}
