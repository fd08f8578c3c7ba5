//! A web-console session over plain HTTP, held as the console's page holds one: the
//! `coffer_session` cookie and the session key the login's redirect put in its fragment
//! (`Location: /ui/chat#key=K`), plus single-use stream tickets for event streams.
use std::time::Duration;

use anyhow::{Context, ensure};
use reqwest::{Method, RequestBuilder};
use serde_json::json;

use crate::{Api, SendExt};

/// A client that follows no redirect and keeps no cookie: requests carry `Cookie` by hand.
pub fn client() -> reqwest::Client {
    coffer_runtime::tls::ensure_provider();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client builds")
}

/// One signed-in console.
pub struct WebSession {
    /// `coffer_session=<64 hex>`, for a `Cookie` header.
    pub cookie: String,
    /// The session key (64 hex) for `X-Coffer-Session-Key`.
    pub key: String,
    /// The console's origin, `http://127.0.0.1:PORT`.
    pub origin: String,
}

/// Logs in through a fresh one-time code (minted with the token).
///
/// # Errors
/// When minting or the login does not answer as documented.
pub async fn login(api: &Api) -> anyhow::Result<WebSession> {
    let minted = api.post_json("/v1/ui/login-codes", &json!({})).reply().await?.ok_json()?;
    let url = minted["url"].as_str().context("no url")?;
    let r = client().get(url).reply().await?;
    ensure!(r.status == 303, "login: {} {}", r.status, r.text);
    let header = |n: &str| r.headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let location = header("location");
    let key = location.split_once("#key=").with_context(|| format!("no key in {location:?}"))?.1.to_owned();
    ensure!(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()), "{location}");
    let set = header("set-cookie");
    let cookie = set.split(';').next().unwrap_or("").trim().to_owned();
    ensure!(cookie.starts_with("coffer_session="), "{set}");
    Ok(WebSession { cookie, key, origin: format!("http://127.0.0.1:{}", api.port()) })
}

impl WebSession {
    /// `method path` with the cookie and the console's `Origin`, and no key: what a page on
    /// another local port can send (it receives the cookie, not the key).
    pub fn cookie_only(&self, api: &Api, method: Method, path: &str) -> RequestBuilder {
        client().request(method, api.url(path)).header("Cookie", &self.cookie).header("Origin", &self.origin)
    }

    /// `method path` as the console sends it: cookie, key and `Origin`.
    pub fn request(&self, api: &Api, method: Method, path: &str) -> RequestBuilder {
        self.cookie_only(api, method, path).header("X-Coffer-Session-Key", &self.key)
    }

    /// A fresh stream ticket (`POST /v1/ui/stream-tickets`).
    ///
    /// # Errors
    /// When the edge does not answer 200 with a ticket.
    pub async fn ticket(&self, api: &Api) -> anyhow::Result<String> {
        let r = self.request(api, Method::POST, "/v1/ui/stream-tickets").reply().await?.ok_json()?;
        ensure!(r["expires_in_s"] == 30, "{r}");
        Ok(r["ticket"].as_str().with_context(|| format!("no ticket in {r}"))?.to_owned())
    }
}
