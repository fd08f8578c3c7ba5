//! OAuth 2.1 sign-in for HTTP upstreams, client side (MCP 2025-11-25 basic/authorization):
//! discovery ([`discovery`]: the `401` challenge, RFC 9728, RFC 8414), the client's requests
//! ([`client`]: PKCE, RFC 7591 registration, the token grants with RFC 8707 `resource`), the
//! browser sign-in with a one-shot loopback redirect listener ([`flow`]), and here what an
//! HTTP transport asks for: the access token of a server ([`ServerAuth::bearer`]), refreshed
//! before it expires and again when the server answers `401` ([`ServerAuth::rejected`]).
//!
//! A server's grant (token endpoint, client, resource, scope, tokens, expiry) is one JSON
//! value in the credential store under `oauth.<server>` ([`credential_name`]): sealed there
//! like every credential, never synced (sync carries credential names only), never logged. A
//! refresh the authorization server refuses (revoked, expired) or an access token refused with
//! no refresh token left marks the grant "needs sign-in" (stored, so it survives a restart):
//! the transport then fails at once with [`AuthError::NeedsSignIn`], whose message names the
//! command to run, and `status`, `doctor` and the console show it ([`ServerAuth::status`]).
//!
//! Concurrency: one `tokio` mutex per server guards its grant, so concurrent requests that all
//! find the token expired (or all get a `401`) cause one refresh; a request whose token was
//! replaced while it waited uses the new one.
pub mod client;
pub mod discovery;
pub mod flow;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::Url;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use self::client::{Client, ClientAuth, TokenError, Tokens};
use crate::mcp::resolver::CredentialResolver;

/// Prefix of the credential that holds a server's grant: `oauth.<server>`.
pub const CREDENTIAL_PREFIX: &str = "oauth.";
/// Longest time before expiry at which an access token is refreshed ahead of use.
pub const REFRESH_AHEAD: Duration = Duration::from_secs(30);
/// Longest wait for a TCP connection to an authorization server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The credential name of `server`'s grant.
pub fn credential_name(server: &str) -> String {
    format!("{CREDENTIAL_PREFIX}{server}")
}

/// The command a user runs to sign in to `server`.
pub fn sign_in_command(server: &str) -> String {
    format!("coffer mcp auth {server}")
}

/// Why discovery, registration or a sign-in failed (messages never hold a secret).
#[derive(Debug, Clone, thiserror::Error)]
pub enum OAuthError {
    #[error("OAuth discovery failed: {0}")]
    Discovery(String),
    #[error("OAuth client registration failed: {0}")]
    Registration(String),
    /// The sign-in itself (no way to register a client, the redirect, the code exchange).
    #[error("{0}")]
    Flow(String),
    /// The grant could not be read from or written to the credential store.
    #[error("the credential store: {0}")]
    Store(String),
}

/// Why a request got no access token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    /// Only a new sign-in helps (never signed in, refresh refused, token refused).
    #[error("upstream {server} needs sign-in ({why}): run `coffer mcp auth {server}`")]
    NeedsSignIn { server: String, why: String },
    /// The token endpoint could not be used now; a later request tries again.
    #[error("upstream {server}: refreshing its OAuth access token failed: {why}")]
    Unavailable { server: String, why: String },
}

/// A server's grant as stored (JSON in credential `oauth.<server>`). `Debug` shows no secret.
#[derive(Clone, Serialize, Deserialize, Default)]
pub struct Grant {
    /// The RFC 8707 resource the tokens are for.
    pub resource: String,
    pub issuer: String,
    pub token_endpoint: String,
    pub client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    #[serde(default)]
    pub client_auth: ClientAuth,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// When the access token expires (Unix ms), when the server said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// The access token's lifetime as issued (seconds), to refresh ahead by part of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_s: Option<u64>,
    /// Set when only a new sign-in helps: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_sign_in: Option<String>,
    /// The scopes the next sign-in asks for (space-separated): the granted ones and those a
    /// `403 insufficient_scope` challenge named (MCP 2025-11-25 basic/authorization §Scope
    /// Challenge Handling, step-up). Cleared by a sign-in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_up_scope: Option<String>,
    /// When the user signed in (Unix ms).
    #[serde(default)]
    pub signed_in_at_ms: u64,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("resource", &self.resource)
            .field("issuer", &self.issuer)
            .field("client_id", &self.client_id)
            .field("scope", &self.scope)
            .field("expires_at_ms", &self.expires_at_ms)
            .field("needs_sign_in", &self.needs_sign_in)
            .finish_non_exhaustive()
    }
}

impl Grant {
    fn client(&self) -> Client {
        Client {
            client_id: self.client_id.clone(),
            client_secret: self.client_secret.clone().map(SecretString::from),
            auth: self.client_auth,
        }
    }

