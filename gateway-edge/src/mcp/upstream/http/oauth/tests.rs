//! The sign-in and the token life cycle against a fake authorization server and protected
//! resource over real HTTP on loopback (axum), speaking RFC 9728, RFC 8414, RFC 7591 and the
//! OAuth 2.1 token endpoint: the happy path, then the faults (wrong state, PKCE mismatch,
//! expired code, refused refresh, metadata for another resource, no registration, a hostile
//! redirect) and concurrent refreshes. The browser is played by following the authorization
//! endpoint's redirect with an HTTP client.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use super::flow::{FlowState, SignInOptions};
use super::{AuthError, AuthState, Grant, OAuth, credential_name};
use crate::mcp::resolver::{CredentialResolver, FixedCredentials};

/// What the fake does and has seen.
#[derive(Default)]
struct Fake {
    base: String,
    /// The PRM's `resource` (default: `<base>/mcp`).
    resource: Option<String>,
    /// Registration endpoint offered.
    no_registration: bool,
    /// Token endpoint answers: the code expired.
    expire_codes: bool,
    /// Refresh tokens refused (revoked).
    revoked: bool,
    /// Access token lifetime (s).
    ttl: u64,
    /// code → (client_id, challenge, redirect_uri, resource)
    codes: HashMap<String, (String, String, String, String)>,
    clients: Vec<String>,
    refreshes: u32,
    issued: u32,
    /// Every `resource` parameter the token endpoint got.
    resources: Vec<String>,
    /// Scopes asked for at /authorize.
    scopes: Vec<String>,
}

type Shared = Arc<Mutex<Fake>>;

async fn fake_server(configure: impl FnOnce(&mut Fake)) -> (String, Shared, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mut fake = Fake { base: base.clone(), ttl: 3600, ..Fake::default() };
    configure(&mut fake);
    let shared: Shared = Arc::new(Mutex::new(fake));
    let app = Router::new()
        .route("/mcp", post(mcp))
        .route("/.well-known/oauth-protected-resource/mcp", get(prm))
        .route("/.well-known/oauth-authorization-server", get(as_meta))
        .route("/register", post(register))
        .route("/authorize", get(authorize))
        .route("/token", post(token))
        .with_state(shared.clone());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, shared, task)
}

async fn mcp(State(f): State<Shared>) -> Response {
    let base = f.lock().unwrap().base.clone();
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            format!(
                "Bearer error=\"invalid_token\", resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\", scope=\"tools:read tools:call\""
            ),
        )],
        "{}",
    )
        .into_response()
}

async fn prm(State(f): State<Shared>) -> Json<Value> {
    let f = f.lock().unwrap();
    let resource = f.resource.clone().unwrap_or_else(|| format!("{}/mcp", f.base));
    Json(json!({"resource": resource, "authorization_servers": [f.base], "scopes_supported": ["tools:read"]}))
}

async fn as_meta(State(f): State<Shared>) -> Json<Value> {
    let f = f.lock().unwrap();
    let b = &f.base;
    let mut m = json!({
        "issuer": b, "authorization_endpoint": format!("{b}/authorize"), "token_endpoint": format!("{b}/token"),
        "response_types_supported": ["code"], "code_challenge_methods_supported": ["S256"],
    });
    if !f.no_registration {
        m["registration_endpoint"] = format!("{b}/register").into();
    }
    Json(m)
}

async fn register(State(f): State<Shared>, Json(body): Json<Value>) -> Response {
    if body["token_endpoint_auth_method"] != "none" || body["redirect_uris"].as_array().map(Vec::len) != Some(1) {
        return (StatusCode::BAD_REQUEST, Json(json!({"error": "invalid_client_metadata"}))).into_response();
    }
    let mut f = f.lock().unwrap();
    let id = format!("client-{}", f.clients.len() + 1);
    f.clients.push(id.clone());
    (StatusCode::CREATED, Json(json!({"client_id": id, "token_endpoint_auth_method": "none"}))).into_response()
}

async fn authorize(State(f): State<Shared>, Query(q): Query<HashMap<String, String>>) -> Response {
    let mut f = f.lock().unwrap();
    assert_eq!(q["response_type"], "code");
    assert_eq!(q["code_challenge_method"], "S256");
    assert!(f.clients.contains(&q["client_id"]), "unknown client {}", q["client_id"]);
    f.scopes.push(q.get("scope").cloned().unwrap_or_default());
    let code = format!("code-{}", f.codes.len() + 1);
    f.codes.insert(
        code.clone(),
        (q["client_id"].clone(), q["code_challenge"].clone(), q["redirect_uri"].clone(), q["resource"].clone()),
    );
    let mut to = reqwest::Url::parse(&q["redirect_uri"]).unwrap();
    to.query_pairs_mut().append_pair("code", &code).append_pair("state", &q["state"]);
    (StatusCode::FOUND, [(header::LOCATION, to.to_string())]).into_response()
}

