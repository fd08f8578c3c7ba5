//! The web console at `/ui`: static assets embedded in this binary, the one-time login that
//! turns a code printed by `coffer ui` into a session cookie, and the security headers every
//! page response carries.
//!
//! Routes (all `GET` ones need no authentication: the page holds no data; every piece of data
//! it shows comes from `/v1/*`, which needs the cookie or the token):
//! - `GET /ui`, `GET /ui/{page}` → the single page (`index.html`); the client-side router picks
//!   the page from the path.
//! - `GET /ui/assets/{file…}` → an embedded asset, with `ETag` (content hash) and
//!   `Cache-Control: no-cache` (revalidated, so an upgraded daemon never serves stale code).
//! - `GET /ui/login?code=C` → when `C` is a live one-time code: consumes it, sets the
//!   `coffer_session` cookie (`HttpOnly; SameSite=Strict; Path=/`) and redirects (303) to
//!   `/ui/chat`; otherwise 401 with a page that says what to do.
//! - `POST /v1/ui/login-codes` (token only) → `{code, url, expires_in_s}`.
//! - `DELETE /v1/ui/sessions` → `{revoked}`: ends every web session.
//! - `GET /v1/ui/session` → `{via}`: whether the caller is signed in, and how.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use secrecy::ExposeSecret;
use serde_json::json;

use crate::error::ApiError;
use crate::state::AppState;

/// How long a one-time login code stays valid.
pub const LOGIN_CODE_TTL: Duration = Duration::from_secs(60);

/// The content security policy of every `/ui` response: nothing but this origin, no inline
/// script or style, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; \
frame-ancestors 'none'";

/// One embedded asset: its path under `/ui/assets/`, content type and bytes.
struct Asset {
    path: &'static str,
    mime: &'static str,
    body: &'static [u8],
}

macro_rules! assets {
    ($($path:literal => $mime:literal),* $(,)?) => {
        &[$(Asset { path: $path, mime: $mime, body: include_bytes!(concat!("../ui/", $path)) }),*]
    };
}

/// Every file of `gateway-edge/ui/` but `index.html` (a test checks that none is missing).
static ASSETS: &[Asset] = assets![
    "app.css" => "text/css; charset=utf-8",
    "js/app.js" => "text/javascript; charset=utf-8",
    "js/api.js" => "text/javascript; charset=utf-8",
    "js/dom.js" => "text/javascript; charset=utf-8",
    "js/pages/chat.js" => "text/javascript; charset=utf-8",
    "js/pages/servers.js" => "text/javascript; charset=utf-8",
    "js/pages/tools.js" => "text/javascript; charset=utf-8",
    "js/pages/activity.js" => "text/javascript; charset=utf-8",
    "js/pages/knowledge.js" => "text/javascript; charset=utf-8",
    "js/pages/settings.js" => "text/javascript; charset=utf-8",
    "js/vault/common.js" => "text/javascript; charset=utf-8",
    "js/vault/serverform.js" => "text/javascript; charset=utf-8",
    "favicon.svg" => "image/svg+xml",
];

static INDEX: &[u8] = include_bytes!("../ui/index.html");

/// The pages the client-side router knows (`/ui/{page}` serves the same document).
pub const PAGES: &[&str] = &["chat", "servers", "tools", "activity", "knowledge", "settings"];

/// Live one-time login codes (value → when it was minted). Few at a time; each lookup
/// compares against every live code in constant time.
#[derive(Default)]
pub struct LoginCodes(Mutex<HashMap<String, Instant>>);

impl LoginCodes {
    /// Mints a code valid for [`LOGIN_CODE_TTL`].
    pub fn mint(&self) -> String {
        let code = coffer_runtime::token::random_token().expose_secret().to_owned();
        let mut m = self.0.lock().expect("login codes");
        m.retain(|_, at| at.elapsed() < LOGIN_CODE_TTL);
        m.insert(code.clone(), Instant::now());
        code
    }

    /// Consumes `presented` when it is a live code: true once, false ever after.
    pub fn redeem(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        let mut m = self.0.lock().expect("login codes");
        m.retain(|_, at| at.elapsed() < LOGIN_CODE_TTL);
        let hit = m.keys().find(|k| k.len() == presented.len() && bool::from(k.as_bytes().ct_eq(presented.as_bytes())));
        match hit.cloned() {
            Some(k) => {
                m.remove(&k);
                true
            }
            None => false,
        }
    }
}

