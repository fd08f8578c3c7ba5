//! Bodies of `/v1/events…`: the multiplexed event stream (the conversation list and any number
//! of conversations on one SSE connection; the web console holds one per browser).
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One subscription to add to a multiplexed stream: exactly one of `list` (the conversation
/// list, as `GET /v1/conversations/events`), `conversation` (its events, as
/// `GET /v1/conversations/{id}/events`, resumed after `after`) or `invocations` (the invocation
/// log live, as `GET /v1/invocations/events`: `invocation` and `lagged` frames).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Subscription {
    /// The client's name for this subscription: 1–64 of `A-Z a-z 0-9 _ . -`. Every frame of it
    /// carries it as `sub`; adding a key again (in a later request) replaces that
    /// subscription. One request may not give a key twice (400 naming it).
    pub sub: String,
    /// `true`: the conversation list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<bool>,
    /// A conversation id: its events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    /// With `conversation`: resume after this `seq` (the last one received on this
    /// subscription); 0 or absent: the in-flight turn's events so far, then live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// `true`: every invocation the gateway records from now on (`event: invocation`, the item
    /// of `GET /v1/invocations`; `event: lagged` `{"missed": n}` when this stream fell behind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocations: Option<bool>,
}

/// `POST /v1/events/{stream}`: subscriptions to add and to remove (by `sub`), without
/// reconnecting. Removals apply first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionChange {
    /// At most 64 subscriptions are open on one stream.
    #[serde(default)]
    pub add: Vec<Subscription>,
    /// `sub` keys; an unknown key is ignored (it may have ended already).
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A subscription that could not start (the others did).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Refused {
    pub sub: String,
    /// The error code it would have had alone (`NOT_FOUND` for an unknown conversation).
    pub code: String,
    pub message: String,
}

/// The answer of `POST /v1/events/{stream}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Subscriptions {
    /// The stream's subscriptions now (`sub` keys, sorted).
    pub subscriptions: Vec<String>,
    /// Additions that did not start.
    pub refused: Vec<Refused>,
}

/// `GET /v1/events/streams`: the chat event streams this daemon serves right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OpenStreams {
    /// Multiplexed streams (`GET /v1/events`).
    pub multiplexed: u64,
    /// Subscriptions over all multiplexed streams.
    pub subscriptions: u64,
    /// `GET /v1/conversations/{id}/events` streams.
    pub conversation: u64,
    /// `GET /v1/conversations/events` streams.
    pub list: u64,
}