fn refuse(error: &str, desc: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": error, "error_description": desc}))).into_response()
}

async fn token(State(f): State<Shared>, body: String) -> Response {
    let p: HashMap<String, String> = url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let mut f = f.lock().unwrap();
    f.resources.push(p.get("resource").cloned().unwrap_or_default());
    let issue = |f: &mut Fake| {
        f.issued += 1;
        let n = f.issued;
        Json(json!({"access_token": format!("at-{n}-secret"), "token_type": "bearer", "expires_in": f.ttl, "refresh_token": format!("rt-{n}-secret"), "scope": "tools:read"}))
            .into_response()
    };
    match p.get("grant_type").map(String::as_str) {
        Some("authorization_code") => {
            let Some((client, challenge, redirect, _)) = f.codes.remove(&p["code"]) else {
                return refuse("invalid_grant", "unknown code");
            };
            if f.expire_codes {
                return refuse("invalid_grant", "the authorization code expired");
            }
            if p["client_id"] != client || p["redirect_uri"] != redirect {
                return refuse("invalid_grant", "client or redirect_uri mismatch");
            }
            if super::client::s256(&p["code_verifier"]) != challenge {
                return refuse("invalid_grant", "PKCE verification failed");
            }
            issue(&mut f)
        }
        Some("refresh_token") => {
            if f.revoked || !p["refresh_token"].starts_with("rt-") {
                return refuse("invalid_grant", &format!("refresh token {} was revoked", p["refresh_token"]));
            }
            f.refreshes += 1;
            issue(&mut f)
        }
        _ => refuse("unsupported_grant_type", ""),
    }
}

/// Plays the browser: GETs the authorization URL, optionally rewrites the redirect, follows it;
/// returns the listener's answer.
async fn browse(url: &str, rewrite: impl FnOnce(reqwest::Url) -> reqwest::Url) -> (u16, String) {
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).no_proxy().build().unwrap();
    let r = http.get(url).send().await.unwrap();
    assert_eq!(r.status(), 302);
    let to = reqwest::Url::parse(r.headers()[header::LOCATION].to_str().unwrap()).unwrap();
    let r = http.get(rewrite(to)).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn pending_url(s: &FlowState) -> String {
    match s {
        FlowState::Pending { authorization_url, redirect_uri, .. } => {
            assert!(redirect_uri.starts_with("http://127.0.0.1:") && redirect_uri.ends_with("/callback"));
            authorization_url.clone()
        }
        other => panic!("not pending: {other:?}"),
    }
}

async fn ended(oauth: &OAuth, server: &str) -> FlowState {
    oauth.flows.state(server, Duration::from_secs(10)).await.expect("a flow")
}

fn stored(store: &FixedCredentials, server: &str) -> Option<Value> {
    let map = store.1.lock().unwrap();
    map.get(&credential_name(server)).map(|v| serde_json::from_str(v.expose_secret()).unwrap())
}

