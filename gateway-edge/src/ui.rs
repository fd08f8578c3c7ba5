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
//! - `GET /ui/login?code=C[&next=/ui/PAGE]` → when `C` is a live one-time code: consumes it,
//!   sets the `coffer_session` cookie (`HttpOnly; SameSite=Strict; Path=/; Max-Age=2592000`)
//!   and redirects (303) to `next` when it is exactly `/ui/<known page>`, else to `/ui/chat`
//!   (nothing else is ever a redirect target), with the session's key in the fragment
//!   (`/ui/chat#key=K`): a fragment never leaves the browser, and the page moves it to the
//!   origin's `localStorage` and drops it from the address at once. Otherwise 401 with a page
//!   that says what to do, unless the request carries a live session cookie (a reloaded login
//!   tab, whose page already keeps its key): then the same 303 without a new session or key.
//!   A code is 64 hex characters, works once and lives `ui.login_code_ttl_s` seconds (60 by
//!   default); a request naming `code` (or `next`) more than once is refused.
//! - `POST /v1/ui/login-codes` (token only; body optional `{"page": PAGE}`) →
//!   `{code, url, expires_in_s}`.
//! - `DELETE /v1/ui/sessions` → `{revoked}`: ends every web session, on disk too.
//! - `GET /v1/ui/session` → `{via}`: whether the caller is signed in, and how.
//! - `POST /v1/ui/stream-tickets` (a web session only) → `{ticket, expires_in_s}`: a
//!   single-use ticket for one event stream (`GET …?ticket=T`), bound to the session.
//!
//! Sessions themselves live in [`crate::web_sessions`]. Every response to a `/ui` path (pages,
//! assets, the login's redirect and refusal, 404s, and refusals by the edge's checks) carries
//! [`CSP`], `X-Content-Type-Options: nosniff` and `X-Frame-Options: DENY`
//! ([`security_headers`]).
//!
//! No build step: the console is plain HTML, one stylesheet and small ES modules under
//! `gateway-edge/ui/`, embedded with `include_bytes!` (table `ASSETS`; a unit test fails when a
//! file there is not in it) and served as they are. Nothing to install to build or run it (no
//! Node, no bundler whose output drifts from the source; every browser Coffer supports runs
//! modules natively), the browser runs the files the repository holds, and it fits a strict CSP (no
//! inline script or style, no other origin). Every page is a client of the same `/v1/*` REST/SSE
//! API as the CLI: if a page needs something, the API gets it. The vault pages
//! (`gateway-edge/ui/js/pages/`, helpers in `gateway-edge/ui/js/vault/`) say `X-Coffer-Actor: ui`
//! on each request, so the audit log names the console; a secret typed into the server form (an
//! env variable or header whose name says token, key, secret… is secret by default) becomes
//! credential `<server>-<KEY>` first and the server gets only its reference, as `coffer mcp add`
//! does, and a refused registration deletes it again. Live data comes from SSE
//! (`GET /v1/invocations/events`, `GET /v1/mcp/servers/{name}/log?follow=true`); the one poll is
//! the reindex progress bar (every 500 ms while a pass runs). The settings form reads
//! `GET /v1/settings/table` and shows the daemon's own validation message next to the field it
//! refuses. How a session is authenticated, and why the cookie alone is not enough:
//! `docs/SECURITY.md`. The console's tests (`tests/e2e/ui_*.rs`) drive real headless Chromium
//! (`tests/src/browser.rs`); every one ends with `assert_clean()` and saves screenshots to
//! `target/ui-screenshots/`; `ui_done_when.rs` is the console issue's whole story in one test.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use coffer_api::console as api;
use secrecy::ExposeSecret;
use serde_json::json;

use crate::error::ApiError;
use crate::middleware::Via;
use crate::state::AppState;

