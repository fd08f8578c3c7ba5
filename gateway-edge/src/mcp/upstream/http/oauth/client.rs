//! The OAuth 2.1 client's requests (draft-ietf-oauth-v2-1-13): PKCE (RFC 7636, `S256` only),
//! the authorization request with the `resource` indicator (RFC 8707 §2.1), Dynamic Client
//! Registration (RFC 7591 §3), and the token endpoint's `authorization_code` and
//! `refresh_token` grants (OAuth 2.1 §3.2, §4.1.3, §4.3) with their error answers (§3.2.4).
//!
//! Secrets (the PKCE verifier, client secret, codes, tokens) are [`SecretString`]s: they are
//! never formatted into a message. Error descriptions quoted from a server are cut to
//! [`DESCRIPTION_CHARS`] characters and have any secret sent in the request removed.
use std::time::Duration;

use base64::Engine as _;
use reqwest::{StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::OAuthError;
use super::discovery::{describe, read_limited, shown, truncate};

/// Longest token or registration answer read (bytes).
const MAX_ANSWER: usize = 64 * 1024;
/// Longest wait for a token or registration request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Characters of a server's `error_description` quoted.
pub const DESCRIPTION_CHARS: usize = 200;
/// The client name Coffer registers under.
pub const CLIENT_NAME: &str = "Coffer";

/// A PKCE pair (RFC 7636 §4.1-4.2): a 64-character verifier from the OS CSPRNG (256 bits) and
/// its `S256` challenge, `BASE64URL(SHA256(verifier))` without padding.
pub struct Pkce {
    pub verifier: SecretString,
    pub challenge: String,
}

impl Pkce {
    /// A fresh pair.
    pub fn new() -> Self {
        let verifier = coffer_runtime::token::random_token();
        let challenge = s256(verifier.expose_secret());
        Self { verifier, challenge }
    }
}

impl Default for Pkce {
    fn default() -> Self {
        Self::new()
    }
}

/// `BASE64URL-ENCODE(SHA256(ASCII(verifier)))` (RFC 7636 §4.2).
pub fn s256(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// How the client authenticates at the token endpoint (RFC 7591 §2
/// `token_endpoint_auth_method`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// A public client: `client_id` in the body, no secret (PKCE protects the code).
    #[default]
    None,
    /// `client_id` and `client_secret` in the body.
    ClientSecretPost,
    /// HTTP Basic with the URL-encoded id and secret (OAuth 2.1 §2.4.1).
    ClientSecretBasic,
}

/// A client known to the authorization server.
#[derive(Clone)]
pub struct Client {
    pub client_id: String,
    pub client_secret: Option<SecretString>,
    pub auth: ClientAuth,
}

/// Registers Coffer with `registration_endpoint` (RFC 7591 §3.1) as a public native client
/// (`token_endpoint_auth_method: none`) with one loopback `redirect_uri`, the
/// `authorization_code` and `refresh_token` grants and, when given, `scope`.
///
/// # Errors
/// [`OAuthError::Registration`] with the server's `error` and description (RFC 7591 §3.2.2) or
/// why no answer could be used.
pub async fn register(
    http: &reqwest::Client,
    registration_endpoint: &Url,
    redirect_uri: &str,
    scope: Option<&str>,
) -> Result<Client, OAuthError> {
    let mut body = serde_json::json!({
        "client_name": CLIENT_NAME,
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    });
    if let Some(s) = scope {
        body["scope"] = s.into();
    }
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, http.post(registration_endpoint.clone()).json(&body).send())
        .await
        .map_err(|_| OAuthError::Registration("the registration endpoint did not answer in time".into()))?
        .map_err(|e| {
            OAuthError::Registration(format!("{} is unreachable: {}", shown(registration_endpoint), describe(e)))
        })?;
    let status = resp.status();
    let body = read_limited(resp, MAX_ANSWER).await.map_err(OAuthError::Registration)?;
    if !status.is_success() {
        return Err(OAuthError::Registration(format!("HTTP {status}: {}", error_text(&body, &[]))));
    }
    #[derive(Deserialize)]
    struct Registered {
        client_id: String,
        #[serde(default)]
        client_secret: Option<String>,
        #[serde(default)]
        token_endpoint_auth_method: Option<String>,
    }
    let r: Registered = serde_json::from_slice(&body)
        .map_err(|e| OAuthError::Registration(format!("the answer is not a client registration: {e}")))?;
    if r.client_id.is_empty() {
        return Err(OAuthError::Registration("the answer has an empty client_id".into()));
    }
    let auth = match (r.token_endpoint_auth_method.as_deref(), &r.client_secret) {
        (Some("client_secret_basic"), Some(_)) => ClientAuth::ClientSecretBasic,
        (Some("none"), _) | (_, None) => ClientAuth::None,
        // A server that insists on a secret gets it in the body (`client_secret_post`, also
        // RFC 7591's default when it issued a secret without naming a method).
        (_, Some(_)) => ClientAuth::ClientSecretPost,
    };
    Ok(Client { client_id: r.client_id, client_secret: r.client_secret.map(SecretString::from), auth })
}

