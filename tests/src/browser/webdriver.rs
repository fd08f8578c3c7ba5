//! A small client for the W3C WebDriver protocol (<https://www.w3.org/TR/webdriver2/>) over
//! plain HTTP on loopback, with chromedriver's two extensions the harness needs (its log
//! endpoint and its Chrome DevTools Protocol passthrough).
//!
//! Why not `fantoccini`: it fits the API, but its `webdriver` crate brings a second major of
//! `http` (0.2), `cookie` (0.16), `thiserror` (1) and the ICU 1.x stack (`icu_segmenter` with
//! its compiled data): about 90 crates and 14 duplicate majors for a dozen JSON-over-HTTP
//! calls. This module makes those calls with the `reqwest` client the tests already use.
use std::time::Duration;

use serde_json::{Value, json};
use thiserror::Error;

/// The key of a web element reference in WebDriver JSON (§ Elements).
pub const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long one WebDriver call may take (an async script has 30 s of its own).
const CALL_TIMEOUT: Duration = Duration::from_secs(90);

/// A failed WebDriver call.
#[derive(Debug, Error)]
pub enum WebDriverError {
    /// The driver answered with a WebDriver error (§ Errors): `error` is its code, such as
    /// `no such element`, `javascript error`, `stale element reference`.
    #[error("WebDriver {command}: {error}: {message}")]
    Protocol { command: String, error: String, message: String },
    /// The driver could not be reached or did not answer in time.
    #[error("WebDriver {command}: {source}")]
    Transport {
        command: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not the JSON the protocol promises.
    #[error("WebDriver {command}: unexpected answer: {body}")]
    Malformed { command: String, body: String },
}

impl WebDriverError {
    /// The WebDriver error code (`no such element`, …), if the driver sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Protocol { error, .. } => Some(error),
            _ => None,
        }
    }

    /// True for `no such element` (what a wait for an element retries on).
    pub fn is_no_such_element(&self) -> bool {
        self.code() == Some("no such element")
    }
}

/// One WebDriver session on a driver at `base` (`http://127.0.0.1:<port>`).
#[derive(Clone)]
pub struct Session {
    http: reqwest::Client,
    base: String,
    id: String,
}

impl Session {
    /// Opens a session with `capabilities` (§ New Session: sent as `alwaysMatch`).
    ///
    /// # Errors
    /// When the driver refuses (e.g. the browser binary cannot start).
    pub async fn create(http: reqwest::Client, base: &str, capabilities: Value) -> Result<Self, WebDriverError> {
        let body = json!({"capabilities": {"alwaysMatch": capabilities}});
        let v = call(&http, reqwest::Method::POST, &format!("{base}/session"), Some(body), "new session").await?;
        let id = v["sessionId"]
            .as_str()
            .ok_or_else(|| WebDriverError::Malformed { command: "new session".into(), body: v.to_string() })?
            .to_owned();
        Ok(Self { http, base: base.to_owned(), id })
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `method /session/{id}/<path>` with `body`; the answer's `value`.
    ///
    /// # Errors
    /// As [`WebDriverError`].
    pub async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, WebDriverError> {
        let url = format!("{}/session/{}/{}", self.base, self.id, path);
        let body = body.or_else(|| (method == reqwest::Method::POST).then(|| json!({})));
        call(&self.http, method, &url, body, path).await
    }

    /// `POST /session/{id}/<path>` with `body`.
    ///
    /// # Errors
    /// As [`WebDriverError`].
    pub async fn post(&self, path: &str, body: Value) -> Result<Value, WebDriverError> {
        self.cmd(reqwest::Method::POST, path, Some(body)).await
    }

    /// `GET /session/{id}/<path>`.
    ///
    /// # Errors
    /// As [`WebDriverError`].
    pub async fn get(&self, path: &str) -> Result<Value, WebDriverError> {
        self.cmd(reqwest::Method::GET, path, None).await
    }

    /// Ends the session (the browser quits).
    ///
    /// # Errors
    /// As [`WebDriverError`].
    pub async fn delete(&self) -> Result<(), WebDriverError> {
        let url = format!("{}/session/{}", self.base, self.id);
        call(&self.http, reqwest::Method::DELETE, &url, None, "delete session").await.map(drop)
    }
}

/// One WebDriver round trip: errors in the body become [`WebDriverError::Protocol`].
async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
    command: &str,
) -> Result<Value, WebDriverError> {
    let transport = |source| WebDriverError::Transport { command: command.to_owned(), source };
    let mut req = http.request(method, url).timeout(CALL_TIMEOUT);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.map_err(transport)?;
    let text = r.text().await.map_err(transport)?;
    let v: Value = serde_json::from_str(&text).map_err(|_| WebDriverError::Malformed {
        command: command.to_owned(),
        body: text.chars().take(500).collect(),
    })?;
    let value = v.get("value").cloned().unwrap_or(Value::Null);
    if let Some(error) = value.get("error").and_then(Value::as_str) {
        let message = value["message"].as_str().unwrap_or_default();
        // chromedriver appends a long native stack to some messages; the first lines say it.
        let message: String = message.lines().take(3).collect::<Vec<_>>().join(" / ");
        return Err(WebDriverError::Protocol { command: command.to_owned(), error: error.to_owned(), message });
    }
    Ok(value)
}

/// The element id inside a web element reference (`{"element-6066-…": id}`), if `v` is one.
pub fn element_id(v: &Value) -> Option<String> {
    v.get(ELEMENT_KEY).and_then(Value::as_str).map(str::to_owned)
}

/// Special keys of WebDriver's key table (§ Keyboard actions), for
/// [`super::Browser::press`].
pub mod keys {
    pub const BACKSPACE: &str = "\u{E003}";
    pub const TAB: &str = "\u{E004}";
    pub const ENTER: &str = "\u{E007}";
    pub const SHIFT: &str = "\u{E008}";
    pub const CONTROL: &str = "\u{E009}";
    pub const ALT: &str = "\u{E00A}";
    pub const ESCAPE: &str = "\u{E00C}";
    pub const SPACE: &str = "\u{E00D}";
    pub const PAGE_UP: &str = "\u{E00E}";
    pub const PAGE_DOWN: &str = "\u{E00F}";
    pub const END: &str = "\u{E010}";
    pub const HOME: &str = "\u{E011}";
    pub const ARROW_LEFT: &str = "\u{E012}";
    pub const ARROW_UP: &str = "\u{E013}";
    pub const ARROW_RIGHT: &str = "\u{E014}";
    pub const ARROW_DOWN: &str = "\u{E015}";
    pub const DELETE: &str = "\u{E017}";
}