/// Longest `code` parameter looked at; a real one has 64 characters.
const MAX_CODE_LEN: usize = 64;

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
    "js/clock.js" => "text/javascript; charset=utf-8",
    "js/pages/chat.js" => "text/javascript; charset=utf-8",
    "js/markdown.js" => "text/javascript; charset=utf-8",
    "js/chat/list.js" => "text/javascript; charset=utf-8",
    "js/chat/thread.js" => "text/javascript; charset=utf-8",
    "js/chat/render.js" => "text/javascript; charset=utf-8",
    "js/chat/dialogs.js" => "text/javascript; charset=utf-8",
    "js/chat/approvals.js" => "text/javascript; charset=utf-8",
    "js/chat/attach.js" => "text/javascript; charset=utf-8",
    "js/chat/notify.js" => "text/javascript; charset=utf-8",
    "js/chat/changes.js" => "text/javascript; charset=utf-8",
    "js/chat/events.js" => "text/javascript; charset=utf-8",
    "js/chat/outbox.js" => "text/javascript; charset=utf-8",
    "js/chat/model.js" => "text/javascript; charset=utf-8",
    "vendor/marked.esm.js" => "text/javascript; charset=utf-8",
    "vendor/purify.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/core.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/bash.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/shell.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/javascript.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/typescript.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/python.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/rust.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/json.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/xml.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/go.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/yaml.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/diff.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/sql.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/ini.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/css.min.js" => "text/javascript; charset=utf-8",
    "vendor/highlight/languages/markdown.min.js" => "text/javascript; charset=utf-8",
    "vendor/diff2html-ui-base.min.js" => "text/javascript; charset=utf-8",
    "vendor/diff2html.min.css" => "text/css; charset=utf-8",
    "vendor/README.md" => "text/markdown; charset=utf-8",
    "vendor/LICENSE.marked" => "text/plain; charset=utf-8",
    "vendor/LICENSE.dompurify" => "text/plain; charset=utf-8",
    "vendor/LICENSE.highlight" => "text/plain; charset=utf-8",
    "vendor/LICENSE.diff2html" => "text/plain; charset=utf-8",
    "js/pages/servers.js" => "text/javascript; charset=utf-8",
    "js/pages/tools.js" => "text/javascript; charset=utf-8",
    "js/pages/activity.js" => "text/javascript; charset=utf-8",
    "js/pages/knowledge.js" => "text/javascript; charset=utf-8",
    "js/pages/settings.js" => "text/javascript; charset=utf-8",
    "js/vault/common.js" => "text/javascript; charset=utf-8",
    "js/vault/registrydialog.js" => "text/javascript; charset=utf-8",
    "js/vault/serverform.js" => "text/javascript; charset=utf-8",
    "js/vault/llm.js" => "text/javascript; charset=utf-8",
    "js/vault/channels.js" => "text/javascript; charset=utf-8",
    "js/vault/profiles.js" => "text/javascript; charset=utf-8",
    "favicon.svg" => "image/svg+xml",
    // The web app manifest (installable console) and its icons, drawn by `scripts/ui-icons.sh`.
    "manifest.webmanifest" => "application/manifest+json",
    "icon-192.png" => "image/png",
    "icon-512.png" => "image/png",
];

static INDEX: &[u8] = include_bytes!("../ui/index.html");

/// The pages the client-side router knows (`/ui/{page}` serves the same document).
pub use coffer_types::ui::PAGES;

/// Most live login codes at once; minting one more forgets the oldest.
const MAX_LIVE_CODES: usize = 64;

/// Live one-time login codes (value → when it stops working). Few at a time; each lookup
/// compares against every live code in constant time. In memory only: a code outlives no
/// restart (it lives a minute).
#[derive(Default)]
pub struct LoginCodes(Mutex<HashMap<String, Instant>>);

impl LoginCodes {
    /// Mints a code (64 hex characters) valid for `ttl`.
    pub fn mint(&self, ttl: Duration) -> String {
        let code = coffer_runtime::token::random_token().expose_secret().to_owned();
        let now = Instant::now();
        let mut m = self.0.lock().expect("login codes");
        m.retain(|_, until| *until > now);
        while m.len() >= MAX_LIVE_CODES {
            let Some(oldest) = m.iter().min_by_key(|(_, until)| **until).map(|(k, _)| k.clone()) else { break };
            m.remove(&oldest);
        }
        m.insert(code.clone(), now + ttl);
        code
    }