/// The authorization request URL (OAuth 2.1 §4.1.1, RFC 7636 §4.3, RFC 8707 §2.1): `endpoint`
/// with `response_type=code`, `client_id`, `redirect_uri`, `code_challenge` (`S256`), `state`,
/// `resource` and, when given, `scope`; parameters the endpoint URL already has are kept.
pub fn authorization_url(
    endpoint: &Url,
    client_id: &str,
    redirect_uri: &str,
    pkce: &Pkce,
    state: &str,
    scope: Option<&str>,
    resource: &str,
) -> Url {
    let mut url = endpoint.clone();
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("code_challenge", &pkce.challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("state", state)
            .append_pair("resource", resource);
        if let Some(s) = scope.filter(|s| !s.is_empty()) {
            q.append_pair("scope", s);
        }
    }
    url
}

/// A successful token answer (OAuth 2.1 §3.2.3).
pub struct Tokens {
    pub access_token: SecretString,
    pub refresh_token: Option<SecretString>,
    /// Lifetime of the access token in seconds, when the server says.
    pub expires_in: Option<u64>,
    pub scope: Option<String>,
}

/// Why a token request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// The server refused the grant (OAuth 2.1 §3.2.4: `invalid_grant` for a bad, expired,
    /// revoked or PKCE-mismatched code or refresh token, `invalid_client`, …): signing in again
    /// is the way out.
    #[error("the token endpoint refused: {0}")]
    Refused(String),
    /// No usable answer (unreachable, 5xx, not a token answer): may pass.
    #[error("the token endpoint failed: {0}")]
    Unavailable(String),
}

/// Exchanges an authorization `code` (OAuth 2.1 §4.1.3) with the PKCE `verifier`, the
/// `redirect_uri` the code was issued for and the `resource` (RFC 8707 §2.2).
///
/// # Errors
/// [`TokenError`].
pub async fn exchange_code(
    http: &reqwest::Client,
    token_endpoint: &Url,
    client: &Client,
    code: &SecretString,
    verifier: &SecretString,
    redirect_uri: &str,
    resource: &str,
) -> Result<Tokens, TokenError> {
    let form = vec![
        ("grant_type", "authorization_code".to_owned()),
        ("code", code.expose_secret().to_owned()),
        ("redirect_uri", redirect_uri.to_owned()),
        ("code_verifier", verifier.expose_secret().to_owned()),
        ("resource", resource.to_owned()),
    ];
    token_request(http, token_endpoint, client, form, &[code, verifier]).await
}

/// Refreshes with `refresh_token` (OAuth 2.1 §4.3), asking for the same `resource` (RFC 8707
/// §2.2) and, when given, `scope`.
///
/// # Errors
/// [`TokenError`].
pub async fn refresh(
    http: &reqwest::Client,
    token_endpoint: &Url,
    client: &Client,
    refresh_token: &SecretString,
    resource: &str,
    scope: Option<&str>,
) -> Result<Tokens, TokenError> {
    let mut form = vec![
        ("grant_type", "refresh_token".to_owned()),
        ("refresh_token", refresh_token.expose_secret().to_owned()),
        ("resource", resource.to_owned()),
    ];
    if let Some(s) = scope.filter(|s| !s.is_empty()) {
        form.push(("scope", s.to_owned()));
    }
    token_request(http, token_endpoint, client, form, &[refresh_token]).await
}