    /// Takes the tokens of a token answer, received at `now_ms`.
    fn take(&mut self, t: Tokens, now_ms: u64) {
        self.access_token = Some(t.access_token.expose_secret().to_owned());
        // A server that does not rotate refresh tokens sends none: the old one stays valid.
        if let Some(r) = t.refresh_token {
            self.refresh_token = Some(r.expose_secret().to_owned());
        }
        self.expires_at_ms = t.expires_in.map(|s| now_ms.saturating_add(s.saturating_mul(1000)));
        self.lifetime_s = t.expires_in;
        if t.scope.is_some() {
            self.scope = t.scope;
        }
        self.needs_sign_in = None;
    }

    /// Whether the access token should be refreshed before use at `now_ms`: it expires within
    /// [`REFRESH_AHEAD`] or half its lifetime, whichever is shorter.
    fn expiring(&self, now_ms: u64) -> bool {
        let Some(at) = self.expires_at_ms else { return false };
        let ahead = self.lifetime_s.map_or(REFRESH_AHEAD.as_millis() as u64, |l| {
            (l.saturating_mul(1000) / 2).min(REFRESH_AHEAD.as_millis() as u64)
        });
        now_ms.saturating_add(ahead) >= at
    }

    /// Clears the tokens and records why only a new sign-in helps.
    fn lapse(&mut self, why: &str) {
        self.access_token = None;
        self.refresh_token = None;
        self.expires_at_ms = None;
        self.needs_sign_in = Some(why.to_owned());
    }
}

/// The scopes of `granted` and then those of `challenged` not among them, space-separated
/// (a step-up asks for both, so no permission granted before is lost).
pub fn scope_union(granted: Option<&str>, challenged: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for s in granted.unwrap_or_default().split_whitespace().chain(challenged.split_whitespace()) {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out.join(" ")
}

/// Now, in Unix ms.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The sign-in state of one server, for `status`, `doctor`, the console and the REST API.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum AuthState {
    /// No grant is stored (the server may not use OAuth at all).
    None,
    /// A grant with an access token is stored.
    SignedIn {
        issuer: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        expires_at_ms: Option<u64>,
        refreshable: bool,
    },
    /// Only a new sign-in helps: why, and the command.
    NeedsSignIn { why: String, command: String },
}

/// What is loaded of a server's grant.
enum Loaded {
    Absent,
    Grant(Box<Grant>),
}

/// One server's OAuth state, shared by every upstream connection to it.
pub struct ServerAuth {
    server: String,
    store: Arc<dyn CredentialResolver>,
    http: reqwest::Client,
    /// `None` until read from the store.
    grant: tokio::sync::Mutex<Option<Loaded>>,
    /// When the last sign-in completed: a start that failed before it is retried at once.
    signed_in_at: Mutex<Option<std::time::Instant>>,
}