    /// Consumes `presented` when it is a live code: true once, false ever after (also for a
    /// code whose time is up).
    pub fn redeem(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        let now = Instant::now();
        let mut m = self.0.lock().expect("login codes");
        m.retain(|_, until| *until > now);
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

/// How long login codes minted now live (`ui.login_code_ttl_s`).
fn code_ttl(st: &AppState) -> Duration {
    Duration::from_secs(st.gateway.shared.setting(&coffer_types::settings::UI_LOGIN_CODE_TTL_S))
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
        .route("/v1/ui/stream-tickets", post(stream_ticket))
}

/// True for the paths of the console itself (`/ui`, `/ui/…`), not `/v1/ui/…`.
pub fn is_ui_path(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

/// Middleware: every response to a `/ui` path gets [`secure`]'s headers, whatever produced it
/// (a handler, the 404/405 fallbacks, a Host or Origin refusal).
pub async fn security_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let ui = is_ui_path(req.uri().path());
    let resp = next.run(req).await;
    if !ui {
        return resp;
    }
    // `Cross-Origin-Opener-Policy` is for secure origins only: at a plain-HTTP origin beyond
    // loopback (an `http://` entry of `ui.allowed_hosts`) Chromium ignores it and logs an error
    // on every page, so it is left out there (loopback and `https://` origins keep it).
    let plain_remote =
        matches!(resp.extensions().get::<crate::reach::Reach>(), Some(crate::reach::Reach::Remote { https: false }));
    let mut resp = secure(resp);
    if plain_remote {
        resp.headers_mut().remove("cross-origin-opener-policy");
    }
    resp
}

/// Adds the headers every `/ui` response carries.
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
    r
}

async fn index() -> Response {
    html(StatusCode::OK, INDEX)
}

async fn page(Path(page): Path<String>) -> Response {
    if PAGES.contains(&page.as_str()) {
        return html(StatusCode::OK, INDEX);
    }
    ApiError::not_found(format!("no page {:?} in the web console", page.chars().take(40).collect::<String>()))
        .with_details(json!({"pages": PAGES}))
        .into_response()
}

/// True when an `If-None-Match` value (`"a"`, `W/"a", "b"`, `*`) names `etag`.
fn etag_matches(if_none_match: &str, etag: &str) -> bool {
    if_none_match.split(',').map(str::trim).any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag)
}

async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.path == file) else {
        return ApiError::not_found("no such asset in the web console").into_response();
    };
    let etag = format!("\"{}\"", &hex::encode(<sha2::Sha256 as sha2::Digest>::digest(a.body))[..16]);
    if headers.get_all(header::IF_NONE_MATCH).iter().filter_map(|v| v.to_str().ok()).any(|v| etag_matches(v, &etag)) {
        let mut r = StatusCode::NOT_MODIFIED.into_response();
        r.headers_mut().insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex etag"));
        r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return r;
    }
    let mut r = a.body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.mime));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::ETAG, HeaderValue::from_str(&etag).expect("hex etag"));
    r
}

/// The page shown when a login link cannot be used (`ttl_s`: how long links live now).
fn login_refused(ttl_s: u64) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>Coffer — login link not valid</title>\
<link rel=\"icon\" href=\"/ui/assets/favicon.svg\" type=\"image/svg+xml\">\
<link rel=\"stylesheet\" href=\"/ui/assets/app.css\"></head><body class=\"standalone\"><main class=\"notice\">\
<h1>This login link is not valid</h1><p>Login links work once and expire {ttl_s} seconds after they are made. \
Run <code>coffer ui</code> in a terminal for a new one.</p><p>A sign-in lasts until the Coffer daemon stops or \
restarts (<code>coffer daemon restart</code>): then run <code>coffer ui</code> again.</p></main></body></html>"
    )
}

/// The login's parameters: exactly one `code`, at most one `next`; others are ignored.
fn login_params(raw: Option<&str>) -> Option<(String, Option<String>)> {
    let mut code = None;
    let mut next = None;
    for (k, v) in form_urlencoded_pairs(raw.unwrap_or_default())? {
        let slot = match k.as_str() {
            "code" => &mut code,
            "next" => &mut next,
            _ => continue,
        };
        if slot.replace(v).is_some() {
            return None;
        }
    }
    Some((code?, next))
}