#[tokio::test]
async fn sign_in_refresh_and_needs_sign_in() {
    let (base, fake, _task) = fake_server(|f| f.ttl = 0).await;
    let store = Arc::new(FixedCredentials::default());
    let oauth = OAuth::new(store.clone());
    let st = oauth.start_sign_in("srv", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap();
    let url = pending_url(&st);
    let q: HashMap<String, String> = reqwest::Url::parse(&url).unwrap().query_pairs().into_owned().collect();
    assert_eq!(q["resource"], format!("{base}/mcp"), "RFC 8707 resource");
    assert_eq!(q["scope"], "tools:read tools:call", "the challenge's scopes win");
    let (status, text) = browse(&url, |u| u).await;
    assert_eq!((status, text.contains("signed in to srv")), (200, true), "{text}");
    assert_eq!(ended(&oauth, "srv").await, FlowState::SignedIn);
    // The listener is gone after the one redirect.
    let auth = oauth.server("srv");
    let AuthState::SignedIn { refreshable: true, .. } = auth.status().await.unwrap() else { panic!("not signed in") };
    let g = stored(&store, "srv").unwrap();
    assert_eq!(g["access_token"], "at-1-secret");
    assert_eq!(g["resource"], format!("{base}/mcp"));

    // A token issued with `expires_in: 0` is refreshed before use, with the same resource.
    let t = auth.bearer().await.unwrap().unwrap();
    assert_eq!(t.expose_secret(), "at-2-secret");
    assert_eq!(fake.lock().unwrap().refreshes, 1);
    assert!(fake.lock().unwrap().resources.iter().all(|r| *r == format!("{base}/mcp")));
    assert_eq!(stored(&store, "srv").unwrap()["refresh_token"], "rt-2-secret", "rotation is stored");

    // A 401 on the current token refreshes once, however many requests got one at once.
    fake.lock().unwrap().ttl = 3600;
    let t2 = auth.bearer().await.unwrap().unwrap();
    let before = fake.lock().unwrap().refreshes;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let auth = auth.clone();
            let sent = t2.clone();
            tokio::spawn(async move { auth.rejected(Some(&sent)).await.unwrap().expose_secret().to_owned() })
        })
        .collect();
    let mut got = Vec::new();
    for t in tasks {
        got.push(t.await.unwrap());
    }
    assert_eq!(fake.lock().unwrap().refreshes, before + 1, "one refresh for concurrent 401s");
    assert!(got.iter().all(|g| *g == got[0] && *g != t2.expose_secret()));

    // A revoked refresh token: needs sign-in, stored without tokens, the message names the
    // command and no secret.
    fake.lock().unwrap().revoked = true;
    let sent = SecretString::from(got[0].clone());
    let e = auth.rejected(Some(&sent)).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, AuthError::NeedsSignIn { .. }), "{e}");
    assert!(msg.contains("coffer mcp auth srv") && msg.contains("invalid_grant"), "{msg}");
    assert!(!msg.contains("rt-") && !msg.contains("secret"), "a token in {msg}");
    let g = stored(&store, "srv").unwrap();
    assert!(g.get("access_token").is_none() && g.get("refresh_token").is_none(), "{g}");
    assert!(matches!(auth.status().await.unwrap(), AuthState::NeedsSignIn { .. }));
    assert!(matches!(auth.bearer().await, Err(AuthError::NeedsSignIn { .. })), "stays until a sign-in");

    // Signing in again clears it.
    fake.lock().unwrap().revoked = false;
    let url = pending_url(&oauth.start_sign_in("srv", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap());
    browse(&url, |u| u).await;
    assert_eq!(ended(&oauth, "srv").await, FlowState::SignedIn);
    assert!(auth.bearer().await.unwrap().is_some());
    auth.sign_out().await.unwrap();
    assert_eq!(auth.status().await.unwrap(), AuthState::None);
    assert!(stored(&store, "srv").is_none());
}