impl ServerAuth {
    /// Reads the grant from the store on first use.
    async fn loaded<'a>(
        &self,
        g: &'a mut tokio::sync::MutexGuard<'_, Option<Loaded>>,
    ) -> Result<&'a mut Loaded, AuthError> {
        if g.is_none() {
            let name = credential_name(&self.server);
            // The store answers NOT_FOUND naming a credential it does not hold: no grant.
            let absent = format!("credential {name:?} not found");
            let mut values = match self.store.resolve(vec![name.clone()]).await {
                Ok(v) => v,
                Err(why) if why == absent => HashMap::new(),
                Err(why) => {
                    return Err(AuthError::Unavailable {
                        server: self.server.clone(),
                        why: format!("its OAuth grant cannot be read: {why}"),
                    });
                }
            };
            let loaded = match values.remove(&name) {
                None => Loaded::Absent,
                Some(v) => match serde_json::from_str::<Grant>(v.expose_secret()) {
                    Ok(grant) => Loaded::Grant(Box::new(grant)),
                    Err(_) => {
                        tracing::warn!(server = %self.server, credential = %name, "The stored OAuth grant is not readable; the server needs sign-in.");
                        Loaded::Grant(Box::new(Grant {
                            needs_sign_in: Some("its stored OAuth grant is not readable".into()),
                            ..Grant::default()
                        }))
                    }
                },
            };
            **g = Some(loaded);
        }
        Ok(g.as_mut().expect("loaded"))
    }

    /// The access token to send, refreshed first when it is about to expire; `None` when no
    /// grant is stored (the server may need none: a `401` then says so).
    ///
    /// # Errors
    /// [`AuthError::NeedsSignIn`] when the grant needs a new sign-in (now or before);
    /// [`AuthError::Unavailable`] when the store or the token endpoint cannot be used.
    pub async fn bearer(&self) -> Result<Option<SecretString>, AuthError> {
        let mut g = self.grant.lock().await;
        let Loaded::Grant(grant) = self.loaded(&mut g).await? else { return Ok(None) };
        if let Some(why) = &grant.needs_sign_in {
            return Err(self.needs(why));
        }
        if grant.expiring(now_ms()) && grant.refresh_token.is_some() {
            return self.refresh(grant).await.map(Some);
        }
        Ok(grant.access_token.clone().map(SecretString::from))
    }

    /// The server refused `sent` (it answered `401`): a token to retry with, refreshed unless
    /// another request refreshed it meanwhile.
    ///
    /// # Errors
    /// [`AuthError::NeedsSignIn`] when there is no grant, no refresh token, or the refresh is
    /// refused (the grant is then marked); [`AuthError::Unavailable`] when the token endpoint
    /// cannot be used now.
    pub async fn rejected(&self, sent: Option<&SecretString>) -> Result<SecretString, AuthError> {
        let mut g = self.grant.lock().await;
        let grant = match self.loaded(&mut g).await? {
            Loaded::Absent => return Err(self.needs("it asks for OAuth sign-in")),
            Loaded::Grant(grant) => grant,
        };
        if let Some(why) = &grant.needs_sign_in {
            return Err(self.needs(why));
        }
        if let (Some(now), Some(sent)) = (&grant.access_token, sent)
            && now != sent.expose_secret()
        {
            return Ok(SecretString::from(now.clone()));
        }
        if grant.refresh_token.is_none() {
            let why = "its access token was refused and there is no refresh token";
            grant.lapse(why);
            self.save(grant).await;
            return Err(self.needs(why));
        }
        self.refresh(grant).await
    }

    /// The token was refused again right after a refresh: the grant is of no use.
    pub async fn refused_after_refresh(&self) -> AuthError {
        let why = "it refused a freshly refreshed access token (a token for another resource?)";
        let mut g = self.grant.lock().await;
        if let Ok(Loaded::Grant(grant)) = self.loaded(&mut g).await {
            grant.lapse(why);
            self.save(grant).await;
        }
        self.needs(why)
    }

    /// The server refused a request for want of scope (`403` with `error="insufficient_scope"`
    /// and the scopes it needs, MCP 2025-11-25 basic/authorization §Scope Challenge Handling):
    /// only a new sign-in asking for wider scopes helps. The grant is marked so (stored), with
    /// the granted scopes and the challenged ones as the next sign-in's scope.
    pub async fn insufficient_scope(&self, challenged: Option<&str>) -> AuthError {
        let mut g = self.grant.lock().await;
        let loaded = self.loaded(&mut g).await;
        let granted = match &loaded {
            Ok(Loaded::Grant(grant)) => grant.scope.clone(),
            _ => None,
        };
        let wanted = scope_union(granted.as_deref(), challenged.unwrap_or_default());
        let why = if wanted.is_empty() {
            "it refused the access token for want of scope".to_owned()
        } else {
            format!("it needs the scopes \"{wanted}\"")
        };
        if let Ok(Loaded::Grant(grant)) = loaded {
            grant.needs_sign_in = Some(why.clone());
            grant.step_up_scope = (!wanted.is_empty()).then(|| wanted.clone());
            self.save(grant).await;
        }
        tracing::warn!(server = %self.server, scope = %wanted, "The upstream asks for more OAuth scopes; it needs sign-in.");
        self.needs(&why)
    }

    /// The scopes a step-up asks for (set by [`ServerAuth::insufficient_scope`]), if any.
    pub async fn step_up_scope(&self) -> Option<String> {
        let mut g = self.grant.lock().await;
        match self.loaded(&mut g).await {
            Ok(Loaded::Grant(grant)) => grant.step_up_scope.clone(),
            _ => None,
        }
    }

    /// Refreshes `grant` (its lock held by the caller) and stores the result.
    async fn refresh(&self, grant: &mut Grant) -> Result<SecretString, AuthError> {
        let Some(refresh_token) = grant.refresh_token.clone().map(SecretString::from) else {
            return Err(self.needs("there is no refresh token"));
        };
        let endpoint =
            Url::parse(&grant.token_endpoint).map_err(|_| self.needs("its stored token endpoint is not a URL"))?;
        let started = std::time::Instant::now();
        match client::refresh(
            &self.http,
            &endpoint,
            &grant.client(),
            &refresh_token,
            &grant.resource,
            grant.scope.as_deref(),
        )
        .await
        {
            Ok(tokens) => {
                grant.take(tokens, now_ms());
                tracing::info!(server = %self.server, elapsed_ms = started.elapsed().as_millis() as u64, "OAuth access token refreshed.");
                self.save(grant).await;
                Ok(SecretString::from(grant.access_token.clone().unwrap_or_default()))
            }
            Err(TokenError::Refused(why)) => {
                tracing::warn!(server = %self.server, error = %why, "OAuth refresh refused; the server needs sign-in.");
                let why = format!("its refresh was refused: {why}");
                grant.lapse(&why);
                self.save(grant).await;
                Err(self.needs(&why))
            }
            Err(TokenError::Unavailable(why)) => {
                tracing::warn!(server = %self.server, error = %why, "OAuth refresh failed.");
                let why = format!(
                    "{why}; check that its token endpoint {} answers, or sign in again with `{}`",
                    discovery::shown(&endpoint),
                    sign_in_command(&self.server)
                );
                Err(AuthError::Unavailable { server: self.server.clone(), why })
            }
        }
    }

    /// Stores `grant` (a failure is logged: the tokens stay usable in memory until restart).
    async fn save(&self, grant: &Grant) {
        let value = SecretString::from(serde_json::to_string(grant).expect("grant serializes"));
        if let Err(e) = self.store.store(credential_name(&self.server), value).await {
            tracing::warn!(server = %self.server, error = %e, "The OAuth grant could not be stored.");
        }
    }

    fn needs(&self, why: &str) -> AuthError {
        AuthError::NeedsSignIn { server: self.server.clone(), why: why.to_owned() }
    }

    /// Replaces the grant with one from a completed sign-in and stores it.
    ///
    /// # Errors
    /// [`OAuthError::Store`] when the store refused it (the sign-in then did not happen).
    pub async fn signed_in(&self, grant: Grant) -> Result<(), OAuthError> {
        let mut g = self.grant.lock().await;
        let value = SecretString::from(serde_json::to_string(&grant).expect("grant serializes"));
        self.store.store(credential_name(&self.server), value).await.map_err(OAuthError::Store)?;
        *g = Some(Loaded::Grant(Box::new(grant)));
        *self.signed_in_at.lock().expect("signed in") = Some(std::time::Instant::now());
        Ok(())
    }

    /// Forgets the grant (deleted from the store).
    ///
    /// # Errors
    /// [`OAuthError::Store`].
    pub async fn sign_out(&self) -> Result<(), OAuthError> {
        let mut g = self.grant.lock().await;
        self.store.remove(credential_name(&self.server)).await.map_err(OAuthError::Store)?;
        *g = Some(Loaded::Absent);
        Ok(())
    }

    /// The server's sign-in state.
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn status(&self) -> Result<AuthState, AuthError> {
        let mut g = self.grant.lock().await;
        Ok(match self.loaded(&mut g).await? {
            Loaded::Absent => AuthState::None,
            Loaded::Grant(grant) => match &grant.needs_sign_in {
                Some(why) => AuthState::NeedsSignIn { why: why.clone(), command: sign_in_command(&self.server) },
                None => AuthState::SignedIn {
                    issuer: grant.issuer.clone(),
                    scope: grant.scope.clone(),
                    expires_at_ms: grant.expires_at_ms,
                    refreshable: grant.refresh_token.is_some(),
                },
            },
        })
    }

    /// Drops what is loaded: the next use reads the store again.
    pub async fn reload(&self) {
        *self.grant.lock().await = None;
    }
}

