//! Bodies of `/v1/ui/…`: the web console's login codes, sessions and stream tickets.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `POST /v1/ui/login-codes` (the body is optional: no body is `{}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginCodeRequest {
    /// The page the login lands on: `chat` (default), `servers`, `tools`, `activity`,
    /// `knowledge` or `settings`; null or empty: the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = ["chat", "servers", "tools", "activity", "knowledge", "settings"], "default" = "chat"))]
    pub page: Option<String>,
    /// The origin the link opens at: one of the setting `ui.allowed_hosts`, named by its origin
    /// (`https://box.tail1234.ts.net`) or its host name (`box.tail1234.ts.net`); null or empty:
    /// `http://127.0.0.1:PORT`. Refused (`INVALID_ARGUMENT`, details `valid`) when not one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// The answer of `POST /v1/ui/login-codes`: a one-time code and the link to open.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LoginCode {
    /// 64 hex characters; works once.
    pub code: String,
    /// `http://127.0.0.1:PORT/ui/login?code=CODE` (plus `&next=/ui/PAGE`); with `host`, that
    /// origin instead of `http://127.0.0.1:PORT`.
    pub url: String,
    /// Seconds the code lives (`ui.login_code_ttl_s`).
    pub expires_in_s: u64,
}

/// How a request was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// A web session (the `coffer_session` cookie with its key).
    Cookie,
    /// The daemon's token.
    Token,
}

/// `GET /v1/ui/session`: how this request is signed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WebSession {
    pub via: Via,
}

/// The answer of `POST /v1/ui/stream-tickets`: a single-use ticket for one event stream
/// (`GET …?ticket=T` with the session's cookie).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StreamTicket {
    /// 64 hex characters.
    pub ticket: String,
    /// Seconds it works (30).
    pub expires_in_s: u64,
}

/// The answer of `DELETE /v1/ui/sessions`: how many web sessions ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Revoked {
    pub revoked: u64,
}