/// `/ui` routes and the `/v1/ui/*` REST routes behind them.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/ui", get(index))
        .route("/ui/", get(index))
        .route("/ui/login", get(login))
        .route("/ui/assets/{*file}", get(asset))
        .route("/ui/{page}", get(page))
        .route("/v1/ui/login-codes", post(mint_code))
        .route("/v1/ui/sessions", axum::routing::delete(logout_all))
        .route("/v1/ui/session", get(whoami))
}

/// Headers every `/ui` response carries.
fn secure(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    h.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    resp
}

fn html(status: StatusCode, body: impl Into<axum::body::Body>) -> Response {
    let mut r = (status, body.into()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    secure(r)
}

async fn index() -> Response {
    html(StatusCode::OK, INDEX)
}

async fn page(Path(page): Path<String>) -> Response {
    if PAGES.contains(&page.as_str()) {
        return html(StatusCode::OK, INDEX);
    }
    secure(
        ApiError::not_found(format!("no page {:?} in the web console", page.chars().take(40).collect::<String>()))
            .into_response(),
    )
}

async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.path == file) else {
        return secure(ApiError::not_found("no such asset").into_response());
    };
    let etag = format!("\"{}\"", &hex::encode(<sha2::Sha256 as sha2::Digest>::digest(a.body))[..16]);
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        return secure(StatusCode::NOT_MODIFIED.into_response());
    }
    let mut r = a.body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.mime));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex etag"));
    secure(r)
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    code: Option<String>,
}

/// The page shown when a login link cannot be used.
const LOGIN_REFUSED: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>Coffer — login link not valid</title>\
<link rel=\"stylesheet\" href=\"/ui/assets/app.css\"></head><body class=\"standalone\"><main class=\"notice\">\
<h1>This login link is not valid</h1><p>Login links work once and expire after 60 seconds. \
Run <code>coffer ui</code> in a terminal for a new one.</p></main></body></html>";

async fn login(
    State(st): State<Arc<AppState>>,
    q: Result<Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let code = q.ok().and_then(|Query(q)| q.code).unwrap_or_default();
    if code.is_empty() || code.len() > 128 || !st.login_codes.redeem(&code) {
        tracing::info!("Refused: web login with a used, expired or unknown code.");
        return html(StatusCode::UNAUTHORIZED, LOGIN_REFUSED);
    }
    let session = st.web_sessions.create();
    tracing::info!("Web session started.");
    let mut r = secure(StatusCode::SEE_OTHER.into_response());
    let h = r.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_static("/ui/chat"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let cookie = format!(
        "{}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        crate::middleware::SESSION_COOKIE,
        crate::state::WEB_SESSION_MAX_AGE.as_secs()
    );
    h.insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("hex cookie"));
    r
}

/// `POST /v1/ui/login-codes` → `{code, url, expires_in_s}`. Needs the token: a web session
/// cannot mint codes for another browser.
async fn mint_code(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Result<Json<serde_json::Value>, ApiError> {
    if crate::middleware::via_cookie_only(&st, &headers) {
        return Err(ApiError::new(crate::error::Code::Forbidden, "login codes need the token, not a web session"));
    }
    let code = st.login_codes.mint();
    let url = format!("http://127.0.0.1:{}/ui/login?code={code}", st.port);
    Ok(Json(json!({"code": code, "url": url, "expires_in_s": LOGIN_CODE_TTL.as_secs()})))
}

/// `GET /v1/ui/session` → `{"via": "cookie" | "token"}`: how this request was authenticated
/// (the page's first call; 401 when it has no session).
async fn whoami(State(st): State<Arc<AppState>>, headers: HeaderMap) -> Json<serde_json::Value> {
    let via = if crate::middleware::via_cookie_only(&st, &headers) { "cookie" } else { "token" };
    Json(json!({"via": via}))
}

/// `DELETE /v1/ui/sessions` → `{revoked}`: every web session ends (cookies stop working).
async fn logout_all(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let n = st.web_sessions.revoke_all();
    tracing::info!(revoked = n, "Web sessions revoked.");
    Json(json!({"revoked": n}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ui_file_is_embedded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ui");
        let mut missing = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let rel = p.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
                if rel != "index.html" && !ASSETS.iter().any(|a| a.path == rel) {
                    missing.push(rel);
                }
            }
        }
        assert!(missing.is_empty(), "files in gateway-edge/ui/ not in ASSETS: {missing:?}");
    }

    #[test]
    fn codes_are_single_use() {
        let c = LoginCodes::default();
        let code = c.mint();
        assert!(!c.redeem("0".repeat(64).as_str()));
        assert!(c.redeem(&code));
        assert!(!c.redeem(&code));
    }
}
