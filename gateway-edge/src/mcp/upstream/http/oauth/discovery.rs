//! Finding who issues tokens for an HTTP upstream (MCP 2025-11-25 basic/authorization
//! §Authorization Server Discovery): the `WWW-Authenticate` challenge of a `401` (RFC 6750 §3,
//! RFC 9728 §5.1 `resource_metadata`), the Protected Resource Metadata it points at or, without
//! one, the well-known URIs (RFC 9728 §3.1), then the authorization server's metadata (RFC 8414
//! §3, falling back to OpenID Connect Discovery 1.0 §4 in the order the MCP spec gives).
//!
//! Every URL fetched or later used for tokens must be `https://`, or `http://` on a loopback
//! host (a local authorization server, and the tests): tokens never travel in clear text off
//! the machine. Metadata documents are read up to [`MAX_METADATA`] bytes, redirects are not
//! followed.
use std::time::Duration;

use reqwest::Url;
use serde::Deserialize;

use super::OAuthError;

/// Longest metadata document read (bytes).
pub const MAX_METADATA: usize = 64 * 1024;
/// Longest wait for one metadata request.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The `Bearer` challenge of a `WWW-Authenticate` header (RFC 6750 §3): the parameters the MCP
/// client uses. Values are as sent (unquoted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Challenge {
    /// RFC 9728 §5.1: the URL of the resource's Protected Resource Metadata.
    pub resource_metadata: Option<String>,
    /// RFC 6750 §3: the scopes the resource needs, space-separated.
    pub scope: Option<String>,
    /// RFC 6750 §3.1: `invalid_token`, `insufficient_scope`, …
    pub error: Option<String>,
}

/// Parses the `Bearer` challenge among `values` (the `WWW-Authenticate` header lines, each of
/// which may hold several challenges): `None` when no challenge uses the `Bearer` scheme.
/// Malformed parameters are skipped; the parser never fails.
pub fn bearer_challenge<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Challenge> {
    for value in values {
        let mut found: Option<Challenge> = None;
        for item in split_challenges(value) {
            match item {
                Item::Scheme(s) => {
                    if found.is_some() {
                        break;
                    }
                    if s.eq_ignore_ascii_case("bearer") {
                        found = Some(Challenge::default());
                    }
                }
                Item::Param(k, v) => {
                    if let Some(c) = found.as_mut() {
                        match k.to_ascii_lowercase().as_str() {
                            "resource_metadata" => c.resource_metadata = Some(v),
                            "scope" => c.scope = Some(v),
                            "error" => c.error = Some(v),
                            _ => {}
                        }
                    }
                }
            }
        }
        if found.is_some() {
            return found;
        }
    }
    None
}

enum Item {
    Scheme(String),
    Param(String, String),
}

/// Tokenizes a `WWW-Authenticate` value (RFC 9110 §11.6.1): `scheme [token68 | param, …], …`.
fn split_challenges(value: &str) -> Vec<Item> {
    let b = value.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let is_tchar = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
    while i < b.len() {
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t' || b[i] == b',') {
            i += 1;
        }
        let start = i;
        while i < b.len() && is_tchar(b[i]) {
            i += 1;
        }
        if start == i {
            // Not a token: skip one byte so the loop always advances.
            i += 1;
            continue;
        }
        let token = &value[start..i];
        let mut j = i;
        while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
            j += 1;
        }
        if j < b.len() && b[j] == b'=' && b.get(j + 1) != Some(&b'=') {
            // An auth-param: token = token / quoted-string.
            j += 1;
            while j < b.len() && (b[j] == b' ' || b[j] == b'\t') {
                j += 1;
            }
            let mut v = String::new();
            if j < b.len() && b[j] == b'"' {
                j += 1;
                while j < b.len() && b[j] != b'"' {
                    if b[j] == b'\\' && j + 1 < b.len() {
                        j += 1;
                    }
                    v.push(b[j] as char);
                    j += 1;
                }
                j += 1;
            } else {
                let s = j;
                while j < b.len() && b[j] != b',' && b[j] != b' ' {
                    j += 1;
                }
                v.push_str(&value[s..j]);
            }
            out.push(Item::Param(token.to_owned(), v));
            i = j;
        } else {
            // A scheme name; a token68 after it (`Basic abc==`) is read as a scheme and ignored.
            while j < b.len() && b[j] == b'=' {
                j += 1;
            }
            out.push(Item::Scheme(token.to_owned()));
            i = j;
        }
    }
    out
}

/// Protected Resource Metadata (RFC 9728 §2), the fields the client uses.
#[derive(Debug, Clone, Deserialize)]
pub struct ResourceMetadata {
    /// The resource identifier; must name the MCP server the client asked (RFC 9728 §3.3).
    pub resource: String,
    #[serde(default)]
    pub authorization_servers: Vec<String>,
    #[serde(default)]
    pub scopes_supported: Vec<String>,
}