/// Every server's [`ServerAuth`] and the sign-ins in progress; one per gateway.
pub struct OAuth {
    store: Arc<dyn CredentialResolver>,
    http: reqwest::Client,
    servers: Mutex<HashMap<String, Arc<ServerAuth>>>,
    pub(crate) flows: flow::Flows,
}

impl OAuth {
    /// OAuth state kept in `store` (the credential store in the daemon).
    pub fn new(store: Arc<dyn CredentialResolver>) -> Arc<Self> {
        coffer_runtime::tls::ensure_provider();
        // Redirects stay off: a token request must reach the endpoint the metadata named.
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("HTTP client");
        Arc::new(Self { store, http, servers: Mutex::default(), flows: flow::Flows::default() })
    }

    /// `server`'s OAuth state (created on first use, the grant read lazily).
    pub fn server(&self, server: &str) -> Arc<ServerAuth> {
        self.servers
            .lock()
            .expect("oauth")
            .entry(server.to_owned())
            .or_insert_with(|| {
                Arc::new(ServerAuth {
                    server: server.to_owned(),
                    store: self.store.clone(),
                    http: self.http.clone(),
                    grant: tokio::sync::Mutex::new(None),
                    signed_in_at: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Whether a sign-in to `server` completed after `at` (a start that failed at `at` for
    /// want of one is then retried without waiting out its backoff).
    pub fn signed_in_since(&self, server: &str, at: std::time::Instant) -> bool {
        let Some(auth) = self.servers.lock().expect("oauth").get(server).cloned() else { return false };
        auth.signed_in_at.lock().expect("signed in").is_some_and(|s| s > at)
    }

    /// Forgets `server` (its registration was removed): its flow stops, its state is dropped.
    pub fn forget(&self, server: &str) {
        self.servers.lock().expect("oauth").remove(server);
        self.flows.cancel(server);
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }
}