/// Decodes `a=b&c=d` (`+` is a space, `%XX` a byte); `None` when a value is not UTF-8.
fn form_urlencoded_pairs(query: &str) -> Option<Vec<(String, String)>> {
    let Ok(axum::extract::Query(pairs)) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&format!("/?{query}").parse().ok()?)
    else {
        return None;
    };
    Some(pairs)
}

/// A 303 to `/ui/{page}` that no cache keeps.
fn see_page(page: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    let h = r.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_str(&format!("/ui/{page}")).expect("a known page"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn login(
    State(st): State<Arc<AppState>>,
    reach: Option<Extension<crate::reach::Reach>>,
    headers: axum::http::HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let params = login_params(uri.query());
    // Only `/ui/<known page>` is a target: never another origin, path or query.
    let page_of =
        |next: Option<&str>| next.and_then(coffer_types::ui::page_of_path).unwrap_or(coffer_types::ui::DEFAULT_PAGE);
    let refuse = |why: &str| {
        // A link that cannot be used again, opened by a browser already signed in (a reloaded
        // login tab): it goes where the link would have, instead of the refusal page.
        if crate::middleware::has_live_cookie(&st, &headers) {
            let page = page_of(params.as_ref().and_then(|(_, n)| n.as_deref()));
            tracing::debug!(why, page, "Web login link not usable, but the browser is signed in; redirected.");
            return see_page(page);
        }
        if let Some(suppressed) = crate::middleware::REFUSALS.allow() {
            tracing::info!(why, suppressed, "Refused: web login.");
        }
        html(StatusCode::UNAUTHORIZED, login_refused(code_ttl(&st).as_secs()))
    };
    let Some((code, next)) = params.clone() else {
        return refuse("no code, a repeated parameter or an undecodable query");
    };
    // A code has the form of one before any lookup: 64 hex characters.
    if code.len() != MAX_CODE_LEN || !code.bytes().all(|b| b.is_ascii_hexdigit()) {
        return refuse("not a code");
    }
    if !st.login_codes.redeem(&code) {
        return refuse("a used, expired or unknown code");
    }
    // The redirect page `coffer ui` opened the browser on has done its work.
    remove_login_redirects(&st, Some(&code));
    let session = st.web_sessions.create().await;
    let page = page_of(next.as_deref());
    tracing::info!(page, "Web session started.");
    let mut r = see_page(page);
    let h = r.headers_mut();
    let to = format!("/ui/{page}#key={}", session.key);
    h.insert(header::LOCATION, HeaderValue::from_str(&to).expect("a known page and hex"));
    let cookie = session_cookie(&session.id, reach.map(|r| r.0));

    h.insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("hex cookie"));
    r
}

/// The `Set-Cookie` value of a new session: `coffer_session=ID; HttpOnly; SameSite=Strict;
/// Path=/; Max-Age=…`, and at an `https://` origin of `ui.allowed_hosts`
/// ([`crate::reach::Reach::Remote`] `https`) `__Host-coffer_session=ID; Secure; …` instead.
///
/// `Secure` follows the owner's configuration, never a request header: the edge speaks plain
/// HTTP, TLS ends in a proxy in front of it, and a header such as `X-Forwarded-Proto` can be
/// sent by any program that reaches the port. An `https://` entry is the owner saying the
/// browser is on TLS there; were it wrong, the browser would drop the cookie (a `Secure` or
/// `__Host-` cookie from a plain-HTTP page is refused) and the login would fail visibly, never
/// weaken.
fn session_cookie(id: &str, reach: Option<crate::reach::Reach>) -> String {
    let max_age = crate::state::WEB_SESSION_MAX_AGE.as_secs();
    match reach {
        Some(crate::reach::Reach::Remote { https: true }) => format!(
            "{}={id}; Secure; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}",
            crate::middleware::SECURE_SESSION_COOKIE
        ),
        _ => {
            format!("{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}", crate::middleware::SESSION_COOKIE)
        }
    }
}

/// Removes the redirect page `coffer ui` wrote for `code` (see
/// [`coffer_runtime::home::CofferHome::login_redirect`]), and every other such page older than
/// the login links' lifetime (its link is dead: a browser that never opened it, a `coffer ui`
/// that was killed). Best effort: a failure is logged at debug, never an error.
fn remove_login_redirects(st: &AppState, code: Option<&str>) {
    if let Some(code) = code {
        let path = st.home.login_redirect(code);
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::debug!("Login redirect page removed."),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::debug!(error = %e, "Cannot remove the login redirect page."),
        }
    }
    let ttl = code_ttl(st);
    let Ok(entries) = std::fs::read_dir(st.home.root()) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(coffer_runtime::home::LOGIN_REDIRECT_PREFIX) || !name.ends_with(".html") {
            continue;
        }
        let stale = e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|age| age > ttl));
        if stale {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The origin of `ui.allowed_hosts` that `wanted` names (its origin or its host name).
///
/// Errors: `INVALID_ARGUMENT` (details `field: "host"`, `valid`: the configured origins) when
/// none does.
fn login_origin(st: &Arc<AppState>, wanted: &str) -> Result<String, ApiError> {
    let hosts = crate::reach::config(st).hosts;
    let w = wanted.trim_end_matches('/');
    let hit = hosts
        .iter()
        .find(|o| o.origin().eq_ignore_ascii_case(w) || o.matches_origin(w) || o.host.eq_ignore_ascii_case(w));
    match hit {
        Some(o) => Ok(o.origin()),
        None => {
            let valid: Vec<String> = hosts.iter().map(|o| o.origin()).collect();
            let message = if valid.is_empty() {
                format!(
                    "host {:?} is not allowed: the setting ui.allowed_hosts is empty (set it first: coffer settings \
                     set ui.allowed_hosts https://NAME)",
                    wanted.chars().take(64).collect::<String>()
                )
            } else {
                format!(
                    "host {:?} is not one of ui.allowed_hosts ({})",
                    wanted.chars().take(64).collect::<String>(),
                    valid.join(", ")
                )
            };
            Err(ApiError::invalid(message).with_details(json!({"field": "host", "valid": valid})))
        }
    }
}

/// `POST /v1/ui/login-codes` (body optional: `{"page": PAGE, "host": HOST}`) →
/// `{code, url, expires_in_s}`: `url` is `http://127.0.0.1:PORT/ui/login?code=CODE` (plus
/// `&next=/ui/PAGE` for a page other than chat), or with `host` the same path at that origin of
/// `ui.allowed_hosts` (for a phone: `coffer ui --host NAME --qr`). Needs the token: a web
/// session cannot mint codes for another browser.
///
/// Errors: `FORBIDDEN` for a web session; `INVALID_ARGUMENT` naming an unknown page or a host
/// not in `ui.allowed_hosts` (the details list the valid ones); `BAD_REQUEST`/`UNKNOWN_FIELD`
/// for a malformed body.
async fn mint_code(
    State(st): State<Arc<AppState>>,
    via: Option<Extension<Via>>,
    body: axum::body::Bytes,
) -> Result<Json<api::LoginCode>, ApiError> {
    if !matches!(via.as_deref(), Some(Via::Token)) {
        return Err(ApiError::new(crate::error::Code::Forbidden, "login codes need the token, not a web session"));
    }
    // The body is optional: none (or only whitespace) is `{}`.
    let body: api::LoginCodeRequest = if body.iter().all(u8::is_ascii_whitespace) {
        api::LoginCodeRequest::default()
    } else {
        crate::error::parse_json(&body)?
    };
    let page = match body.page.as_deref() {
        None | Some("") => coffer_types::ui::DEFAULT_PAGE,
        Some(p) => PAGES.iter().copied().find(|k| *k == p).ok_or_else(|| {
            ApiError::invalid(format!(
                "page {:?} is not one of {}",
                p.chars().take(40).collect::<String>(),
                PAGES.join(", ")
            ))
            .with_details(json!({"field": "page", "valid": PAGES}))
        })?,
    };
    let origin = match body.host.as_deref().map(str::trim) {
        None | Some("") => format!("http://127.0.0.1:{}", st.port),
        Some(h) => login_origin(&st, h)?,
    };
    let ttl = code_ttl(&st);
    remove_login_redirects(&st, None);
    let code = st.login_codes.mint(ttl);
    let mut url = format!("{origin}/ui/login?code={code}");
    if page != coffer_types::ui::DEFAULT_PAGE {
        url.push_str(&format!("&next=/ui/{page}"));
    }
    Ok(Json(api::LoginCode { code, url, expires_in_s: ttl.as_secs() }))
}

/// `GET /v1/ui/session` → `{"via": "cookie" | "token"}`: how this request was authenticated
/// (the page's first call; 401 when it has no session).
async fn whoami(via: Option<Extension<Via>>) -> Json<api::WebSession> {
    let via = if matches!(via.as_deref(), Some(Via::Session(_))) { api::Via::Cookie } else { api::Via::Token };
    Json(api::WebSession { via })
}

/// `POST /v1/ui/stream-tickets` (no body) → `{"ticket": T, "expires_in_s": 30}`: a ticket for
/// one event stream, which the page passes as `GET …?ticket=T` with its cookie (`EventSource`
/// cannot send `X-Coffer-Session-Key`). It works once, within `expires_in_s`, and only with
/// the cookie of the session that asked for it.
///
/// Errors: `FORBIDDEN` for the token (it authenticates streams itself; a ticket is bound to a
/// web session).
async fn stream_ticket(
    State(st): State<Arc<AppState>>,
    via: Option<Extension<Via>>,
) -> Result<Json<api::StreamTicket>, ApiError> {
    let Some(Via::Session(session)) = via.as_deref().copied() else {
        return Err(ApiError::new(
            crate::error::Code::Forbidden,
            "stream tickets are for web sessions; the token authenticates event streams itself",
        ));
    };
    let ticket = st.web_sessions.mint_ticket(session);
    Ok(Json(api::StreamTicket { ticket, expires_in_s: crate::web_sessions::TICKET_TTL.as_secs() }))
}

/// `DELETE /v1/ui/sessions` → `{revoked}`: every web session ends (cookies stop working), in
/// memory and in `web-sessions.json`, before the answer.
///
/// Errors: `INTERNAL` when the file can be neither rewritten nor removed.
async fn logout_all(State(st): State<Arc<AppState>>) -> Result<Json<api::Revoked>, ApiError> {
    let n = st.web_sessions.revoke_all().await.map_err(ApiError::internal)?;
    tracing::info!(revoked = n, "Web sessions revoked.");
    Ok(Json(api::Revoked { revoked: n as u64 }))
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
    fn codes_are_single_use_and_expire() {
        let c = LoginCodes::default();
        let code = c.mint(Duration::from_secs(60));
        assert!(!c.redeem("0".repeat(64).as_str()));
        assert!(c.redeem(&code));
        assert!(!c.redeem(&code));
        let gone = c.mint(Duration::ZERO);
        assert!(!c.redeem(&gone), "a code whose time is up is refused");
        // Minting many keeps the newest live.
        let codes: Vec<String> = (0..MAX_LIVE_CODES + 5).map(|_| c.mint(Duration::from_secs(60))).collect();
        assert!(!c.redeem(&codes[0]));
        assert!(c.redeem(codes.last().unwrap()));
    }

    #[test]
    fn login_parameters() {
        let code = "a".repeat(64);
        assert_eq!(login_params(Some(&format!("code={code}"))), Some((code.clone(), None)));
        assert_eq!(
            login_params(Some(&format!("code={code}&next=%2Fui%2Fservers&x=1"))),
            Some((code.clone(), Some("/ui/servers".into())))
        );
        for bad in [
            None,
            Some(""),
            Some("next=/ui/chat"),
            Some("code=a&code=b"),
            Some("code=a&next=/ui/chat&next=/ui/servers"),
        ] {
            assert_eq!(login_params(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn etags() {
        assert!(etag_matches("\"ab\"", "\"ab\""));
        assert!(etag_matches("W/\"ab\"", "\"ab\""));
        assert!(etag_matches("\"x\", \"ab\"", "\"ab\""));
        assert!(etag_matches("*", "\"ab\""));
        assert!(!etag_matches("\"abc\"", "\"ab\""));
        assert!(!etag_matches("", "\"ab\""));
    }
}