/// Authorization Server Metadata (RFC 8414 §2; OpenID Connect Discovery names the same fields),
/// the fields the client uses.
#[derive(Debug, Clone, Deserialize)]
pub struct ServerMetadata {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    #[serde(default)]
    pub registration_endpoint: Option<String>,
    #[serde(default)]
    pub code_challenge_methods_supported: Vec<String>,
    #[serde(default)]
    pub scopes_supported: Vec<String>,
    /// draft-ietf-oauth-client-id-metadata-document: the server accepts an `https://` URL as
    /// `client_id` and fetches the client's metadata there.
    #[serde(default)]
    pub client_id_metadata_document_supported: bool,
}

/// Checks that `raw` is a URL tokens may travel to: `https://`, or `http://` to a loopback
/// host; no fragment. `what` names it in the error.
///
/// # Errors
/// [`OAuthError::Discovery`] naming `what` and the problem.
pub fn safe_url(raw: &str, what: &str) -> Result<Url, OAuthError> {
    let url = Url::parse(raw.trim()).map_err(|e| OAuthError::Discovery(format!("{what} is not a valid URL: {e}")))?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(&url) => {}
        "http" => {
            return Err(OAuthError::Discovery(format!(
                "{what} {} uses http:// off this machine; OAuth needs https://",
                shown(&url)
            )));
        }
        other => return Err(OAuthError::Discovery(format!("{what} has scheme {other:?}; OAuth needs https://"))),
    }
    if url.fragment().is_some() {
        return Err(OAuthError::Discovery(format!("{what} {} has a fragment", shown(&url))));
    }
    Ok(url)
}

/// Whether `url`'s host is `localhost`, 127.0.0.0/8 or `::1`.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// `url` without user info, query or fragment: the only form shown.
pub fn shown(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// The canonical resource identifier of an MCP server URL (RFC 8707 §2, MCP 2025-11-25
/// §Canonical Server URI): scheme and host lowercase (the URL parser does that), no fragment,
/// no query, no trailing `/` (the form RFC 8707's examples and the MCP spec use).
pub fn canonical_resource(url: &Url) -> String {
    let mut u = url.clone();
    u.set_fragment(None);
    u.set_query(None);
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string().trim_end_matches('/').to_owned()
}

/// Whether the PRM's `resource` names the server at `server_url`: the same canonical URI, or a
/// prefix of it at a path-segment boundary (a resource that covers several endpoints, as the
/// MCP spec allows: "the resource server's … identifier").
pub fn resource_covers(resource: &str, server_url: &Url) -> bool {
    let Ok(r) = Url::parse(resource) else { return false };
    let want = canonical_resource(server_url);
    let have = canonical_resource(&r);
    want == have || (want.starts_with(&have) && want.as_bytes().get(have.len()) == Some(&b'/'))
}

/// The well-known PRM URIs for `server_url` (RFC 9728 §3.1), most specific first: with the
/// path inserted after `/.well-known/oauth-protected-resource`, then at the root.
pub fn resource_metadata_uris(server_url: &Url) -> Vec<Url> {
    well_known(server_url, "oauth-protected-resource", false)
}

/// The metadata URIs of an authorization server `issuer` in the order of MCP 2025-11-25
/// §Authorization Server Metadata Discovery: with a path, RFC 8414 path insertion, OpenID path
/// insertion, OpenID path appending; without, RFC 8414 then OpenID at the root.
pub fn server_metadata_uris(issuer: &Url) -> Vec<Url> {
    let path = issuer.path().trim_end_matches('/');
    let mut base = issuer.clone();
    base.set_query(None);
    base.set_fragment(None);
    let mut out = Vec::new();
    if path.is_empty() {
        for name in ["oauth-authorization-server", "openid-configuration"] {
            let mut u = base.clone();
            u.set_path(&format!("/.well-known/{name}"));
            out.push(u);
        }
    } else {
        for p in [
            format!("/.well-known/oauth-authorization-server{path}"),
            format!("/.well-known/openid-configuration{path}"),
            format!("{path}/.well-known/openid-configuration"),
        ] {
            let mut u = base.clone();
            u.set_path(&p);
            out.push(u);
        }
    }
    out
}

fn well_known(url: &Url, name: &str, root_only: bool) -> Vec<Url> {
    let mut base = url.clone();
    base.set_query(None);
    base.set_fragment(None);
    let path = url.path().trim_end_matches('/');
    let mut out = Vec::new();
    if !root_only && !path.is_empty() {
        let mut u = base.clone();
        u.set_path(&format!("/.well-known/{name}{path}"));
        out.push(u);
    }
    let mut u = base;
    u.set_path(&format!("/.well-known/{name}"));
    out.push(u);
    out
}

/// Fetches a JSON metadata document: `Ok(None)` for a 404 (or 4xx: try the next URI), the
/// document for a 200.
///
/// # Errors
/// [`OAuthError::Discovery`] when it is unreachable, answers 5xx, is larger than
/// [`MAX_METADATA`] or is not the JSON object expected.
pub async fn fetch_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &Url,
    what: &str,
) -> Result<Option<T>, OAuthError> {
    let resp = tokio::time::timeout(FETCH_TIMEOUT, http.get(url.clone()).header("accept", "application/json").send())
        .await
        .map_err(|_| OAuthError::Discovery(format!("{what} at {} did not answer in time", shown(url))))?
        .map_err(|e| OAuthError::Discovery(format!("{what} at {} is unreachable: {}", shown(url), describe(e))))?;
    let status = resp.status();
    if status.is_client_error() {
        return Ok(None);
    }
    if !status.is_success() {
        return Err(OAuthError::Discovery(format!("{what} at {} answered HTTP {status}", shown(url))));
    }
    let body = read_limited(resp, MAX_METADATA)
        .await
        .map_err(|why| OAuthError::Discovery(format!("{what} at {}: {why}", shown(url))))?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| OAuthError::Discovery(format!("{what} at {} is not valid metadata: {e}", shown(url))))
}