#[tokio::test]
async fn a_redirect_with_another_state_stores_nothing() {
    let (base, _fake, _task) = fake_server(|_| {}).await;
    let store = Arc::new(FixedCredentials::default());
    let oauth = OAuth::new(store.clone());
    let url = pending_url(&oauth.start_sign_in("srv", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap());
    let (status, text) = browse(&url, |mut u| {
        let pairs: Vec<(String, String)> = u.query_pairs().into_owned().collect();
        u.query_pairs_mut().clear();
        for (k, v) in pairs {
            u.query_pairs_mut().append_pair(&k, if k == "state" { "forged" } else { &v });
        }
        u
    })
    .await;
    assert_eq!(status, 400, "{text}");
    let FlowState::Failed { error } = ended(&oauth, "srv").await else { panic!("not failed") };
    assert!(error.contains("state does not match"), "{error}");
    assert!(stored(&store, "srv").is_none());
}

#[tokio::test]
async fn pkce_mismatch_and_expired_codes_fail_the_sign_in() {
    // PKCE: the redirect goes to the listener of a second flow, whose verifier is another.
    let (base, fake, _task) = fake_server(|_| {}).await;
    let store = Arc::new(FixedCredentials::default());
    let oauth = OAuth::new(store.clone());
    let a = pending_url(&oauth.start_sign_in("a", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap());
    let b = oauth.start_sign_in("b", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap();
    let FlowState::Pending { authorization_url: b_url, redirect_uri: b_redirect, .. } = b else { panic!() };
    let b_state: String = reqwest::Url::parse(&b_url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .unwrap();
    // a's code (issued for a's challenge and redirect) presented to b's listener with b's state:
    // b's verifier does not match a's challenge (nor its redirect_uri).
    let (status, _) = browse(&a, |u| {
        let code: String = u.query_pairs().find(|(k, _)| k == "code").map(|(_, v)| v.into_owned()).unwrap();
        let mut to = reqwest::Url::parse(&b_redirect).unwrap();
        to.query_pairs_mut().append_pair("code", &code).append_pair("state", &b_state);
        to
    })
    .await;
    assert_eq!(status, 200);
    let FlowState::Failed { error } = ended(&oauth, "b").await else { panic!("b did not fail") };
    assert!(error.contains("invalid_grant"), "{error}");
    assert!(stored(&store, "b").is_none());

    fake.lock().unwrap().expire_codes = true;
    let url = pending_url(&oauth.start_sign_in("c", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap());
    browse(&url, |u| u).await;
    let FlowState::Failed { error } = ended(&oauth, "c").await else { panic!("c did not fail") };
    assert!(error.contains("invalid_grant: the authorization code expired"), "{error}");
    assert!(stored(&store, "c").is_none());
}

#[tokio::test]
async fn metadata_for_another_resource_or_without_registration_is_refused() {
    let (base, _fake, _task) = fake_server(|f| f.resource = Some("http://127.0.0.1:1/other".into())).await;
    let oauth = OAuth::new(Arc::new(FixedCredentials::default()));
    let e = oauth.start_sign_in("srv", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap_err();
    assert!(e.to_string().contains("is for \"http://127.0.0.1:1/other\""), "{e}");

    let (base, _fake, _task) = fake_server(|f| f.no_registration = true).await;
    let e = oauth.start_sign_in("srv", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap_err();
    assert!(e.to_string().contains("--client-id"), "{e}");
    // With a client id the user registered, the flow starts.
    let opts = SignInOptions { client_id: Some("client-by-hand".into()), ..SignInOptions::default() };
    let st = oauth.start_sign_in("srv", &format!("{base}/mcp"), opts).await.unwrap();
    assert!(pending_url(&st).contains("client_id=client-by-hand"));

    // Unreachable servers say so.
    let e = oauth.start_sign_in("srv", "http://127.0.0.1:1/mcp", SignInOptions::default()).await.unwrap_err();
    assert!(e.to_string().contains("unreachable"), "{e}");
}

#[tokio::test]
async fn the_listener_takes_only_its_redirect() {
    let (base, _fake, _task) = fake_server(|_| {}).await;
    let oauth = OAuth::new(Arc::new(FixedCredentials::default()));
    let st = oauth.start_sign_in("srv", &format!("{base}/mcp"), SignInOptions::default()).await.unwrap();
    let FlowState::Pending { redirect_uri, authorization_url, .. } = st else { panic!() };
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // Another Host (DNS rebinding), a request without the redirect's parameters, another path:
    // refused, and the flow still waits.
    let with = |k: &str, v: &str| {
        let mut u = reqwest::Url::parse(&redirect_uri).unwrap();
        u.query_pairs_mut().append_pair(k, v);
        u
    };
    let r = http.get(with("state", "x")).header(header::HOST, "evil.example:80").send().await;
    assert_eq!(r.unwrap().status(), 400);
    assert_eq!(http.get(&redirect_uri).send().await.unwrap().status(), 400);
    let other = redirect_uri.replace("/callback", "/other");
    assert_eq!(http.get(&other).send().await.unwrap().status(), 404);
    let huge = "x".repeat(6000);
    let r = http.get(with("error", &huge)).send().await.unwrap();
    // A hostile error redirect without the state ends the flow (one shot), echoing nothing.
    let text = r.text().await.unwrap();
    assert!(!text.contains(&huge[..100]), "echoed: {}", &text[..100.min(text.len())]);
    let FlowState::Failed { error } = ended(&oauth, "srv").await else { panic!() };
    assert!(error.contains("state"), "{error}");
    // The listener is closing or closed: nothing more is taken.
    let fresh = reqwest::Client::builder().no_proxy().build().unwrap();
    if let Ok(r) = fresh.get(with("state", "x")).send().await {
        assert_eq!(r.status(), 410);
    }
    let _ = authorization_url;

    // A flow that gets no redirect times out.
    let opts = SignInOptions { timeout: Some(Duration::from_millis(300)), ..SignInOptions::default() };
    oauth.start_sign_in("srv", &format!("{base}/mcp"), opts).await.unwrap();
    let FlowState::Failed { error } = ended(&oauth, "srv").await else { panic!() };
    assert!(error.contains("no redirect arrived"), "{error}");
}

#[tokio::test]
async fn no_grant_means_no_token_and_a_401_asks_for_sign_in() {
    let store: Arc<dyn CredentialResolver> = Arc::new(FixedCredentials::default());
    let oauth = OAuth::new(store.clone());
    let auth = oauth.server("plain");
    assert!(auth.bearer().await.unwrap().is_none());
    let e = auth.rejected(None).await.unwrap_err();
    assert_eq!(e.to_string(), "upstream plain needs sign-in (it asks for OAuth sign-in): run `coffer mcp auth plain`");
    // A stored grant that is not readable is treated as needing sign-in, not as a crash.
    store.store(credential_name("bad"), SecretString::from("not json")).await.unwrap();
    assert!(matches!(oauth.server("bad").bearer().await, Err(AuthError::NeedsSignIn { .. })));
}

#[test]
fn expiry_and_lapse() {
    let mut g = Grant { expires_at_ms: Some(100_000), lifetime_s: Some(3600), ..Grant::default() };
    assert!(!g.expiring(60_000));
    assert!(g.expiring(71_000), "within 30 s of expiry");
    // A short-lived token is refreshed at half its life, not 30 s ahead.
    g.lifetime_s = Some(10);
    assert!(!g.expiring(94_000));
    assert!(g.expiring(95_000));
    g.expires_at_ms = None;
    assert!(!g.expiring(u64::MAX), "no expiry known: used until refused");
    g.access_token = Some("a".into());
    g.refresh_token = Some("r".into());
    g.lapse("why");
    assert!(g.access_token.is_none() && g.refresh_token.is_none());
    assert_eq!(g.needs_sign_in.as_deref(), Some("why"));
    let dbg = format!("{:?}", Grant { access_token: Some("secret-at".into()), ..Grant::default() });
    assert!(!dbg.contains("secret-at"), "{dbg}");
}

#[test]
fn needs_sign_in_names_the_command() {
    let e = AuthError::NeedsSignIn { server: "linear".into(), why: "its refresh was refused".into() };
    assert_eq!(e.to_string(), "upstream linear needs sign-in (its refresh was refused): run `coffer mcp auth linear`");
}

#[tokio::test]
async fn a_refresh_that_gets_no_answer_says_to_check_the_endpoint_or_sign_in_again() {
    // A token endpoint on a loopback port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let store: Arc<dyn CredentialResolver> = Arc::new(FixedCredentials::default());
    let grant = Grant {
        resource: "http://127.0.0.1:1/mcp".into(),
        token_endpoint: format!("http://127.0.0.1:{port}/token"),
        client_id: "c".into(),
        access_token: Some("old".into()),
        refresh_token: Some("r".into()),
        expires_at_ms: Some(1),
        ..Grant::default()
    };
    store.store(credential_name("down"), SecretString::from(serde_json::to_string(&grant).unwrap())).await.unwrap();
    let oauth = OAuth::new(store);
    let e = oauth.server("down").bearer().await.unwrap_err();
    assert!(matches!(e, AuthError::Unavailable { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains(&format!("check that its token endpoint http://127.0.0.1:{port}/token answers")), "{text}");
    assert!(text.contains("sign in again with `coffer mcp auth down`"), "{text}");
}

#[tokio::test]
async fn a_scope_challenge_marks_the_grant_with_the_union_of_scopes() {
    let store: Arc<dyn CredentialResolver> = Arc::new(FixedCredentials::default());
    let grant = Grant { scope: Some("files:read".into()), access_token: Some("at".into()), ..Grant::default() };
    store.store(credential_name("s"), SecretString::from(serde_json::to_string(&grant).unwrap())).await.unwrap();
    let oauth = OAuth::new(store.clone());
    let auth = oauth.server("s");
    let e = auth.insufficient_scope(Some("files:read files:write")).await;
    assert_eq!(
        e.to_string(),
        "upstream s needs sign-in (it needs the scopes \"files:read files:write\"): run `coffer mcp auth s`"
    );
    assert_eq!(auth.step_up_scope().await.as_deref(), Some("files:read files:write"));
    assert!(matches!(auth.bearer().await, Err(AuthError::NeedsSignIn { .. })));
    // Stored: a restart keeps it.
    let again = OAuth::new(store).server("s");
    assert_eq!(again.step_up_scope().await.as_deref(), Some("files:read files:write"));
    assert!(matches!(again.status().await.unwrap(), AuthState::NeedsSignIn { .. }));
    assert_eq!(super::scope_union(Some("a b"), "b c"), "a b c");
    assert_eq!(super::scope_union(None, ""), "");
}