async fn token_request(
    http: &reqwest::Client,
    token_endpoint: &Url,
    client: &Client,
    mut form: Vec<(&'static str, String)>,
    sent: &[&SecretString],
) -> Result<Tokens, TokenError> {
    let mut rb = http.post(token_endpoint.clone()).header("accept", "application/json");
    let mut secrets: Vec<&SecretString> = sent.to_vec();
    match (client.auth, &client.client_secret) {
        (ClientAuth::ClientSecretBasic, Some(secret)) => {
            // OAuth 2.1 §2.4.1: both parts form-URL-encoded before Basic.
            let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let raw = format!("{}:{}", enc(&client.client_id), enc(secret.expose_secret()));
            let mut v = reqwest::header::HeaderValue::from_str(&format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(raw)
            ))
            .map_err(|_| TokenError::Unavailable("the client credentials cannot be sent in a header".into()))?;
            v.set_sensitive(true);
            rb = rb.header(reqwest::header::AUTHORIZATION, v);
            secrets.push(secret);
        }
        (ClientAuth::ClientSecretPost, Some(secret)) => {
            form.push(("client_id", client.client_id.clone()));
            form.push(("client_secret", secret.expose_secret().to_owned()));
            secrets.push(secret);
        }
        _ => form.push(("client_id", client.client_id.clone())),
    }
    // application/x-www-form-urlencoded (OAuth 2.1 §3.2.2), built here: reqwest's `form`
    // feature is off in the workspace.
    let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form.iter()).finish();
    let rb = rb.header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded").body(body);
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, rb.send())
        .await
        .map_err(|_| TokenError::Unavailable(format!("{} did not answer in time", shown(token_endpoint))))?
        .map_err(|e| TokenError::Unavailable(format!("{} is unreachable: {}", shown(token_endpoint), describe(e))))?;
    let status = resp.status();
    let body = read_limited(resp, MAX_ANSWER).await.map_err(TokenError::Unavailable)?;
    let secrets: Vec<&str> = secrets.iter().map(|s| s.expose_secret()).collect();
    if matches!(status, StatusCode::BAD_REQUEST | StatusCode::UNAUTHORIZED) {
        return Err(TokenError::Refused(error_text(&body, &secrets)));
    }
    if !status.is_success() {
        return Err(TokenError::Unavailable(format!("HTTP {status}: {}", error_text(&body, &secrets))));
    }
    #[derive(Deserialize)]
    struct Answer {
        access_token: String,
        token_type: String,
        #[serde(default)]
        expires_in: Option<serde_json::Value>,
        #[serde(default)]
        refresh_token: Option<String>,
        #[serde(default)]
        scope: Option<String>,
    }
    let a: Answer = serde_json::from_slice(&body).map_err(|e| {
        // serde's message names the field, never a value of it.
        TokenError::Unavailable(format!("the answer is not a token response: {}", e.classify_name()))
    })?;
    if !a.token_type.eq_ignore_ascii_case("bearer") {
        return Err(TokenError::Unavailable(format!(
            "the token type is {:?}; only Bearer tokens are supported",
            truncate(&a.token_type, 40)
        )));
    }
    if a.access_token.is_empty() {
        return Err(TokenError::Unavailable("the answer has an empty access_token".into()));
    }
    // Some servers send the lifetime as a string.
    let expires_in = match a.expires_in {
        Some(serde_json::Value::Number(n)) => n.as_u64(),
        Some(serde_json::Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    };
    Ok(Tokens {
        access_token: SecretString::from(a.access_token),
        refresh_token: a.refresh_token.filter(|r| !r.is_empty()).map(SecretString::from),
        expires_in,
        scope: a.scope,
    })
}

trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => "not JSON",
            serde_json::error::Category::Data => "a field is missing or of the wrong type",
        }
    }
}

/// `error: error_description` of an OAuth error body (RFC 6749 §5.2 shape), else a short quote
/// of the body; any of `secrets` replaced, at most [`DESCRIPTION_CHARS`] characters.
pub fn error_text(body: &[u8], secrets: &[&str]) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
        #[serde(default)]
        error_description: Option<String>,
    }
    let mut text = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => match e.error_description.filter(|d| !d.is_empty()) {
            Some(d) => format!("{}: {d}", e.error),
            None => e.error,
        },
        Err(_) => {
            let t = String::from_utf8_lossy(body);
            let t = t.split_whitespace().collect::<Vec<_>>().join(" ");
            if t.is_empty() { "(empty body)".into() } else { t }
        }
    };
    for s in secrets.iter().filter(|s| s.len() >= 4) {
        if text.contains(*s) {
            text = text.replace(*s, "[REDACTED]");
        }
    }
    let text: String = text.chars().filter(|c| !c.is_control()).collect();
    truncate(&text, DESCRIPTION_CHARS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_s256_matches_rfc7636_appendix_b() {
        assert_eq!(s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        let p = Pkce::new();
        assert_eq!(p.verifier.expose_secret().len(), 64);
        assert_eq!(p.challenge, s256(p.verifier.expose_secret()));
        assert_ne!(p.verifier.expose_secret(), Pkce::new().verifier.expose_secret());
    }

    #[test]
    fn authorization_url_has_every_parameter() {
        let p = Pkce { verifier: SecretString::from("v"), challenge: "c".into() };
        let u = authorization_url(
            &Url::parse("https://as.example/authorize?tenant=a").unwrap(),
            "client 1",
            "http://127.0.0.1:5000/callback",
            &p,
            "st",
            Some("read write"),
            "https://mcp.example/mcp",
        );
        let q: std::collections::HashMap<String, String> = u.query_pairs().into_owned().collect();
        assert_eq!(q["tenant"], "a");
        assert_eq!(q["response_type"], "code");
        assert_eq!(q["client_id"], "client 1");
        assert_eq!(q["redirect_uri"], "http://127.0.0.1:5000/callback");
        assert_eq!(q["code_challenge"], "c");
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["state"], "st");
        assert_eq!(q["scope"], "read write");
        assert_eq!(q["resource"], "https://mcp.example/mcp");
        assert!(!u.as_str().contains("verifier"));
    }

    #[test]
    fn error_bodies_are_quoted_without_secrets() {
        let b = br#"{"error":"invalid_grant","error_description":"refresh token rt-secret-123 was revoked"}"#;
        assert_eq!(error_text(b, &["rt-secret-123"]), "invalid_grant: refresh token [REDACTED] was revoked");
        assert_eq!(error_text(b"<html>\n oops \n</html>", &[]), "<html> oops </html>");
        assert_eq!(error_text(b"", &[]), "(empty body)");
        assert!(error_text(&vec![b'x'; 10_000], &[]).chars().count() <= DESCRIPTION_CHARS + 1);
    }
}