/// The Protected Resource Metadata of the MCP server at `server_url`: from the challenge's
/// `resource_metadata` URL when there is one, else from the well-known URIs. Its `resource`
/// must cover `server_url` ([`resource_covers`]) and it must name an authorization server.
///
/// # Errors
/// [`OAuthError::Discovery`] when no document is found, or it is for another resource, or it
/// names no authorization server.
pub async fn resource_metadata(
    http: &reqwest::Client,
    server_url: &Url,
    challenge: Option<&Challenge>,
) -> Result<ResourceMetadata, OAuthError> {
    let uris = match challenge.and_then(|c| c.resource_metadata.as_deref()) {
        Some(u) => vec![safe_url(u, "the resource_metadata URL of the server's challenge")?],
        None => resource_metadata_uris(server_url),
    };
    let mut found = None;
    for uri in &uris {
        if let Some(doc) = fetch_json::<ResourceMetadata>(http, uri, "protected resource metadata").await? {
            found = Some(doc);
            break;
        }
    }
    let Some(doc) = found else {
        return Err(OAuthError::Discovery(format!(
            "no protected resource metadata (RFC 9728) at {}: the server does not offer an MCP OAuth sign-in; \
             if it takes an API token, give it as a header (`coffer mcp edit NAME --header-credential 'Authorization:CREDENTIAL'`)",
            uris.iter().map(shown).collect::<Vec<_>>().join(" or ")
        )));
    };
    if !resource_covers(&doc.resource, server_url) {
        return Err(OAuthError::Discovery(format!(
            "the protected resource metadata is for {:?}, not for {} (RFC 9728 §3.3: refused)",
            truncate(&doc.resource, 120),
            shown(server_url)
        )));
    }
    if doc.authorization_servers.is_empty() {
        return Err(OAuthError::Discovery("the protected resource metadata names no authorization server".into()));
    }
    Ok(doc)
}

/// The metadata of authorization server `issuer` (RFC 8414 or OpenID discovery, see
/// [`server_metadata_uris`]). Its `issuer` must equal the one asked for (RFC 8414 §3.3), its
/// endpoints must be safe URLs, and it must offer PKCE with `S256` (MCP 2025-11-25: a client
/// refuses a server that does not say so).
///
/// # Errors
/// [`OAuthError::Discovery`] naming what is missing or wrong.
pub async fn server_metadata(http: &reqwest::Client, issuer: &str) -> Result<ServerMetadata, OAuthError> {
    let issuer_url = safe_url(issuer, "the authorization server")?;
    let uris = server_metadata_uris(&issuer_url);
    let mut found = None;
    for uri in &uris {
        if let Some(doc) = fetch_json::<ServerMetadata>(http, uri, "authorization server metadata").await? {
            found = Some(doc);
            break;
        }
    }
    let Some(doc) = found else {
        return Err(OAuthError::Discovery(format!(
            "no authorization server metadata (RFC 8414 or OpenID discovery) at {}",
            uris.iter().map(shown).collect::<Vec<_>>().join(" or ")
        )));
    };
    if doc.issuer.trim_end_matches('/') != issuer.trim().trim_end_matches('/') {
        return Err(OAuthError::Discovery(format!(
            "the authorization server metadata names issuer {:?}, not {:?} (RFC 8414 §3.3: refused)",
            truncate(&doc.issuer, 120),
            truncate(issuer, 120)
        )));
    }
    safe_url(&doc.authorization_endpoint, "the authorization endpoint")?;
    safe_url(&doc.token_endpoint, "the token endpoint")?;
    if let Some(r) = &doc.registration_endpoint {
        safe_url(r, "the registration endpoint")?;
    }
    if !doc.code_challenge_methods_supported.iter().any(|m| m == "S256") {
        return Err(OAuthError::Discovery(
            "the authorization server does not offer PKCE with S256 (code_challenge_methods_supported), which MCP requires"
                .into(),
        ));
    }
    Ok(doc)
}

/// Reads a body of at most `limit` bytes.
pub(super) async fn read_limited(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(describe)? {
        if body.len() + chunk.len() > limit {
            return Err(format!("the answer is larger than {limit} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reqwest error without its URL, with its root cause.
pub(super) fn describe(err: reqwest::Error) -> String {
    let err = err.without_url();
    let mut out = err.to_string();
    let mut source = std::error::Error::source(&err);
    let mut root = None;
    while let Some(s) = source {
        root = Some(s.to_string());
        source = s.source();
    }
    if let Some(root) = root
        && !out.contains(&root)
    {
        out = format!("{out}: {root}");
    }
    out
}

pub(super) fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_parsed() {
        let c = bearer_challenge([
            r#"Bearer error="invalid_token", error_description="The access token expired", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource", scope="files:read files:write""#,
        ])
        .unwrap();
        assert_eq!(c.error.as_deref(), Some("invalid_token"));
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("https://mcp.example.com/.well-known/oauth-protected-resource")
        );
        assert_eq!(c.scope.as_deref(), Some("files:read files:write"));
        // Another scheme first, a token68, case and spacing.
        let c = bearer_challenge([r#"Basic abc==, bearer   Resource_Metadata = "http://x/y" , realm=mcp"#]).unwrap();
        assert_eq!(c.resource_metadata.as_deref(), Some("http://x/y"));
        // The second header line holds the Bearer challenge.
        let c = bearer_challenge(["Basic realm=\"a\"", "Bearer"]).unwrap();
        assert_eq!(c, Challenge::default());
        assert!(bearer_challenge(["Basic realm=\"x\""]).is_none());
        assert!(bearer_challenge([""]).is_none());
        // Hostile input: unterminated quotes, stray bytes, a huge value: no panic.
        for bad in ["Bearer x=\"", "Bearer ===", "\"\"\",,,=", "Bearer a=\\", &"Bearer ".repeat(10_000)] {
            let _ = bearer_challenge([bad]);
        }
    }

    #[test]
    fn well_known_uris() {
        let u = Url::parse("https://mcp.example.com/public/mcp").unwrap();
        let got: Vec<String> = resource_metadata_uris(&u).iter().map(Url::to_string).collect();
        assert_eq!(
            got,
            [
                "https://mcp.example.com/.well-known/oauth-protected-resource/public/mcp",
                "https://mcp.example.com/.well-known/oauth-protected-resource"
            ]
        );
        let i = Url::parse("https://auth.example.com/tenant1").unwrap();
        let got: Vec<String> = server_metadata_uris(&i).iter().map(Url::to_string).collect();
        assert_eq!(
            got,
            [
                "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
                "https://auth.example.com/.well-known/openid-configuration/tenant1",
                "https://auth.example.com/tenant1/.well-known/openid-configuration"
            ]
        );
        let i = Url::parse("https://auth.example.com").unwrap();
        let got: Vec<String> = server_metadata_uris(&i).iter().map(Url::to_string).collect();
        assert_eq!(
            got,
            [
                "https://auth.example.com/.well-known/oauth-authorization-server",
                "https://auth.example.com/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn resources_and_urls() {
        let server = Url::parse("https://MCP.example.com/mcp").unwrap();
        assert_eq!(canonical_resource(&server), "https://mcp.example.com/mcp");
        assert!(resource_covers("https://mcp.example.com/mcp", &server));
        assert!(resource_covers("https://mcp.example.com/mcp/", &server));
        assert!(resource_covers("https://mcp.example.com", &server));
        assert!(!resource_covers("https://mcp.example.com/mc", &server));
        assert!(!resource_covers("https://evil.example.com/mcp", &server));
        assert!(!resource_covers("not a url", &server));
        assert!(safe_url("https://a.example/x", "x").is_ok());
        assert!(safe_url("http://127.0.0.1:9/x", "x").is_ok());
        assert!(safe_url("http://localhost/x", "x").is_ok());
        assert!(safe_url("http://[::1]/x", "x").is_ok());
        let e = safe_url("http://a.example/x", "the token endpoint").unwrap_err().to_string();
        assert!(e.contains("the token endpoint") && e.contains("https://"), "{e}");
        assert!(safe_url("ftp://a.example/x", "x").is_err());
        assert!(safe_url("https://a.example/x#f", "x").is_err());
    }
}
