//! The public HTTP surface described once: [`routes`] lists every route the edge answers
//! (method, path, parameters, body and answer, error codes). From that table come
//! `GET /v1/openapi.json` ([`document`], OpenAPI 3.1) and `docs/REST.md` ([`markdown`]).
//!
//! Every `/v1` body is a type of the `coffer-api` crate ([`Route::body_of`], [`Route::ok_of`],
//! [`page_of`]): its JSON Schema is derived (schemars) and lands in `components/schemas` under
//! the type's name, so the document says what the handler's type (de)serialises. Written here
//! by hand are only the error envelopes ([`schemas`]: `Error`, `JsonRpcError`) and `/mcp`'s
//! JSON-RPC messages, which the MCP specification describes ([`Route::body`], [`Route::ok`]);
//! a test refuses a hand-written body on any other route, and a name both derived and
//! hand-written.
//!
//! Tests keep the table honest: every route this crate's source registers must be in it with the
//! same methods (and nothing else may be), its error codes must be real [`Code`]s, its `$ref`s
//! must resolve, and `docs/REST.md` must equal [`markdown`] (`COFFER_UPDATE_DOCS=1 cargo test -p
//! coffer-gateway --lib openapi` rewrites it). The end-to-end suite then asks the running edge,
//! for every documented path, which methods it allows.
//!
//! A plain route table rather than utoipa's path macros: it reads in one place and a test
//! compares it with the router; the bodies' schemas are derived (see `coffer-api`'s crate docs
//! for why schemars).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Map, Value, json};

use coffer_api::schema::{self as api_schema, Components, Describe};
use schemars::JsonSchema;

use crate::error::Code;
use crate::state::AppState;

/// The route serving the document.
pub fn router() -> Router<Arc<AppState>> {
    Router::new().route("/v1/openapi.json", get(openapi_json))
}

/// `GET /v1/openapi.json` → the OpenAPI 3.1 document of this edge.
async fn openapi_json() -> Json<Value> {
    Json(document())
}

/// Where a parameter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum In {
    Path,
    Query,
    Header,
}

impl In {
    fn as_str(self) -> &'static str {
        match self {
            In::Path => "path",
            In::Query => "query",
            In::Header => "header",
        }
    }
}

/// One path, query or header parameter.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: &'static str,
    pub location: In,
    pub description: &'static str,
    pub schema: Value,
    pub required: bool,
}

/// A body's JSON Schema: derived from a `coffer-api` type, or (the remainder) written here.
#[derive(Clone)]
pub enum Schema {
    /// Described by a type through [`Components`] (a `$ref` to its named schema, or inline).
    Typed(Describe),
    /// A JSON Schema literal.
    Literal(Value),
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schema::Typed(_) => f.write_str("Typed"),
            Schema::Literal(v) => write!(f, "Literal({v})"),
        }
    }
}

impl From<Value> for Schema {
    fn from(v: Value) -> Self {
        Schema::Literal(v)
    }
}

impl Schema {
    /// The JSON Schema, registering a typed one's named schemas in `c`.
    pub fn resolve(&self, c: &mut Components) -> Value {
        match self {
            Schema::Typed(describe) => describe(c),
            Schema::Literal(v) => v.clone(),
        }
    }
}

/// The successful answer of a route.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub description: &'static str,
    /// JSON Schema of an `application/json` body; `None`: no body.
    pub json: Option<Schema>,
    /// Description of a `text/event-stream` alternative, when the route can stream.
    pub sse: Option<&'static str>,
    /// Other successful answers: `(status, description, body)`, the body `None` when it is the
    /// main answer's (`PUT /v1/credentials/{name}`: 201 created, 200 replaced).
    pub also: Vec<(u16, &'static str, Option<Schema>)>,
    /// A body that is not JSON (a file's bytes): `(media type, description)`.
    pub raw: Option<(&'static str, &'static str)>,
}

/// The wire format of a route's errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Errors {
    /// The REST envelope `{"error":{code, message, details}}`.
    Envelope,
    /// JSON-RPC error objects (`/mcp`).
    JsonRpc,
}

/// One documented route (one method on one path).
#[derive(Debug, Clone)]
pub struct Route {
    pub method: &'static str,
    /// axum path syntax, which is also OpenAPI's: `/v1/mcp/servers/{name}`.
    pub path: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    /// Markdown; may be empty.
    pub description: &'static str,
    pub params: Vec<Param>,
    /// JSON Schema of the `application/json` request body, when the route takes one.
    pub body: Option<Schema>,
    /// The body may be left out (every field of it is optional).
    pub body_optional: bool,
    pub answer: Answer,
    /// Envelope codes this route answers with besides the ones every route may give
    /// ([`COMMON_ERRORS`]).
    pub errors: &'static [&'static str],
    pub error_format: Errors,
    /// True for the one route that needs no token (`GET /v1/health`).
    pub open: bool,
}

/// Codes any authenticated route may answer with: a foreign `Host`/`Origin` (403), a missing
/// token (401), a body over the limit (413), an internal service restarting (503), a bug (500).
pub const COMMON_ERRORS: &[&str] =
    &["UNAUTHORIZED", "FORBIDDEN", "PAYLOAD_TOO_LARGE", "SERVICE_UNAVAILABLE", "INTERNAL"];

/// Tags in the order the documentation presents them, with a sentence each.
pub const TAGS: &[(&str, &str)] = &[
    ("daemon", "Health, status and lifecycle of the daemon and its services."),
    ("servers", "The MCP server registry and per-capability preferences."),
    ("tools", "The aggregated tools clients see, through the gateway's policy."),
    (
        "profiles",
        "Profiles: named views of the vault for a kind of client — which servers, tools and built-in tools its MCP sessions see (include/exclude globs), in which tool mode (`full` or `lazy`), with which tool overrides (rename, description, hidden parameters, annotations). A profile only narrows: a disabled tool stays hidden. `default` is the profile of a session that names none; its overrides apply in every profile.",
    ),
    ("credentials", "Encrypted credentials; values are write-only."),
    ("logs", "Invocation log, audit log and the processes' log files."),
    ("settings", "The daemon's flat map of string settings."),
    (
        "knowledge",
        "Knowledge bases: named folders of markdown (the files are the truth; indexes are derived), searched with the grep, keyword and vector engines, fused. Served by coffer-retrieval: while it is not running these routes answer 503 `SERVICE_UNAVAILABLE`.",
    ),
    ("memory", "Remembered facts: one markdown file each under `COFFER_HOME/memory/`, searched like a knowledge base."),
    ("skills", "Skills: `COFFER_HOME/skills/<name>/SKILL.md` with `name` and `description` front matter."),
    (
        "sync",
        "Sync across machines on git: `knowledge/` (Coffer-managed knowledge bases), `memory/`, `skills/` and the vault state as text (`vault/`: servers, preferences, settings but `sync.*`, LLM connections, channels — credentials as names only, never a value) go to a git remote the user already has, through the `git` command with the user's own authentication (Coffer never asks for a password). Served by coffer-retrieval: while it is not running these routes answer 503 `SERVICE_UNAVAILABLE`.",
    ),
    (
        "chat",
        "Conversations with the coding agents Coffer manages (Claude Code, Codex). A conversation has at most one turn in flight; a message sent meanwhile is queued (the pending queue, FIFO, one turn per message). Posting never streams: every screen watches `GET /v1/conversations/{id}/events`. Served by coffer-chat: while it is not running these routes answer 503 `SERVICE_UNAVAILABLE`. Archive and restore are `PATCH {\"archived\": true|false}`. A user message's `source` is the request's `X-Coffer-Actor` (`cli`, `api`, `ui`, …).",
    ),
    (
        "console",
        "The web console's login and sessions. The console itself is served under `/ui` (`/ui/<page>` for `chat`, `servers`, `tools`, `activity`, `knowledge`, `settings`; assets under `/ui/assets/`; `GET /ui/login?code=…[&next=/ui/<page>]` turns a one-time code into the `coffer_session` cookie — `HttpOnly; SameSite=Strict; Path=/`, 30 days idle — and redirects 303 to the page, or answers 401 with a page saying what to do). Those `GET`s need no token (they hold no data) and carry a strict `Content-Security-Policy`, `X-Content-Type-Options: nosniff` and `X-Frame-Options: DENY`. The cookie authenticates every other route like the token, except that a request it alone authenticates with a method other than GET/HEAD must carry our `Origin` (else 403).",
    ),
    (
        "llm",
        "LLM connections: where and how Coffer reaches a model provider (wire `anthropic`, `openai-responses`, `openai-chat` or `ollama`; base URL; the credential holding the key; model and fast model), and the one internal default the `coffer__ask` agent runs on. A connection never shows a key: `credential_ref` names a credential and `credential_set` says whether it has a value. `test` and `models` are served by coffer-chat (the one process that reads the key): while it is not running they answer 503 `SERVICE_UNAVAILABLE`.",
    ),
    (
        "channels",
        "IM channels (`telegram`: Bot API long polling; `seatalk`: webhooks through coffer-callback) the owner drives conversations from. A channel never shows a secret: `bot_token`, `app_id`, `app_secret` and `signing_secret` are write-once body fields stored as credentials (`*_ref` names them; `credentials_set` says which have a value); a secret in a query string is refused. Only the owner's chat is served: pairing issues a one-time code, and the first chat that sends `/pair <code>` to the bot becomes the owner. `adapter` is the live state coffer-chat reports (null while it does not answer). Changing a channel only changes the resource: coffer-chat's coordinator starts, stops and restarts adapters.",
    ),
    ("maintenance", "Backups, retention and this document."),
    ("mcp", "The MCP gateway itself (MCP Streamable HTTP; JSON-RPC errors)."),
];

// ---------------------------------------------------------------------------------------------
// Building blocks.

/// The description of `PATCH /v1/settings`, with the settings table (`coffer_types::settings`).
static SETTINGS_PATCH_DESCRIPTION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "Answers once the gateway's snapshot holds the change. Removing an absent key is not an error. \
`retention.*` settings apply at the next retention pass. Every key of `set` must be a setting Coffer reads \
(below) with a value it accepts, else `INVALID_ARGUMENT` with `details.key`, `details.problem` \
(`unknown_key`, `not_an_integer`, `out_of_range`, `bad_text`, `bad_url`) and `details.value` (and `details.known`, or \
`details.type`/`min`/`max`); with `force: true` other keys are stored as given (Coffer ignores them).\n\n{}",
        coffer_types::settings::markdown_table().trim_end()
    )
});

/// The description of `GET /v1/conversations/{id}/events`: the framing and every event kind
/// with an example.
const CHAT_EVENTS_DESCRIPTION: &str = r#"One SSE frame per event: `id: <seq>` (per conversation, strictly increasing, never going backwards, also across restarts; gaps are allowed), `event: <kind>`, `data: <the event as one line of JSON>`. Every event is `{seq, conversation_id, at_ms, turn_id, kind, <kind>: {…}}` (`turn_id` null outside a turn). With no `after` and no `Last-Event-ID` the stream starts with the in-flight turn's events so far; with one, with every retained event after it (no loss, no duplicate). It stays open between turns, with a `: keep-alive` comment after 15 s without an event. When the id is older than what is retained, the first event is `reset` (`too_old`): reload the conversation (`GET …/{id}`), then go on. A subscriber that falls behind gets `reset` (`lagged`) and the stream ends; so does every subscriber when the conversation is deleted (`deleted`). A client disconnecting never stops a turn.

| kind | when | its object |
|---|---|---|
| `message_created` | a user message was accepted (started or dequeued) | `{"message": Message}` |
| `turn_started` | the agent got the message | `{"user_message_id": "01J…", "assistant_message_id": "01J…", "agent_key": "claude_code"}` |
| `text_delta` | assistant text, token by token | `{"text": "Hel"}` |
| `tool_call` | the agent calls a tool (complete input) | `{"tool_use_id": "toolu_1", "name": "mcp__coffer__coffer__search_tools", "input": {"query": "issues"}}` |
| `tool_result` | the tool answered | `{"tool_use_id": "toolu_1", "output": "3 tools found", "is_error": false}` |
| `turn_done` | the turn ended (also when interrupted: `stop_reason` `interrupted`) | `{"stop_reason": "end_turn", "usage": Usage, "model": "claude-sonnet-4-5", "message": Message}` |
| `turn_error` | the turn failed (`code`: `provider`, `auth`, `cli_missing`, `cli_exited`, `protocol`, `timeout`, `internal`); the queue pauses | `{"code": "provider", "message": "the model API answered 500 …", "message_record": Message}` |
| `queue_changed` | the pending queue changed | `{"queue": PendingQueue}` |
| `reset` | reload the conversation: `too_old`, `lagged`, `deleted` | `{"reason": "lagged"}` |
| `approval_requested` | the agent waits for permission (mode `ask`); answer with `POST …/approvals/{number}` | `{"approval": {"number": 1042, "tool": "Bash", "summary": "Bash: rm -rf build", "input": {"command": "rm -rf build"}, "diff": null, "cwd": "/abs", "requested_ms": …, "expires_ms": …}}` (`number` is this event's `seq`) |
| `approval_resolved` | a request was decided (first answer wins) | `{"number": 1042, "decision": "deny", "message": "not now", "decided_by": "web", "actor": "session:3f2a…"}` (`decided_by`: `web`, `cli`, `api`, `channel:<name>`, `timeout`, `interrupt`, `turn_ended`) |
| `files_changed` | after a turn's end event, when the turn changed files in the conversation's folder (also stored as the assistant message's `files_changed`; a turn that changed nothing has none) | `{"files": [{"path": "src/a.rs", "change": "modified", "old_path": null, "additions": 40, "deletions": 12, "binary": false}], "truncated": false, "note": null, "message_id": "01J…"}` |

For example:

```text
id: 42
event: text_delta
data: {"seq":42,"conversation_id":"01JDQ8ZKXW5T3M2N4P6R7S8T9V","at_ms":1796031096123,"turn_id":"01JDQ9A0B1C2D3E4F5G6H7J8K9","kind":"text_delta","text_delta":{"text":"Hel"}}
```"#;

/// The description of `GET /v1/events`.
const MUX_EVENTS_DESCRIPTION: &str = r#"One SSE connection for the conversation list and any number of conversations: a browser opens at most six HTTP/1.1 connections per host, shared by its tabs, so the web console holds one such stream per browser (one tab holds it and passes events to the others) and its sends never wait for a free connection. Subscribe in the query (`list=KEY`, `conversation=KEY:ID[:AFTER]`, `invocations=KEY`: the invocation log live, as `GET /v1/invocations/events`; a KEY given twice, or an ID that is not a ULID, is 400 naming it and its parameter; more than 64 subscriptions is 400 with `details` `{limit, asked, open}`; more than 64 open streams is 429) and later with `POST /v1/events/{stream}`. The first frame is `event: hello` with `{"stream": ID, "subscriptions": [KEY…]}`. Every other frame is the frame the single-purpose stream would send (`GET /v1/conversations/{id}/events`, `GET /v1/conversations/events`) with `"sub": KEY` added to its JSON; a conversation frame's `id:` is `KEY:SEQ`. A subscription that ends (a final `reset`: `lagged`, `deleted`) or cannot start (an unknown conversation: `not_found`) gets `event: ended` `{sub, reason, message}`; the others go on. A list `reset` is sent once the list is watched afresh: reload the list on it. When the stream breaks (the chat service restarts, the edge, the network), reopen it with every subscription and each one's last `seq`: nothing is lost or sent twice. `: keep-alive` after 15 s without a frame."#;

/// The description of `GET /v1/conversations/events`.
const CONVERSATION_EVENTS_DESCRIPTION: &str = r#"The conversation list, live (what the web console's list follows). After every create, update (rename, model, archive, restore), delete, turn start and end, appended message and pending-queue change, one SSE frame: `event: conversation` with the conversation exactly as an item of `GET /v1/conversations` (live state included: `turn_running`, `pending_count`, `pending_paused`), or `event: deleted` with `{"id": "01J…"}`. Bursts are coalesced (a frame names the state at or after the change that caused it); every conversation is sent, archived or not: filter on `archived` and `title` as the list does. No `id:` lines and no resumption: the stream is live from when its response starts, so open it, then list. A subscriber that falls behind (256 changes) gets `event: reset` with `{"reason": "lagged"}` and the stream ends (`unavailable` when the chat service could not read a conversation): reload the list and reconnect. `: keep-alive` after 15 s without a change; the stream ends at shutdown.

```text
event: conversation
data: {"id":"01JDQ8ZKXW5T3M2N4P6R7S8T9V","agent_key":"claude_code","title":"Fix the build","archived":false,"turn_running":true,"pending_count":1,"pending_paused":false,…}

event: deleted
data: {"id":"01JDQ8ZKXW5T3M2N4P6R7S8T9V"}
```"#;

fn route(method: &'static str, path: &'static str, tag: &'static str, summary: &'static str) -> Route {
    Route {
        method,
        path,
        tag,
        summary,
        description: "",
        params: Vec::new(),
        body: None,
        body_optional: false,
        answer: Answer { status: 200, description: "OK", json: None, sse: None, also: Vec::new(), raw: None },
        errors: &[],
        error_format: Errors::Envelope,
        open: false,
    }
}

impl Route {
    fn describe(mut self, d: &'static str) -> Self {
        self.description = d;
        self
    }
    fn path_param(mut self, name: &'static str, description: &'static str) -> Self {
        let schema = json!({"type": "string"});
        self.params.push(Param { name, location: In::Path, description, schema, required: true });
        self
    }
    fn query(mut self, name: &'static str, schema: Value, description: &'static str) -> Self {
        self.params.push(Param { name, location: In::Query, description, schema, required: false });
        self
    }
    fn header(mut self, name: &'static str, description: &'static str) -> Self {
        let schema = json!({"type": "string"});
        self.params.push(Param { name, location: In::Header, description, schema, required: false });
        self
    }
    /// `X-Coffer-Actor`, the acting party the audit log records.
    fn actor(self) -> Self {
        self.header("X-Coffer-Actor", "Who acts, for the audit log: cli, api, ui, mcp, agent or channel (default api). A label only: the audit entry also records how the request was authenticated (`auth`).")
    }
    /// The acting party of a route served through the tool broker: its broker session, and the
    /// actor its invocations are recorded with.
    fn invocation_actor(self) -> Self {
        self.header(
            "X-Coffer-Actor",
            "Who acts: cli, api, ui, mcp, agent or channel (default api). The request is served in that actor's broker session and its invocations are recorded with it.",
        )
    }
    fn body(mut self, schema: Value) -> Self {
        self.body = Some(Schema::Literal(schema));
        self
    }
    /// The request body may be left out (an empty body reads as `{}`).
    fn body_optional(mut self) -> Self {
        self.body_optional = true;
        self
    }
    /// Another successful answer with the main answer's body.
    fn also(mut self, status: u16, description: &'static str) -> Self {
        self.answer.also.push((status, description, None));
        self
    }
    /// Another successful answer, with body `T`.
    fn also_of<T: JsonSchema>(mut self, status: u16, description: &'static str) -> Self {
        self.answer.also.push((status, description, Some(Schema::Typed(api_schema::response::<T>))));
        self
    }
    /// The request body is `T` (a `coffer-api` type), parsed by `JsonBody<T>`.
    pub fn body_of<T: JsonSchema>(mut self) -> Self {
        self.body = Some(Schema::Typed(api_schema::request::<T>));
        self
    }
    fn ok(mut self, status: u16, description: &'static str, schema: impl Into<Schema>) -> Self {
        self.answer = Answer { json: Some(schema.into()), status, description, ..self.answer };
        self
    }
    /// The answer is `T` (a `coffer-api` type) with `status`.
    pub fn ok_of<T: JsonSchema>(self, status: u16, description: &'static str) -> Self {
        self.ok(status, description, Schema::Typed(api_schema::response::<T>))
    }
    fn no_content(mut self, description: &'static str) -> Self {
        self.answer = Answer { status: 204, description, json: None, sse: None, also: Vec::new(), raw: None };
        self
    }
    fn sse(mut self, description: &'static str) -> Self {
        self.answer.sse = Some(description);
        self
    }
    /// The answer is `media` bytes, not JSON (what they are: `description`).
    fn raw(mut self, status: u16, media: &'static str, description: &'static str) -> Self {
        self.answer.status = status;
        self.answer.raw = Some((media, description));
        self
    }
    fn errors(mut self, codes: &'static [&'static str]) -> Self {
        self.errors = codes;
        self
    }
    fn open(mut self) -> Self {
        self.open = true;
        self
    }
}

/// A list answer of `coffer-api` type `T`: `{items: [T], next_cursor}`.
fn page_of<T: JsonSchema>() -> Schema {
    Schema::Typed(api_schema::response::<coffer_api::Page<T>>)
}

fn limit_param(r: Route) -> Route {
    r.query("limit", json!({"type": "integer", "minimum": 1, "maximum": 500, "default": 50}), "Page size.").query(
        "cursor",
        json!({"type": "string"}),
        "`next_cursor` of the previous page.",
    )
}

const SERVER_NAME: &str = "Server name (`^[a-z0-9][a-z0-9-]{0,23}$`).";
const LLM_NAME: &str = "Connection name (`^[a-z0-9][a-z0-9-]{0,31}$`).";
const PROFILE_NAME: &str = "Profile name (`^[a-z0-9][a-z0-9-]{0,31}$`); `default` always exists.";
const CHANNEL_NAME: &str = "Channel name (`^[a-z0-9][a-z0-9-]{0,31}$`).";

// ---------------------------------------------------------------------------------------------
// The table.

/// Every route of the edge, in documentation order.
pub fn routes() -> Vec<Route> {
    vec![
        // Daemon.
        route("GET", "/v1/health", "daemon", "Liveness of the daemon")
            .describe("Needs no token and touches no other service. `pid` is the supervisor's (the one in `daemon.json`).")
            .ok_of::<coffer_api::daemon::Health>(200, "The daemon is up.")
            .open(),
        route("GET", "/v1/status", "daemon", "Daemon, services and upstreams")
            .ok_of::<coffer_api::daemon::Status>(200, "Current status."),
        route("POST", "/v1/daemon/stop", "daemon", "Stop the daemon")
            .describe("Answers first, then the daemon stops its services in order and exits.")
            .ok_of::<coffer_api::daemon::Stopping>(202, "Stopping."),
        route("POST", "/v1/daemon/services/{name}/restart", "daemon", "Restart one service")
            .describe("Answers once the service is healthy again (or has given up). For `gateway`, which serves this request, answers 202 `{\"restarting\":\"gateway\"}` at once and restarts right after; poll `GET /v1/health`.")
            .path_param("name", "`store`, `chat`, `retrieval` or `gateway`.")
            .ok_of::<coffer_api::daemon::ServiceRestart>(200, "The service after the restart.")
            .also_of::<coffer_api::daemon::Restarting>(202, "`gateway`: it restarts right after answering.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        // Servers.
        route("GET", "/v1/mcp/servers", "servers", "List MCP servers")
            .describe("Sorted by name; one page.")
            .ok(200, "The registry.", page_of::<coffer_api::servers::McpServer>()),
        route("POST", "/v1/mcp/servers", "servers", "Register an MCP server")
            .describe("A stdio `command` that is a bare name is resolved on the daemon's `PATH`. `env` and `headers` values are strings or `{\"credential_ref\": name}`; a reference to a credential that does not exist is refused. Answers with `ETag` and `Location`.")
            .actor()
            .body_of::<coffer_api::servers::McpServerCreate>()
            .ok_of::<coffer_api::servers::McpServer>(201, "Registered.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "ALREADY_EXISTS"]),
        route("GET", "/v1/mcp/servers/{name}", "servers", "Get one MCP server")
            .describe("With `ETag: \"<version>\"`.")
            .path_param("name", SERVER_NAME)
            .ok_of::<coffer_api::servers::McpServer>(200, "The server.")
            .errors(&["NOT_FOUND"]),
        route("PATCH", "/v1/mcp/servers/{name}", "servers", "Change an MCP server")
            .describe("Absent fields stay; `cwd`, `timeout_s`, `timeout_ms` set to null restore the default; `args`, `env`, `headers` replace the whole list or map. The server keeps its tool preferences (`coffer mcp edit` uses this). With `If-Match: \"<version>\"` the write happens only at that version.")
            .path_param("name", SERVER_NAME)
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .actor()
            .body_of::<coffer_api::servers::McpServerPatch>()
            .ok_of::<coffer_api::servers::McpServer>(200, "The server after the change, with its new ETag.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("DELETE", "/v1/mcp/servers/{name}", "servers", "Remove an MCP server")
            .describe("Removes its preferences too. Honours `If-Match`.")
            .path_param("name", SERVER_NAME)
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .actor()
            .no_content("Removed.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT"]),
        route("GET", "/v1/mcp/servers/{name}/log", "servers", "Tail (or follow) a server's stderr log")
            .describe("The last `n` lines the server's stdio process wrote on stderr (`COFFER_HOME/logs/upstreams/NAME.log`, credential values redacted; `file` is null and `lines` empty when it has written none, as for HTTP servers and the built-in `coffer`). With `follow=true` the answer is an SSE stream: `event: file` (data: the path) whenever the file is (re)opened, then `event: line` per line, the tail first, then new lines; a log rotated when the server restarts is followed.")
            .path_param("name", "Server name.")
            .query("n", json!({"type": "integer", "minimum": 1, "default": 200}), "Lines (at most 10000 are served).")
            .query("follow", json!({"type": "boolean", "default": false}), "Stream new lines (SSE).")
            .ok_of::<coffer_api::logs::ServerLogTail>(200, "The tail.")
            .sse("With `follow=true`: `file` and `line` events.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("GET", "/v1/mcp/servers/{name}/preferences", "servers", "A server's explicit preferences")
            .describe("Only explicit flags: a capability without one is enabled. `coffer` names the built-in server.")
            .path_param("name", SERVER_NAME)
            .ok(200, "The preferences.", page_of::<coffer_api::tools::Preference>())
            .errors(&["NOT_FOUND"]),
        route("PUT", "/v1/mcp/servers/{name}/capabilities/{kind}", "servers", "Enable or disable a capability named in the query")
            .describe("For names a path segment carries badly (resource URIs with `/`).")
            .path_param("name", SERVER_NAME)
            .path_param("kind", "`tool`, `prompt` or `resource` (plurals accepted).")
            .query("name", json!({"type": "string"}), "The capability's original (unprefixed) name. Required.")
            .actor()
            .body_of::<coffer_api::tools::EnabledFlag>()
            .ok_of::<coffer_api::tools::PreferenceSet>(200, "The preference.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("PUT", "/v1/mcp/servers/{name}/capabilities/{kind}/{capname}", "servers", "Enable or disable a capability")
            .path_param("name", SERVER_NAME)
            .path_param("kind", "`tool`, `prompt` or `resource` (plurals accepted).")
            .path_param("capname", "The capability's original (unprefixed) name, percent-encoded.")
            .actor()
            .body_of::<coffer_api::tools::EnabledFlag>()
            .ok_of::<coffer_api::tools::PreferenceSet>(200, "The preference.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("GET", "/v1/mcp/servers/{name}/capabilities", "servers", "A server's live capabilities")
            .describe("Fetched through the caller's tool-broker session (starting the upstream if needed), each with its enabled flag.")
            .path_param("name", SERVER_NAME)
            .invocation_actor()
            .ok_of::<coffer_api::servers::Capabilities>(200, "Tools and prompts of the upstream.")
            .errors(&["NOT_FOUND", "UPSTREAM_UNAVAILABLE"]),
        route("GET", "/v1/mcp/servers/{name}/auth", "servers", "An HTTP server's OAuth sign-in")
            .describe("Where its OAuth sign-in stands (MCP 2025-11-25 basic/authorization): `none`, `signed_in` (issuer, scope, expiry; never a token) or `needs_sign_in` (why, and the command that signs in), with the latest browser sign-in since the daemon started. With `wait_s`, a pending sign-in is waited for until it ends.")
            .path_param("name", SERVER_NAME)
            .query("wait_s", json!({"type": "integer", "minimum": 0, "maximum": 60}), "Wait at most this long (s) for a pending sign-in to end.")
            .ok_of::<coffer_api::servers::ServerAuth>(200, "The sign-in state.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("POST", "/v1/mcp/servers/{name}/auth", "servers", "Start a browser sign-in to an HTTP server")
            .describe("Discovers the server's authorization server (its `401` challenge's `resource_metadata`, RFC 9728, else the well-known URIs; RFC 8414 or OpenID metadata), registers Coffer as a client (RFC 7591) unless `client_id` or `client_metadata_url` says otherwise, and listens on a loopback port for the browser's one redirect. Answers with the `authorization_url` to open (PKCE S256, `state`, RFC 8707 `resource`, the scopes the server asks for). The tokens go to credential `oauth.NAME`. A sign-in already running for the server stops. 502 `UPSTREAM_UNAVAILABLE` names the discovery or registration step that failed.")
            .path_param("name", SERVER_NAME)
            .body_of::<coffer_api::servers::SignInRequest>()
            .ok_of::<coffer_api::servers::ServerAuth>(200, "The sign-in, pending.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "UPSTREAM_UNAVAILABLE", "SERVICE_UNAVAILABLE"]),
        route("DELETE", "/v1/mcp/servers/{name}/auth", "servers", "Sign out of an HTTP server")
            .describe("Deletes the stored grant (credential `oauth.NAME`) and stops a sign-in in progress.")
            .path_param("name", SERVER_NAME)
            .no_content("Signed out.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "SERVICE_UNAVAILABLE"]),
        route("POST", "/v1/mcp/servers/{name}/test", "servers", "Probe a server in a fresh session")
            .describe("Starts the server once without any cache. A server that fails still answers 200 with `ok: false` and the error.")
            .path_param("name", SERVER_NAME)
            .ok_of::<coffer_api::servers::ProbeReport>(200, "The probe's report.")
            .errors(&["NOT_FOUND"]),
        route("GET", "/v1/mcp/servers/{name}/catalog", "servers", "What the capability catalog holds of a server")
            .describe("The counts of the lists new sessions are answered from (kept across restarts in `COFFER_HOME/cache/catalog.json`). With `wait_ms`, first waits until the catalog has listed the server afresh (starting it in the background if nobody is) or failed to: `coffer mcp add` uses it so that a client started right after registering sees the server's tools.")
            .path_param("name", SERVER_NAME)
            .query("wait_ms", json!({"type": "integer", "minimum": 0, "maximum": 120000}), "Wait at most this long (ms) for a fresh list; 0 or absent: answer at once.")
            .ok_of::<coffer_api::servers::CatalogState>(200, "The catalog's state of the server.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("POST", "/v1/mcp/refresh", "servers", "Refresh every session's capability lists")
            .describe("Invalidates the 60 s capability caches; every client is told its lists changed.")
            .ok_of::<coffer_api::tools::Refreshed>(200, "How many sessions were refreshed."),
        route("GET", "/v1/mcp/registry/servers", "servers", "Search the MCP Registry")
            .describe("The latest version of each server of the MCP Registry (the `gateway.mcp_registry_url` setting; empty: the official registry) whose name contains `search`, with every package and remote it offers, whether this machine can run each (`npx`, `uvx`, `docker`/`podman` on the PATH) and the inputs each asks for. What the registry answers is checked: at most 4 MiB, within 20 s, the documented types (a mistake is named with its path).")
            .query("search", json!({"type": "string", "maxLength": 200}), "Part of the server's registry name.")
            .query("limit", json!({"type": "integer", "minimum": 1, "maximum": 100}), "At most this many (default 30).")
            .query("cursor", json!({"type": "string"}), "The `next_cursor` of the previous page.")
            .ok(200, "The servers found.", page_of::<coffer_api::registry::RegistryServer>())
            .errors(&["INVALID_ARGUMENT", "UPSTREAM_UNAVAILABLE"]),
        route("GET", "/v1/mcp/registry/servers/{name}", "servers", "One server of the MCP Registry")
            .path_param("name", "The registry's name, percent-encoded (`io.github.user%2Fweather`).")
            .query("version", json!({"type": "string"}), "A version; default the latest.")
            .ok_of::<coffer_api::registry::RegistryServer>(200, "The server, its options and their inputs.")
            .errors(&["NOT_FOUND", "UPSTREAM_UNAVAILABLE"]),
        route("POST", "/v1/mcp/registry/install", "servers", "Install a server from the MCP Registry")
            .describe("Fetches the entry, picks the option (`option`, default the first package this machine can run, else the first remote), fills its inputs from `inputs` (required ones must be given; defaults apply), stores every secret input as a credential `<server>.<input>` referenced from the server's `env` or `headers`, and registers the server. A package becomes a stdio server run by `npx -y NAME@VERSION`, `uvx NAME==VERSION` or `docker run -i --rm IMAGE:VERSION`; a remote an `http` or `sse` server. Package names, versions and variable names with characters their ecosystem does not allow are refused. Nothing stays behind when a step fails. Wait for its first list with `GET /v1/mcp/servers/{name}/catalog?wait_ms=`.")
            .actor()
            .body_of::<coffer_api::registry::RegistryInstall>()
            .ok_of::<coffer_api::registry::RegistryInstalled>(201, "What was registered, and the credentials created.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "NOT_FOUND", "ALREADY_EXISTS", "UPSTREAM_UNAVAILABLE"]),
        route("POST", "/v1/mcp/import", "servers", "Import the MCP servers of another client's config")
            .describe("Claude Desktop, Claude Code, Cursor and VS Code formats. Secret-looking `env`/`headers` values become credentials referenced by the new servers. An entry with `${VAR}` references is invalid (its reason names every one) unless `variables` are sent: then `${VAR}`, `${env:VAR}` and `${VAR:-default}` are expanded, and an `env`/`headers` value expanded so becomes a credential too. An entry whose name only normalises to a registered one (`Git_Server` → `git-server`) is a duplicate when it is the same server (transport, command, args, url), else it is imported as `git-server-2` with a warning saying so. Answers 200 even when some or all entries are not imported; with `dry_run` nothing is written.")
            .actor()
            .body_of::<coffer_api::servers::McpImport>()
            .ok_of::<coffer_api::servers::ImportReport>(200, "What was (or would be) imported, and what was not and why.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        // Tools.
        route("GET", "/v1/tools", "tools", "The aggregated tools")
            .describe("What clients see: exposed names (`<server>__<tool>`) with original names and enabled flags.")
            .query("server", json!({"type": "string"}), "Only this server's tools.")
            .invocation_actor()
            .ok(200, "The tools.", page_of::<coffer_api::tools::Tool>()),
        route("POST", "/v1/tools/call", "tools", "Call a tool")
            .describe("Through the tool broker: the same routing, policy and invocation log as `/mcp`, recorded with the request's actor (`api`, `cli` from the CLI). The result is the upstream's `CallToolResult`, verbatim (a tool error is `isError: true` with 200). An upstream JSON-RPC error is 502 with the error in `details`.")
            .invocation_actor()
            .body_of::<coffer_api::tools::ToolCall>()
            .ok_of::<coffer_api::tools::CallToolResult>(200, "The tool's result.")
            .errors(&["TOOL_DISABLED", "NOT_FOUND", "UPSTREAM_UNAVAILABLE", "UPSTREAM_TIMEOUT", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("PATCH", "/v1/tools/{name}", "tools", "Enable or disable a tool by its exposed name")
            .describe("Answers once the gateway's policy holds the change. The name is resolved without the policy check, starting at most the upstream its `<server>__` prefix names.")
            .path_param("name", "Exposed name (`<server>__<tool>`).")
            .actor()
            .body_of::<coffer_api::tools::EnabledFlag>()
            .ok_of::<coffer_api::tools::ToolState>(200, "The tool's new state.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        // Credentials.
        route("GET", "/v1/credentials", "credentials", "List credentials")
            .describe("Names and versions, sorted by name; never a value.")
            .ok(200, "The credentials.", page_of::<coffer_api::credentials::Credential>()),
        route("GET", "/v1/credentials/{name}", "credentials", "One credential's metadata")
            .path_param("name", "Credential name (`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`).")
            .ok_of::<coffer_api::credentials::Credential>(200, "Its metadata; never the value.")
            .errors(&["NOT_FOUND"]),
        route("PUT", "/v1/credentials/{name}", "credentials", "Set a credential")
            .describe("Creates (201) or replaces (200, version + 1) the value, encrypted under `secret.key`. The value is never echoed, logged or quoted in an error.")
            .path_param("name", "Credential name (`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`).")
            .actor()
            .body_of::<coffer_api::credentials::CredentialPut>()
            .header("If-None-Match", "`*`: create only; a credential of that name is left as it is (409 `ALREADY_EXISTS`).")
            .ok_of::<coffer_api::credentials::CredentialSet>(200, "Replaced.")
            .also(201, "Created.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "CONFLICT", "ALREADY_EXISTS"]),
        route("DELETE", "/v1/credentials/{name}", "credentials", "Remove a credential")
            .describe("Servers that reference it then fail to start, naming it, until it is set again.")
            .path_param("name", "Credential name.")
            .actor()
            .no_content("Removed.")
            .errors(&["NOT_FOUND"]),
        // Logs.
        limit_param(
            route("GET", "/v1/invocations", "logs", "The invocation log")
                .describe("Newest first. Never arguments or results. Times: RFC 3339, a date (`2026-11-30`) or a duration ago (`15m`, `2h`, `7d`).")
                .query("server", json!({"type": "string"}), "Only this server.")
                .query("target", json!({"type": "string"}), "Only this exposed name or URI.")
                .query("outcome", json!({"enum": coffer_types::Outcome::NAMES}), "Only this outcome.")
                .query("actor", json!({"type": "string"}), "Only calls by this actor (`mcp`: MCP client sessions).")
                .query("client", json!({"type": "string"}), "Only calls by MCP clients of this `clientInfo` name (exact), e.g. `claude-code`.")
                .query("conversation", json!({"type": "string"}), "Only calls made by the agent of this conversation (its id, a ULID; anything else is 400 naming it).")
                .query("since", json!({"type": "string"}), "Inclusive lower bound.")
                .query("until", json!({"type": "string"}), "Exclusive upper bound."),
        )
        .ok(200, "A page of invocations.", page_of::<coffer_api::logs::Invocation>())
        .errors(&["INVALID_ARGUMENT"]),
        limit_param(
            route("GET", "/v1/audit", "logs", "The audit log")
                .describe("Who changed what, newest first.")
                .query("actor", json!({"enum": ["cli", "api", "ui", "mcp", "agent", "channel", "daemon"]}), "Only this actor.")
                .query("action", json!({"type": "string"}), "Only this action, e.g. `server.create`."),
        )
        .ok(200, "A page of audit entries.", page_of::<coffer_api::logs::AuditEntry>())
        .errors(&["INVALID_ARGUMENT"]),
        route("GET", "/v1/logs/{service}", "logs", "Tail (or follow) a process's log")
            .describe("The last `n` lines of the service's newest log file. With `follow=true` the answer is an SSE stream: `event: file` (data: the path) whenever the file is (re)opened, then `event: line` per line, the tail first, then new lines; rotation is followed.")
            .path_param("service", "`daemon`, `gateway`, `store`, `chat`, `retrieval` or `callback`.")
            .query("n", json!({"type": "integer", "minimum": 1, "default": 200}), "Lines (at most 10000 are served).")
            .query("follow", json!({"type": "boolean", "default": false}), "Stream new lines (SSE).")
            .ok_of::<coffer_api::logs::LogTail>(200, "The tail.")
            .sse("With `follow=true`: `file` and `line` events.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("GET", "/v1/invocations/events", "logs", "Follow the invocation log live (SSE)")
            .describe("An SSE stream: `event: invocation` per call as the gateway records it, `data` one item exactly as `GET /v1/invocations` lists it (`id` included). Invocations are written in batches, so an event comes up to about 200 ms after its call ended. A client that falls too far behind gets `event: lagged` (data `{\"missed\": n}`) and the stream goes on: list the log to catch up. `: keep-alive` comments after 15 s without an event; the stream ends at shutdown.")
            .query("server", json!({"type": "string"}), "Only this server.")
            .query("outcome", json!({"enum": coffer_types::Outcome::NAMES}), "Only this outcome.")
            .sse("`invocation` events (data: an [Invocation](#invocation)), `lagged` events.")
            .errors(&["INVALID_ARGUMENT"]),
        // The web console.
        route("POST", "/v1/ui/login-codes", "console", "Mint a one-time login link")
            .describe("The code works once and lives `ui.login_code_ttl_s` seconds (60 by default). Needs the token: a web session cannot mint codes (403). The body is optional. With `host` (one of the setting `ui.allowed_hosts`, by origin or host name) the link opens at that origin, for another device (docs/REMOTE.md); any other `host` is `INVALID_ARGUMENT` with `details.valid` listing the allowed origins.")
            .body_of::<coffer_api::console::LoginCodeRequest>()
            .body_optional()
            .ok_of::<coffer_api::console::LoginCode>(200, "The code and the link to open.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("GET", "/v1/ui/session", "console", "How this request is signed in")
            .ok_of::<coffer_api::console::WebSession>(200, "`cookie` for a web session, `token` otherwise."),
        route("POST", "/v1/ui/stream-tickets", "console", "A single-use ticket for one event stream")
            .describe("For a web session only (the token gets 403: it authenticates streams itself). `EventSource` cannot send `X-Coffer-Session-Key`, so the page asks for a ticket and opens the stream as `GET …?ticket=T` with its cookie. A ticket works once, within `expires_in_s` (30), and only with the cookie of the session that asked for it; it is kept in memory only and never logged.")
            .ok_of::<coffer_api::console::StreamTicket>(200, "The ticket.")
            .errors(&["FORBIDDEN"]),
        route("DELETE", "/v1/ui/sessions", "console", "Sign every browser out")
            .describe("Ends every web session, in memory and in `COFFER_HOME/web-sessions.json`, before answering.")
            .ok_of::<coffer_api::console::Revoked>(200, "How many sessions ended."),
        // Settings.
        route("GET", "/v1/settings", "settings", "Every setting")
            .ok_of::<coffer_api::settings::SettingsValues>(200, "The settings, keys sorted."),
        route("GET", "/v1/settings/table", "settings", "The settings table")
            .describe("Every setting Coffer reads, in display order (each section's rows together: `group`, with its `group_title` and `group_help`), with its human `label`, type, default (the string it would be stored as), bounds (an integer's values, a text's bytes), unit and meaning: what a form needs to check a value before `PATCH /v1/settings`.")
            .ok(200, "The settings table.", page_of::<coffer_api::settings::SettingInfo>()),
        route("PATCH", "/v1/settings", "settings", "Set and remove settings")
            .describe(SETTINGS_PATCH_DESCRIPTION.as_str())
            .actor()
            .body_of::<coffer_api::settings::SettingsPatch>()
            .ok_of::<coffer_api::settings::SettingsValues>(200, "The settings after the patch.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        // Knowledge.
        route("GET", "/v1/knowledge", "knowledge", "List knowledge bases and engines")
            .describe("Every knowledge base (the memory one too, kind `memory`) with its counts, progress and file errors, and how each engine is configured.")
            .ok_of::<coffer_api::knowledge::KnowledgeBases>(200, "The knowledge bases."),
        route("POST", "/v1/knowledge", "knowledge", "Add a knowledge base")
            .describe("Without `path`, the folder is `COFFER_HOME/knowledge/<name>/` (created); with one, an existing folder (absolute; canonicalized). Indexing starts in the background: follow it with `GET /v1/knowledge/{kb}`. `search` and `reindex` cannot be names.")
            .body_of::<coffer_api::knowledge::KnowledgeBaseCreate>()
            .ok_of::<coffer_api::knowledge::KnowledgeBaseInfo>(201, "Added.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "CONFLICT"]),
        route("GET", "/v1/knowledge/{kb}", "knowledge", "One knowledge base")
            .describe("With its indexing `progress` and the files it could not index (`errors`).")
            .path_param("kb", "Knowledge base name (`^[a-z0-9][a-z0-9_-]{0,63}$`, or `memory`).")
            .ok_of::<coffer_api::knowledge::KnowledgeBaseInfo>(200, "The knowledge base.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("PATCH", "/v1/knowledge/{kb}", "knowledge", "Mark a knowledge base writable")
            .describe("`writable: true` lets `coffer__write_note` write notes into the user's own folder (atomic writes, secret checks, `.md` only); `false` makes it read-only again. A knowledge base under `COFFER_HOME/knowledge/` is always writable; memory cannot be marked (409).")
            .path_param("kb", "Knowledge base name.")
            .body_of::<coffer_api::knowledge::KnowledgeBasePatch>()
            .ok_of::<coffer_api::knowledge::KnowledgeBaseInfo>(200, "The knowledge base.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("GET", "/v1/knowledge/{kb}/note", "knowledge", "Read a note")
            .describe("One note's lines (all, or `start_line`..`end_line`; at most 2,000 lines or 64 KiB, `next` says how to read on; a longer line is cut, `cut_at_byte` says where and `start_byte` reads on in it), its title, tags (front matter and inline `#tags`), its `[[wikilinks]]` resolved Obsidian's way (file name, then alias, then path) and its backlinks. A path with `..`, an absolute one or a symbolic link out of the folder is `INVALID_ARGUMENT`.")
            .path_param("kb", "Knowledge base name.")
            .query("path", json!({"type": "string"}), "The note's path relative to the knowledge base root.")
            .query("start_line", json!({"type": "integer", "minimum": 1}), "First line, 1-based (default 1).")
            .query("end_line", json!({"type": "integer", "minimum": 1}), "Last line, inclusive (default: the end).")
            .query("start_byte", json!({"type": "integer", "minimum": 0}), "Bytes of `start_line` to skip (default 0): reads on in a line longer than 64 KiB, from the `cut_at_byte` the previous answer gave.")
            .ok_of::<coffer_api::knowledge::Note>(200, "The note.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("DELETE", "/v1/knowledge/{kb}", "knowledge", "Remove a knowledge base")
            .describe("Forgets it and its indexes; never deletes a file. The memory knowledge base cannot be removed (409).")
            .path_param("kb", "Knowledge base name.")
            .ok_of::<coffer_api::knowledge::Removed>(200, "Removed.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT"]),
        route("POST", "/v1/knowledge/reindex", "knowledge", "Rebuild indexes from the files")
            .describe("Every knowledge base when `kb` is absent; `clean` drops the index first. Answers at once; the pass runs in the background (`progress` in `GET /v1/knowledge/{kb}`).")
            .body_of::<coffer_api::knowledge::Reindex>()
            .ok_of::<coffer_api::knowledge::ReindexStarted>(202, "The pass started.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("POST", "/v1/knowledge/search", "knowledge", "Search knowledge bases")
            .describe("Every enabled engine (grep, keyword, vector) runs concurrently and the results are fused (reciprocal rank fusion; `fusion` names the constant). An engine that failed or timed out is reported in `engines` and `warnings`; the others' results still come back. Memory is searched only when `kb` names it. The query is 1-8192 bytes (else `INVALID_ARGUMENT`); punctuation and FTS5 syntax in it are taken as text.")
            .body_of::<coffer_api::knowledge::SearchRequest>()
            .ok_of::<coffer_api::knowledge::SearchReply>(200, "The fused results.")
            .errors(&["INVALID_ARGUMENT", "NOT_FOUND", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        // Sync.
        route("POST", "/v1/sync/init", "sync", "Set up sync with a git remote")
            .describe("Creates (or adopts) the sync repository (`COFFER_HOME/sync.git`, work tree `COFFER_HOME` limited to `knowledge/`, `memory/`, `skills/`, `vault/`), sets `remote` as its origin (a new repository uses the remote's default branch, what its `HEAD` names, even in an empty bare repository; else `main`), commits this machine's state and syncs: on a second machine the remote's history is merged with what this one has (conflicts kept). `remote` is a git URL (https, ssh, scp-like, file); not an option, not `ext::`.")
            .body_of::<coffer_api::sync::SyncInit>()
            .ok_of::<coffer_api::sync::SyncReport>(200, "Synced.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "CONFLICT", "UPSTREAM_UNAVAILABLE"]),
        route("POST", "/v1/sync", "sync", "Sync now")
            .describe("Commits local changes, fetches, merges (a file edited on both sides keeps both: the other version as `name.conflict-<machine>-<date>.ext`; a vault entry changed on both sides keeps the newer by `updated_at`, the other goes to the audit log as `sync.conflict`), applies the vault state, re-indexes what changed and pushes. 409 `CONFLICT` before `init`; 502 `UPSTREAM_UNAVAILABLE` with git's message when the remote cannot be reached (local changes stay committed; nothing is lost); 400 `INVALID_ARGUMENT` naming a malformed vault file pulled (nothing applied, the merge undone).")
            .ok_of::<coffer_api::sync::SyncReport>(200, "Synced; `conflicts` lists what needs a look.")
            .errors(&["CONFLICT", "UPSTREAM_UNAVAILABLE", "INVALID_ARGUMENT"]),
        route("GET", "/v1/sync/status", "sync", "Sync status")
            .describe("Whether sync is set up, the remote, ahead/behind as of the last fetch, the last sync and its error, the conflict siblings still present, the worker (`sync.auto`) and credentials the synced vault references that have no value here (set them here).")
            .ok_of::<coffer_api::sync::SyncStatus>(200, "The status."),
        // Memory.
        limit_param(
            route("GET", "/v1/memory", "memory", "List remembered facts")
                .describe("Newest first.")
                .query("tag", json!({"type": "string"}), "Only facts with this tag; repeat for several (all must match)."),
        )
        .ok(200, "A page of facts.", page_of::<coffer_api::knowledge::Fact>())
        .errors(&["INVALID_ARGUMENT"]),
        route("POST", "/v1/memory", "memory", "Remember a fact")
            .describe("Writes `COFFER_HOME/memory/<id>.md` atomically (the id is a server-side ULID) and indexes it. An exact or near duplicate of an existing fact is not saved again: the answer is 200 with that fact, `created: false` and the `similarity`. `source` defaults to the request's actor (`X-Coffer-Actor`).")
            .actor()
            .body_of::<coffer_api::knowledge::FactCreate>()
            .ok_of::<coffer_api::knowledge::RememberReply>(201, "Remembered.")
            .also(200, "A duplicate: the existing fact, `created: false` and the `similarity`.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("GET", "/v1/memory/{id}", "memory", "One fact")
            .path_param("id", "The fact's id: a ULID, or a hand-written note's file name without `.md`.")
            .ok_of::<coffer_api::knowledge::Fact>(200, "The fact.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("DELETE", "/v1/memory/{id}", "memory", "Forget a fact")
            .describe("Removes its file and its index entries.")
            .path_param("id", "The fact's id: a ULID, or a hand-written note's file name without `.md`.")
            .ok_of::<coffer_api::knowledge::Removed>(200, "Forgotten (`removed` is 1).")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("POST", "/v1/memory/recall", "memory", "Search remembered facts")
            .describe("The same engines and fusion as a knowledge search, over memory only; each result carries its `fact_id`.")
            .body_of::<coffer_api::knowledge::RecallRequest>()
            .ok_of::<coffer_api::knowledge::SearchReply>(200, "The fused results.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        // Skills.
        route("GET", "/v1/skills", "skills", "List skills")
            .describe("A skill whose front matter is malformed is not listed; it is named in `invalid` with the reason.")
            .ok_of::<coffer_api::skills::Skills>(200, "The skills."),
        route("GET", "/v1/skills/{name}", "skills", "One skill, in full")
            .path_param("name", "The skill's name (its folder under `COFFER_HOME/skills/`).")
            .ok_of::<coffer_api::skills::Skill>(200, "The skill.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        // Chat.
        route("GET", "/v1/agents", "chat", "List agents")
            .describe("Every registered agent provider, available or not; an unavailable one says why (`reason`) and cannot be chosen for a new conversation (409).")
            .ok(200, "The agents (one page).", page_of::<coffer_api::chat::Agent>()),
        route("GET", "/v1/conversations", "chat", "List conversations")
            .describe("Newest activity first.")
            .query("archived", json!({"enum": crate::rest::chat::ARCHIVED, "default": "active"}), "Which conversations.")
            .query("q", json!({"type": "string"}), "Only titles containing this (case-insensitive).")
            .query("limit", json!({"type": "integer", "minimum": 1, "maximum": 200, "default": 50}), "Page size.")
            .query("cursor", json!({"type": "string"}), "`next_cursor` of the previous page.")
            .ok(200, "A page of conversations.", page_of::<coffer_api::chat::Conversation>())
            .errors(&["INVALID_ARGUMENT"]),
        route("POST", "/v1/conversations", "chat", "Start a conversation")
            .describe("The agent's provider checks `agent_config` (an explicit `cwd` must be an existing directory; default `COFFER_HOME/workspace`, created on first use); on any error nothing is stored. With `first_message` the first turn starts at once. The title is the first message's first line (cut at a word boundary) unless given.")
            .actor()
            .body_of::<coffer_api::chat::ConversationCreate>()
            .ok_of::<coffer_api::chat::Conversation>(201, "Created, with its `ETag`.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "NOT_FOUND", "CONFLICT"]),
        route("GET", "/v1/conversations/events", "chat", "Watch the conversation list live (SSE)")
            .describe(CONVERSATION_EVENTS_DESCRIPTION)
            .sse("The list's changes, one frame each (see above).")
            .errors(&["INVALID_ARGUMENT"]),
        route("GET", "/v1/conversations/{id}", "chat", "One conversation with its newest messages")
            .describe("With its live state (`turn_running`, the pending queue) and `last_seq`: subscribe with `?after=<last_seq>` to follow from exactly here. `ETag` is the conversation's version.")
            .path_param("id", "The conversation's id (a ULID).")
            .query("messages", json!({"type": "integer", "minimum": 1, "maximum": 500, "default": 100}), "How many of the newest messages.")
            .ok_of::<coffer_api::chat::ConversationView>(200, "The conversation.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("PATCH", "/v1/conversations/{id}", "chat", "Rename, set the model or permission mode, archive or restore")
            .describe("Only the fields given change. `permission_mode` (`bypass`, `ask`, `read_only`) applies from the next turn. `model` is passed to the agent's CLI as is (a bad name is the CLI's error, shown as `turn_error`); `\"\"` is the agent's own default; `cwd` and `session_id` are kept. `archived: true` archives, `false` restores. With `If-Match: \"<version>\"` the write happens only at that version (else 409 `CONFLICT`).")
            .path_param("id", "The conversation's id.")
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .body_of::<coffer_api::chat::ConversationPatch>()
            .ok_of::<coffer_api::chat::Conversation>(200, "The conversation after the change, with its new `ETag`.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("DELETE", "/v1/conversations/{id}", "chat", "Delete a conversation")
            .describe("Cancels an in-flight turn, tears down the agent's per-conversation state and deletes every message and pending item. Subscribers get `reset` (`deleted`) and their stream ends.")
            .path_param("id", "The conversation's id.")
            .ok_of::<coffer_api::chat::ConversationDeleted>(200, "Deleted.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("GET", "/v1/conversations/{id}/messages", "chat", "A conversation's messages")
            .describe("Oldest first, from the start or after the message `after` names.")
            .path_param("id", "The conversation's id.")
            .query("after", json!({"type": "string"}), "The id of the last message already read (exclusive); `cursor` is a synonym.")
            .query("cursor", json!({"type": "string"}), "`next_cursor` of the previous page.")
            .query("limit", json!({"type": "integer", "minimum": 1, "maximum": 500, "default": 100}), "Page size.")
            .ok(200, "A page of messages.", page_of::<coffer_api::chat::Message>())
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("POST", "/v1/conversations/{id}/messages", "chat", "Send a message")
            .describe("Fire-and-return: starts a turn when no turn runs (the answer holds the user `message`) — also when the queue is paused after a stop, a turn error or a restart: only the items already waiting stay paused — else appends the text to the pending queue (the answer holds the `pending` item). With `now: true` (\"send now\") the running turn is interrupted (its partial answer kept `interrupted`; the queue's paused state unchanged) and this message runs next, before the pending items (the answer holds the `message`); of two sent together the later one runs. Either way the answer comes at once and holds the `queue`; follow the turn on `…/events`. `text` is 1 byte to 1 MiB (a 1 MiB text of ordinary characters fits the body limit); it may be empty when `attachments` are sent. Files go as standard base64 in `attachments` (JSON is this route's only body format): at most `chat.attachment_max_files` (default 4) of at most `chat.attachment_max_bytes` (default 10 MiB) each, 40 MiB in all, so this route's body limit is 56 MiB (every other route's stays 2 MiB). Each file is saved in the conversation's working directory as `.coffer/attachments/<message id>/<name>` (the name sanitised: last path component, no control characters or leading dots; a repeated name gets `-2`), shown on the user message as an `attachment` block, and named to the agent in its message (`Attached: <path> (<type>, <size>)`); PNG, JPEG, GIF and WebP images also reach Claude Code as image content blocks and Codex as `localImage` inputs. A file over a limit, an empty one, one declared `image/*` that is no such image, or `data_base64` that is not base64 is 400 naming the file and the limit (nothing is saved). An archived conversation, or one whose agent is unavailable, is 409; a full queue 429.")
            .path_param("id", "The conversation's id.")
            .actor()
            .header("Idempotency-Key", "Optional, 1-128 visible ASCII characters, a new random value per message: a send retried with the same key and body within 15 minutes is answered with the first answer (and `Idempotent-Replayed: true`) instead of being queued again; a retry while the first is still handled waits for it; the same key with another body is 409 `CONFLICT` (`details.reason` `different_body`). Given more than once, or not 1-128 visible ASCII characters, it is 400 naming the header.")
            .body_of::<coffer_api::chat::MessageSend>()
            .ok_of::<coffer_api::chat::SendMessageReply>(202, "Started or queued.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "CONFLICT", "TOO_MANY_REQUESTS"]),
        route("PUT", "/v1/conversations/{id}/pending", "chat", "Replace the pending queue")
            .describe("The ordered pending texts, replaced whole: resume (send the items back as they are), discard (`[]`), reorder, edit. An item with an `id` keeps it; one without is new. Un-pauses (unless `paused: true`), starts the next turn when idle, and broadcasts `queue_changed`.")
            .path_param("id", "The conversation's id.")
            .body_of::<coffer_api::chat::PendingSet>()
            .ok_of::<coffer_api::chat::PendingQueue>(200, "The queue now.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "CONFLICT", "TOO_MANY_REQUESTS"]),
        route("POST", "/v1/conversations/{id}/interrupt", "chat", "Stop the running turn")
            .describe("The turn stops at once (also one about to start); its partial assistant message (text and completed tool blocks) is kept with status `interrupted`, and the queue pauses: the items waiting stay until resumed, while the next message sent starts at once. When no turn runs: `interrupted: false`, nothing changes.")
            .path_param("id", "The conversation's id.")
            .ok_of::<coffer_api::chat::Interrupted>(200, "Done.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("POST", "/v1/conversations/{id}/approvals/{number}", "chat", "Answer an approval request")
            .describe("In permission mode `ask` an agent's action that is not read-only waits for an answer: the `approval_requested` event's `approval.number` (its `seq`) names it. `allow` lets it run, `allow_always` lets it run and allows that tool at once for the rest of the conversation (kept in the store, listed as the conversation's `allowed_tools`, forgotten by `DELETE …/allowed-tools` or a change of the permission mode), `deny` refuses it (`message`, at most 4 KiB, is told to the agent). The first answer from any surface wins: every subscriber gets `approval_resolved`. Unanswered requests are denied after `chat.approval_timeout_s` (`decided_by: timeout`); an interrupt or the turn's end denies what is open. The answer's `decided_by` is `web` for a console session, else the request's actor; `actor` is the session's label or `daemon token`. 409 `ALREADY_DECIDED` carries the first decision in `details` (`decision`, `decided_by`).")
            .path_param("id", "The conversation's id.")
            .path_param("number", "The request's number (the `seq` of its `approval_requested` event).")
            .actor()
            .body_of::<coffer_api::chat::ApprovalAnswer>()
            .ok_of::<coffer_api::chat::ApprovalResolved>(200, "Decided: the decision as every surface sees it.")
            .errors(&["NOT_FOUND", "ALREADY_DECIDED", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("GET", "/v1/conversations/{id}/messages/{message_id}/diff", "chat", "One file's diff of a turn")
            .describe("The unified diff (3 lines of context, at most 256 KiB) of one file that the turn of this assistant message changed, as its `files_changed` lists it; a binary file's says `binary file changed`. Diffs are kept for each conversation's newest 200 turns (under `COFFER_HOME/chat/diffs`, removed with the conversation).")
            .path_param("id", "The conversation's id.")
            .path_param("message_id", "The assistant message's id.")
            .query("path", json!({"type": "string"}), "The file's path as listed (relative, `/`-separated).")
            .ok_of::<coffer_api::chat::FileDiff>(200, "The diff.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("GET", "/v1/conversations/{id}/messages/{message_id}/attachments/{name}", "chat", "A file attached to a message")
            .describe("The bytes of a file attached to this user message (its attachment block's `name`), as saved under `<cwd>/.coffer/attachments/<message id>/`: what the console shows after a reload. Only a name recorded in one of the message's attachment blocks is served (any other file in that folder is 404 naming it), and only as a plain file of that folder: no path, no `..` (400 naming `name`), no symlink (as the file or a folder leading out of it), nothing but a regular file. A bad conversation or message id is 400 naming `conversation_id` or `message_id`. `Content-Type` is the file's type, sniffed from the bytes for PNG, JPEG, GIF and WebP, else from its extension (never what the sender declared); images are `Content-Disposition: inline`, every other file `attachment` (a download; `filename` ASCII-safe, `filename*` the exact name); always `X-Content-Type-Options: nosniff`, `Content-Security-Policy: sandbox; default-src 'none'` and `Cache-Control: private, no-store`.")
            .path_param("id", "The conversation's id.")
            .path_param("message_id", "The user message's id.")
            .path_param("name", "The attachment's file name, percent-encoded.")
            .raw(200, "*/*", "the file's bytes, with its type")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("DELETE", "/v1/conversations/{id}/allowed-tools", "chat", "Forget the tools allowed always")
            .describe("The tools an approval answered `allow_always` allowed in this conversation (listed in `GET /v1/conversations/{id}` as `allowed_tools`; kept across restarts of the chat service) are forgotten: their next requests ask again. A change of the permission mode forgets them too. Audited (`chat.approval.forget`).")
            .path_param("id", "The conversation's id.")
            .ok_of::<coffer_api::chat::AllowedToolsForgotten>(200, "How many were forgotten (0: none).")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("GET", "/v1/conversations/{id}/events", "chat", "Watch a conversation live (SSE)")
            .describe(CHAT_EVENTS_DESCRIPTION)
            .path_param("id", "The conversation's id.")
            .header("Last-Event-ID", "Resume after this event (its `id:`, the `seq`); wins over `after`.")
            .query("after", json!({"type": "integer", "minimum": 0}), "Resume after this `seq`; 0 or absent: the in-flight turn's events so far, then live.")
            .sse("The conversation's events, one frame each (see above).")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT"]),
        route("GET", "/v1/events", "chat", "Follow the conversation list and any conversations on one stream (SSE)")
            .describe(MUX_EVENTS_DESCRIPTION)
            .query("list", json!({"type": "string"}), "`KEY`: subscribe the conversation list under this key (1-64 of `A-Z a-z 0-9 _ . -`).")
            .query("conversation", json!({"type": "string"}), "`KEY:ID` or `KEY:ID:AFTER` (repeatable): subscribe conversation ID under KEY, resuming after `seq` AFTER.")
            .query("invocations", json!({"type": "string"}), "`KEY`: subscribe the invocation log, live, under this key (`invocation` and `lagged` frames, as `GET /v1/invocations/events`).")
            .sse("`hello` first, then the subscriptions' frames tagged with `sub`, and `ended` frames (see above).")
            .errors(&["INVALID_ARGUMENT", "TOO_MANY_REQUESTS"]),
        route("POST", "/v1/events/{stream}", "chat", "Change a multiplexed stream's subscriptions")
            .describe("Removes (`remove`: keys) then adds (`add`) subscriptions of an open `GET /v1/events` stream without reconnecting; a key given twice in `add`, or a conversation id that is not a ULID, is 400 naming it (`details`: `field` `add`, its `index`, `sub`) and changes nothing; more than 64 subscriptions in all is 400 (`details`: `limit`, `asked`, `open`); an added key that exists is replaced (frames of the old one still in flight are dropped). Only the session or token that opened the stream may change it (anyone else gets 404). An unknown conversation is listed in `refused` (the others start); the stream gets no `ended` frame for it.")
            .path_param("stream", "The stream's id from its `hello` frame.")
            .body_of::<coffer_api::events::SubscriptionChange>()
            .ok_of::<coffer_api::events::Subscriptions>(200, "The stream's subscriptions now.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("GET", "/v1/events/streams", "chat", "Count the chat event streams open")
            .describe("How many event streams of the chat routes this daemon serves now: multiplexed ones (and their subscriptions), single conversations', the list's. A browser with the console open in any number of tabs holds one multiplexed stream.")
            .ok_of::<coffer_api::events::OpenStreams>(200, "The counts."),
        route("GET", "/v1/agent-sessions", "chat", "List your own Claude Code and Codex sessions")
            .describe("The sessions you already have outside Coffer, read from the transcripts the agent CLIs write: Claude Code's `projects/<folder>/<session>.jsonl` under its config dir (`$CLAUDE_CONFIG_DIR`, else `~/.claude`) and Codex's `sessions/YYYY/MM/DD/rollout-*.jsonl` under `$CODEX_HOME` (else `~/.codex`), of the user the daemon runs as. Newest transcript first; each with its folder, first prompt, last activity and message count, and the conversation already bound to it. Bounded: the newest `limit` transcripts, 8 MiB of each; a malformed or over-long line, an unreadable file or a symlink is skipped and counted, never an error.")
            .query("agent", json!({"enum": crate::rest::agent_sessions::AGENTS}), "Only this agent's sessions (default: both).")
            .query("limit", json!({"type": "integer", "minimum": 1, "maximum": 200, "default": 50}), "How many transcripts (newest first).")
            .ok_of::<coffer_api::agent_sessions::AgentSessionList>(200, "The sessions.")
            .errors(&["INVALID_ARGUMENT"]),
        route("POST", "/v1/conversations/import", "chat", "Continue one of your own agent sessions")
            .describe("A conversation bound to the session (`agent_config.session_id` = it, `cwd` = its folder): the next message resumes it (`claude --resume` / Codex `thread/resume`). The transcript's user and assistant text (tool calls briefly, at most the newest 500 messages) is copied in as read-only messages (`imported: true`, `source` `import:<agent_key>`) above the new turns. 404 `NOT_FOUND` for an unknown session; 409 `CONFLICT` when a conversation is already bound to it (the message names it) or its folder no longer exists; 400 for a session id that is not `[A-Za-z0-9_-]`.")
            .body_of::<coffer_api::agent_sessions::SessionImport>()
            .ok_of::<coffer_api::chat::Conversation>(201, "Imported, with its `ETag`.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "NOT_FOUND", "CONFLICT"]),
        route("GET", "/v1/projects", "chat", "Working directories to start a conversation in")
            .describe("The project picker: folders recently used by conversations and by your agent sessions (newest first, existing ones only), then the git repositories found under the setting `chat.projects_root` (default: your home), at most 4 levels deep, skipping hidden folders, `node_modules` and symlinks.")
            .query("limit", json!({"type": "integer", "minimum": 1, "maximum": 200, "default": 50}), "How many.")
            .ok_of::<coffer_api::agent_sessions::ProjectList>(200, "The projects.")
            .errors(&["INVALID_ARGUMENT"]),
        // LLM connections.
        route("GET", "/v1/llm/connections", "llm", "List LLM connections")
            .describe("Sorted by name; one page.")
            .ok(200, "The connections.", page_of::<coffer_api::llm::LlmConnection>()),
        route("POST", "/v1/llm/connections", "llm", "Add an LLM connection")
            .describe("`api_key` (sent once, never shown back) becomes the value of credential `credential_ref`, or of `llm-<name>` when none is named (the connection then names it). `base_url` is required for `ollama`; `credential_ref` (or `api_key`) for the cloud wires on their public API. With `internal_default: true` the previous default loses the flag. Answers with `ETag` and `Location`. The names `test` and `models` are reserved.")
            .actor()
            .body_of::<coffer_api::llm::LlmConnectionCreate>()
            .ok_of::<coffer_api::llm::LlmConnection>(201, "Added.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "ALREADY_EXISTS"]),
        route("POST", "/v1/llm/connections/test", "llm", "Test an unsaved LLM connection")
            .describe("One minimal request to the provider; persists nothing. The draft carries its key in `api_key` (used for this probe only, never stored); it may not name a stored credential (`credential_ref`: `INVALID_ARGUMENT` with `details.reason` `stored_credential_in_draft`), since a stored key goes only to its saved connection's base URL. A provider's failure is 200 with `ok: false`.")
            .body_of::<coffer_api::llm::LlmDraft>()
            .ok_of::<coffer_api::llm::LlmTestReport>(200, "The probe's report.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "CONFLICT"]),
        route("POST", "/v1/llm/connections/models", "llm", "List an unsaved LLM connection's models")
            .describe("As `GET /v1/llm/connections/{name}/models` for a draft (`model` optional).")
            .body_of::<coffer_api::llm::LlmDraft>()
            .ok_of::<coffer_api::llm::LlmModels>(200, "The provider's model ids.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "CONFLICT"]),
        route("GET", "/v1/llm/connections/{name}", "llm", "Get one LLM connection")
            .describe("With `ETag: \"<version>\"`.")
            .path_param("name", LLM_NAME)
            .ok_of::<coffer_api::llm::LlmConnection>(200, "The connection.")
            .errors(&["NOT_FOUND"]),
        route("PATCH", "/v1/llm/connections/{name}", "llm", "Change an LLM connection")
            .describe("Absent fields stay; `base_url`, `credential_ref` and `fast_model` set to null clear them. `api_key` replaces the key's value (of `credential_ref`, or `llm-<name>` when none is named) and alone leaves the record's version as it is. With `If-Match: \"<version>\"` the write happens only at that version.")
            .path_param("name", LLM_NAME)
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .actor()
            .body_of::<coffer_api::llm::LlmConnectionPatch>()
            .ok_of::<coffer_api::llm::LlmConnection>(200, "The connection after the change, with its new ETag.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("DELETE", "/v1/llm/connections/{name}", "llm", "Remove an LLM connection")
            .describe("Honours `If-Match`. The credential `llm-<name>` made from an `api_key` goes too unless another connection or an MCP server references it; a credential you named stays.")
            .path_param("name", LLM_NAME)
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .actor()
            .no_content("Removed.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT"]),
        route("POST", "/v1/llm/connections/{name}/default", "llm", "Make a connection the internal default")
            .describe("The internal agent behind `coffer__ask` runs on it; the previous default loses the flag. Idempotent.")
            .path_param("name", LLM_NAME)
            .actor()
            .ok_of::<coffer_api::llm::LlmConnection>(200, "The connection.")
            .errors(&["NOT_FOUND"]),
        route("DELETE", "/v1/llm/connections/{name}/default", "llm", "Stop a connection being the internal default")
            .describe("Then no connection is (`coffer__ask` answers how to configure one). Nothing changes when it was not the default.")
            .path_param("name", LLM_NAME)
            .actor()
            .no_content("Not the default.")
            .errors(&["NOT_FOUND", "CONFLICT"]),
        route("POST", "/v1/llm/connections/{name}/test", "llm", "Test an LLM connection")
            .describe("One minimal request to the provider with the connection's model; persists nothing. A provider's failure (bad key, unknown model, unreachable, timeout, TLS) is 200 with `ok: false` and a `failure` naming the provider and the cause.")
            .path_param("name", LLM_NAME)
            .ok_of::<coffer_api::llm::LlmTestReport>(200, "The probe's report.")
            .errors(&["NOT_FOUND", "CONFLICT"]),
        route("GET", "/v1/llm/connections/{name}/models", "llm", "List a connection's models")
            .describe("The provider's model ids (`GET /v1/models` for the Anthropic and OpenAI wires, `/api/tags` for Ollama), sorted. When listing is impossible: an empty list and a `hint` (type an id instead).")
            .path_param("name", LLM_NAME)
            .ok_of::<coffer_api::llm::LlmModels>(200, "The provider's model ids.")
            .errors(&["NOT_FOUND", "CONFLICT"]),
        // Profiles.
        route("GET", "/v1/mcp/profiles", "profiles", "List profiles")
            .describe("Sorted by name; one page; `default` always among them (version 0 and an empty `updated_at` while never written: everything, full mode).")
            .ok(200, "The profiles.", page_of::<coffer_api::profiles::Profile>()),
        route("POST", "/v1/mcp/profiles", "profiles", "Add a profile")
            .describe("`name` beside the spec's fields. Checked in full, the error's `details.field` naming the part: globs must compile (`*`, `?`, `[…]`; at most 256 per list, 256 bytes each), descriptions at most 4 KiB, at most 256 overrides keyed by exposed names (`<server>__<tool>`), each `name` matching `^[a-zA-Z0-9_-]{1,64}$` and unique in the profile, `hide_params` non-blank and distinct. Answers with `ETag` and `Location`.")
            .actor()
            .body_of::<coffer_api::profiles::NewProfile>()
            .ok_of::<coffer_api::profiles::Profile>(201, "Added.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "ALREADY_EXISTS"]),
        route("GET", "/v1/mcp/profiles/{name}", "profiles", "Get one profile")
            .describe("With `ETag: \"<version>\"`.")
            .path_param("name", PROFILE_NAME)
            .ok_of::<coffer_api::profiles::Profile>(200, "The profile.")
            .errors(&["NOT_FOUND"]),
        route("PUT", "/v1/mcp/profiles/{name}", "profiles", "Replace a profile")
            .describe("The whole spec (absent fields take their defaults), checked as on create. Only `default` may be written before it exists. With `If-Match: \"<version>\"` the write happens only at that version (a never-written `default` is at version 0).")
            .path_param("name", PROFILE_NAME)
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .actor()
            .body_of::<coffer_api::profiles::ProfileSpec>()
            .ok_of::<coffer_api::profiles::Profile>(200, "The profile after the write, with its new ETag.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("DELETE", "/v1/mcp/profiles/{name}", "profiles", "Remove a profile")
            .describe("Honours `If-Match`. `default` cannot be removed (`CONFLICT` naming it; edit it instead).")
            .path_param("name", PROFILE_NAME)
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .actor()
            .no_content("Removed.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT"]),
        // Channels.
        route("GET", "/v1/channels", "channels", "List channels")
            .describe("Sorted by name; one page. Each with its adapter's live state (`adapter` null while coffer-chat does not answer).")
            .ok(200, "The channels.", page_of::<coffer_api::channels::Channel>()),
        route("POST", "/v1/channels", "channels", "Add a channel")
            .describe("`telegram` needs `bot_token` (or `bot_token_ref`, an existing credential); `seatalk` needs `app_id`, `app_secret` and `signing_secret` (or their `*_ref`). A secret becomes the value of the credential its `*_ref` names, or of `channel-<name>-bot-token` (`-app-id`, `-app-secret`, `-signing-secret`) when none is named (the channel then names it); `CONFLICT` when that generated name is already taken, and when the bot token (by value, compared inside the daemon) is another Telegram channel's — Telegram serves one poller per bot (`details.channel` names the other). `INVALID_ARGUMENT` for a blank secret or one with surrounding whitespace, and an `agent_config.cwd` that is not an existing folder (`details.field`). A new channel is unpaired. Answers with `ETag` and `Location`.")
            .actor()
            .body_of::<coffer_api::channels::ChannelCreate>()
            .ok_of::<coffer_api::channels::Channel>(201, "Added.")
            .errors(&["INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST", "ALREADY_EXISTS", "CONFLICT"]),
        route("GET", "/v1/channels/{name}", "channels", "Get one channel")
            .describe("With `ETag: \"<version>\"`.")
            .path_param("name", CHANNEL_NAME)
            .ok_of::<coffer_api::channels::Channel>(200, "The channel.")
            .errors(&["NOT_FOUND"]),
        route("PATCH", "/v1/channels/{name}", "channels", "Change a channel")
            .describe("Absent fields stay; the `*_ref`s, `api_base_url`, `default_agent` and `agent_config` set to null clear them. A secret replaces its credential's value (alone it leaves the record's version as it is); a credential Coffer made for the channel goes once the channel names another. The kind cannot change. The checks of `POST` apply to what changes (a bot token another channel uses: `CONFLICT`; a blank secret, a `cwd` that is no folder: `INVALID_ARGUMENT`). With `If-Match: \"<version>\"` the write happens only at that version.")
            .path_param("name", CHANNEL_NAME)
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .actor()
            .body_of::<coffer_api::channels::ChannelPatch>()
            .ok_of::<coffer_api::channels::Channel>(200, "The channel after the change, with its new ETag.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("DELETE", "/v1/channels/{name}", "channels", "Remove a channel")
            .describe("Honours `If-Match`. Its owner, pending code, cursor and seen events go with it; conversations bound to it keep their history. Credentials Coffer made for it go too unless something else references them; credentials you named stay.")
            .path_param("name", CHANNEL_NAME)
            .header("If-Match", "`\"<version>\"` (the ETag) or `*`.")
            .actor()
            .no_content("Removed.")
            .errors(&["NOT_FOUND", "CONFLICT", "INVALID_ARGUMENT"]),
        route("POST", "/v1/channels/{name}/enable", "channels", "Enable a channel")
            .describe("coffer-chat's coordinator then starts its adapter. Idempotent.")
            .path_param("name", CHANNEL_NAME)
            .actor()
            .ok_of::<coffer_api::channels::Channel>(200, "The channel.")
            .errors(&["NOT_FOUND"]),
        route("POST", "/v1/channels/{name}/disable", "channels", "Disable a channel")
            .describe("Its adapter stops; a running turn finishes and nothing more is sent. Idempotent.")
            .path_param("name", CHANNEL_NAME)
            .actor()
            .ok_of::<coffer_api::channels::Channel>(200, "The channel.")
            .errors(&["NOT_FOUND"]),
        route("POST", "/v1/channels/{name}/pair", "channels", "Issue a pairing code")
            .describe("A fresh one-time code (8 characters of Crockford base-32), replacing any pending one; only its digest is stored. The first chat that sends `/pair <code>` to the bot before it expires becomes the owner, replacing the previous one; five wrong tries void it. The body is optional.")
            .path_param("name", CHANNEL_NAME)
            .actor()
            .body_of::<coffer_api::channels::PairingRequest>()
            .body_optional()
            .ok_of::<coffer_api::channels::PairingCode>(200, "The code.")
            .errors(&["NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("DELETE", "/v1/channels/{name}/pair", "channels", "Unpair a channel")
            .describe("Forgets the owner and any pending code: every chat is refused until the next pairing.")
            .path_param("name", CHANNEL_NAME)
            .actor()
            .no_content("Unpaired.")
            .errors(&["NOT_FOUND"]),
        // Maintenance.
        route("POST", "/v1/backup", "maintenance", "Back up the home")
            .describe("The store writes `coffer.db` (a consistent snapshot), copies of `knowledge/`, `memory/`, `skills/` and `secret.key` (when present), then `manifest.json`, into a new or empty directory (created 0700, files 0600). **A backup holding `secret.key` can decrypt every credential in it.** Restore with `coffer restore DIR` while the daemon is stopped.")
            .actor()
            .body_of::<coffer_api::maintenance::BackupRequest>()
            .ok_of::<coffer_api::maintenance::Backup>(201, "Written.")
            .errors(&["INVALID_ARGUMENT", "ALREADY_EXISTS", "CONFLICT", "UNKNOWN_FIELD", "BAD_REQUEST"]),
        route("POST", "/v1/maintenance/prune", "maintenance", "Run a retention pass now")
            .describe("Deletes invocation and audit rows older than `retention.invocations_days` (default 30) / `retention.audit_days` (365) or beyond the newest `retention.invocations_max_rows` / `retention.audit_max_rows` (100000 each); `0` disables a limit. The store also runs this at start and hourly. Audited as `maintenance.prune`.")
            .actor()
            .ok_of::<coffer_api::maintenance::Pruned>(200, "Rows deleted."),
        route("GET", "/v1/openapi.json", "maintenance", "This document")
            .describe("OpenAPI 3.1, generated from the same table as docs/REST.md.")
            .ok_of::<coffer_api::maintenance::OpenApiDocument>(200, "The OpenAPI document."),
        // MCP.
        mcp_route("POST", "Send one JSON-RPC message")
            .describe("One JSON-RPC message (a batch only on a 2025-03-26 session). A request gets `application/json` with its response (or an SSE stream when the client accepts one and the call relays upstream requests); notifications and client responses get 202. `initialize` without a session creates one and returns `Mcp-Session-Id`.")
            .body(json!({"type": ["object", "array"], "description": "JSON-RPC 2.0 message."}))
            .ok(200, "The JSON-RPC response.", json!({"type": ["object", "array"]}))
            .sse("The response, preceded by relayed server-to-client messages."),
        mcp_route("GET", "Open the session's server-to-client stream")
            .describe("SSE; `Last-Event-ID` resumes it.")
            .sse("Server-to-client JSON-RPC messages."),
        mcp_route("DELETE", "End the session").no_content("The session and its upstream children are gone."),
        mcp_profile_route(),
        mcp_profile_other("GET", "Open a profile session's server-to-client stream")
            .describe("As `GET /mcp`, for a session of profile `profile`; `Last-Event-ID` resumes it.")
            .sse("Server-to-client JSON-RPC messages."),
        mcp_profile_other("DELETE", "End a profile session")
            .describe("As `DELETE /mcp`, for a session of profile `profile`.")
            .no_content("The session and its upstream children are gone."),
    ]
}

/// `GET`/`DELETE /mcp/p/{profile}`: as on `/mcp`, for a session of that profile.
fn mcp_profile_other(method: &'static str, summary: &'static str) -> Route {
    let mut r = route(method, "/mcp/p/{profile}", "mcp", summary)
        .path_param("profile", "The profile the session started with.")
        .header("Mcp-Session-Id", "The session, from `initialize`'s answer; unknown or ended sessions get 404.");
    r.error_format = Errors::JsonRpc;
    r
}

/// `POST /mcp/p/{profile}` (issue 36 §1): `/mcp` for sessions of one profile.
fn mcp_profile_route() -> Route {
    let mut r = route("POST", "/mcp/p/{profile}", "mcp", "Send one JSON-RPC message in a profile")
        .describe("`/mcp` (every method, both eras, the same Host, Origin and authentication rules) for sessions that use profile `profile`; the same as sending `Coffer-Profile: <profile>` to `/mcp` (both may be sent only when they agree). A session's profile is fixed when it starts: an unknown or malformed profile is refused then with 404 and a JSON-RPC error naming it and `coffer profile list`.")
        .path_param("profile", "A profile name (`coffer profile list`); `default` always exists.")
        .header("Mcp-Session-Id", "The session, from `initialize`'s answer; unknown or ended sessions get 404.")
        .body(json!({"type": ["object", "array"], "description": "JSON-RPC 2.0 message."}))
        .ok(200, "The JSON-RPC response.", json!({"type": ["object", "array"]}))
        .sse("The response, preceded by relayed server-to-client messages.");
    r.error_format = Errors::JsonRpc;
    r
}

fn mcp_route(method: &'static str, summary: &'static str) -> Route {
    let mut r = route(method, "/mcp", "mcp", summary)
        .header("Mcp-Session-Id", "The session, from `initialize`'s answer; unknown or ended sessions get 404.")
        .header("MCP-Protocol-Version", "When sent, a supported revision: 2025-11-25, 2025-06-18 or 2025-03-26.");
    r.error_format = Errors::JsonRpc;
    r
}

/// Reusable schemas, by name.
pub fn schemas() -> BTreeMap<&'static str, Value> {
    let codes: Vec<&str> = Code::ALL.iter().map(|c| c.spec().0).collect();
    let mut m = BTreeMap::new();
    m.insert(
        "Error",
        json!({
            "type": "object", "required": ["error"],
            "properties": {"error": {
                "type": "object", "required": ["code", "message", "details"],
                "properties": {
                    "code": {"enum": codes},
                    "message": {"type": "string"},
                    "details": {"type": "object"},
                },
            }},
        }),
    );
    m.insert("JsonRpcError", json!({
        "type": "object", "required": ["jsonrpc", "id", "error"],
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": {"type": ["string", "integer", "null"]},
            "error": {"type": "object", "required": ["code", "message"], "properties": {
                "code": {"type": "integer", "description": "-32000 TOOL_DISABLED, -32001 upstream unavailable, -32002 upstream timeout, -32602 unknown tool or server, -32601 unknown method."},
                "message": {"type": "string"},
                "data": {},
            }},
        },
    }));
    m
}

// ---------------------------------------------------------------------------------------------
// OpenAPI.

fn operation_id(r: &Route) -> String {
    let mut id = r.method.to_ascii_lowercase();
    for seg in r.path.split('/').filter(|s| !s.is_empty() && *s != "v1") {
        let seg = seg.trim_start_matches('{').trim_end_matches('}');
        for part in seg.split(|c: char| !c.is_ascii_alphanumeric()).filter(|p| !p.is_empty()) {
            let mut cs = part.chars();
            if let Some(c) = cs.next() {
                id.push(c.to_ascii_uppercase());
                id.push_str(cs.as_str());
            }
        }
    }
    id
}

/// Codes grouped by HTTP status, for one route (its own and the common ones).
fn error_statuses(r: &Route) -> BTreeMap<u16, Vec<&'static str>> {
    let mut by_status: BTreeMap<u16, Vec<&'static str>> = BTreeMap::new();
    let common = COMMON_ERRORS.iter().filter(|c| !(r.open && **c == "UNAUTHORIZED"));
    for code in r.errors.iter().chain(common) {
        let status = Code::ALL.iter().find(|c| c.spec().0 == *code).map_or(500, |c| c.spec().1.as_u16());
        let list = by_status.entry(status).or_default();
        if !list.contains(code) {
            list.push(code);
        }
    }
    by_status
}

/// A route with its bodies' JSON Schemas resolved.
pub struct Described {
    pub route: Route,
    /// The request body's schema.
    pub body: Option<Value>,
    /// The `application/json` answer's schema.
    pub answer: Option<Value>,
    /// The other successful answers' schemas, in [`Answer::also`]'s order.
    pub also: Vec<Option<Value>>,
}

/// Every route with its bodies' schemas, and every named schema: the derived ones (of the
/// `coffer-api` types the routes use) and the hand-written remainder ([`schemas`]).
///
/// # Panics
/// When a name is both derived and hand-written.
pub fn described() -> (Vec<Described>, BTreeMap<String, Value>) {
    let mut c = Components::new();
    let routes = routes()
        .into_iter()
        .map(|route| {
            let body = route.body.as_ref().map(|b| b.resolve(&mut c));
            let answer = route.answer.json.as_ref().map(|a| a.resolve(&mut c));
            let also = route
                .answer
                .also
                .iter()
                .map(|(_, _, b)| b.as_ref().map(|b| b.resolve(&mut c)).or_else(|| answer.clone()))
                .collect();
            Described { route, body, answer, also }
        })
        .collect();
    let mut all: BTreeMap<String, Value> = schemas().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    for (name, schema) in c.finish() {
        assert!(
            all.insert(name.clone(), schema).is_none(),
            "schema {name} is both derived (coffer-api) and hand-written (schemas()): remove the hand-written one"
        );
    }
    (routes, all)
}

fn operation(d: &Described) -> Value {
    let r = &d.route;
    let mut op = Map::new();
    op.insert("operationId".into(), json!(operation_id(r)));
    op.insert("tags".into(), json!([r.tag]));
    op.insert("summary".into(), json!(r.summary));
    if !r.description.is_empty() {
        op.insert("description".into(), json!(r.description));
    }
    if !r.params.is_empty() {
        let params: Vec<Value> = r
            .params
            .iter()
            .map(|p| {
                json!({"name": p.name, "in": p.location.as_str(), "required": p.required, "description": p.description, "schema": p.schema})
            })
            .collect();
        op.insert("parameters".into(), Value::Array(params));
    }
    if let Some(b) = &d.body {
        op.insert(
            "requestBody".into(),
            json!({"required": !r.body_optional, "content": {"application/json": {"schema": b}}}),
        );
    }
    let mut responses = Map::new();
    let mut ok = json!({"description": r.answer.description});
    let mut content = Map::new();
    if let Some(s) = &d.answer {
        content.insert("application/json".into(), json!({"schema": s}));
    }
    if let Some(d) = r.answer.sse {
        content.insert("text/event-stream".into(), json!({"schema": {"type": "string", "description": d}}));
    }
    if let Some((media, d)) = r.answer.raw {
        content.insert(media.into(), json!({"schema": {"type": "string", "format": "binary", "description": d}}));
    }
    if !content.is_empty() {
        ok["content"] = Value::Object(content);
    }
    responses.insert(r.answer.status.to_string(), ok);
    for ((status, description, _), schema) in r.answer.also.iter().zip(&d.also) {
        let mut other = json!({"description": description});
        if let Some(s) = schema {
            other["content"] = json!({"application/json": {"schema": s}});
        }
        responses.insert(status.to_string(), other);
    }
    match r.error_format {
        Errors::Envelope => {
            for (status, codes) in error_statuses(r) {
                responses.insert(
                    status.to_string(),
                    json!({"description": codes.join(", "), "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
                );
            }
        }
        Errors::JsonRpc => {
            responses.insert(
                "4XX".into(),
                json!({"description": "A JSON-RPC error object (`id: null` where there is no request id); 404 for an unknown or ended session.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/JsonRpcError"}}}}),
            );
        }
    }
    op.insert("responses".into(), Value::Object(responses));
    if r.open {
        op.insert("security".into(), json!([]));
    }
    Value::Object(op)
}

/// The OpenAPI 3.1 document of the edge.
pub fn document() -> Value {
    let (routes, schemas) = described();
    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for d in &routes {
        paths.entry(d.route.path).or_default().insert(d.route.method.to_ascii_lowercase(), operation(d));
    }
    let tags: Vec<Value> = TAGS.iter().map(|(n, d)| json!({"name": n, "description": d})).collect();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Coffer",
            "version": coffer_runtime::VERSION,
            "summary": "The local REST API of the Coffer daemon (loopback only).",
            "description": "Every route but `GET /v1/health` needs the token from `daemon.json` (`X-Coffer-Token` or `Authorization: Bearer`; the agents' token from `agent-access/agent.json` opens `/mcp` only, elsewhere 403 `agent_token_scope`) or a web session: the `coffer_session` cookie together with its key in `X-Coffer-Session-Key` (on an event stream's `GET`, `?ticket=` from `POST /v1/ui/stream-tickets` instead); the cookie alone is refused (401). `Host` must be a loopback name and `Origin`, when sent, Coffer's own. Errors use the envelope `{\"error\":{code, message, details}}`; every response carries `X-Coffer-Trace`. Bodies: 2 MiB on `/v1/*`, 16 MiB on `/mcp`.",
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "servers": [{"url": "http://127.0.0.1:{port}", "variables": {"port": {"default": "8000", "description": "`port` in daemon.json."}}}],
        "security": [{"token": []}, {"bearer": []}, {"session": [], "session_key": []}],
        "tags": tags,
        "paths": paths,
        "components": {
            "securitySchemes": {
                "token": {"type": "apiKey", "in": "header", "name": "X-Coffer-Token"},
                "bearer": {"type": "http", "scheme": "bearer"},
                "session": {"type": "apiKey", "in": "cookie", "name": crate::middleware::SESSION_COOKIE},
                "session_key": {"type": "apiKey", "in": "header", "name": "X-Coffer-Session-Key"},
            },
            "schemas": schemas,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Markdown (docs/REST.md).

/// A JSON Schema as a compact, TypeScript-like shape for the reader: `{name: string, tags?:
/// [string]}`, `"a" | "b"`, `string | null`, named schemas as links.
pub fn shape(s: &Value) -> String {
    if let Some(name) = s.get("$ref").and_then(Value::as_str).and_then(|r| r.rsplit('/').next()) {
        return format!("[{name}](#{})", name.to_ascii_lowercase());
    }
    if let Some(c) = s.get("const") {
        return c.to_string();
    }
    if let Some(alts) = s.get("enum").and_then(Value::as_array) {
        return alts.iter().map(Value::to_string).collect::<Vec<_>>().join(" \\| ");
    }
    if let Some(alts) = s.get("oneOf").or_else(|| s.get("anyOf")).and_then(Value::as_array) {
        return alts.iter().map(shape).collect::<Vec<_>>().join(" \\| ");
    }
    let types: Vec<&str> = match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return "any".into(),
    };
    types.iter().map(|t| one_shape(t, s)).collect::<Vec<_>>().join(" \\| ")
}

fn one_shape(t: &str, s: &Value) -> String {
    match t {
        "object" => {
            let Some(props) = s.get("properties").and_then(Value::as_object) else {
                return match s.get("additionalProperties") {
                    Some(v) if v.is_object() => format!("{{…: {}}}", shape(v)),
                    _ => "object".into(),
                };
            };
            let required: Vec<&str> = s
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let fields: Vec<String> = props
                .iter()
                .map(|(k, v)| format!("{k}{}: {}", if required.contains(&k.as_str()) { "" } else { "?" }, shape(v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        }
        "array" => format!("[{}]", s.get("items").map_or_else(|| "any".into(), shape)),
        other => other.to_owned(),
    }
}

/// `docs/REST.md`, generated from [`routes`] and [`schemas`].
pub fn markdown() -> String {
    let (described, schemas) = described();
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# Coffer REST API\n");
    let _ = writeln!(
        w,
        "<!-- Generated from gateway-edge/src/rest/openapi.rs (the route table) and the coffer-api\n     types (services/api); do not edit. Regenerate with\n     COFFER_UPDATE_DOCS=1 cargo test -p coffer-gateway --lib openapi -->\n"
    );
    let _ = writeln!(
        w,
        "The daemon listens on `http://127.0.0.1:<port>` (the `port` in `COFFER_HOME/daemon.json`), and \
serves the same routes, with the same checks, on the Unix-domain socket `COFFER_HOME/gateway.sock` (0600; \
the `socket` in `daemon.json`, absent when it could not be bound; e.g. \
`curl --unix-socket ~/.coffer/gateway.sock -H 'X-Coffer-Token: …' http://127.0.0.1/v1/status`). \
The same description, as OpenAPI 3.1, is served at `GET /v1/openapi.json`. The `coffer` CLI \
([CLI.md](CLI.md)) is a client of these routes; its `--json` prints their bodies unchanged.\n"
    );
    let _ = writeln!(w, "## Conventions\n");
    let _ = writeln!(
        w,
        "- **Authentication.** Every route but `GET /v1/health` needs the token from `daemon.json` in \
`X-Coffer-Token` (or `Authorization: Bearer <token>`), or the web page's session cookie with its key. \
The managed agents' token (`agent-access/agent.json`, the only daemon file an agent's sandbox can read) \
opens `/mcp` alone; on every `/v1/*` route it gets 403 `FORBIDDEN` with `details.reason` \
`agent_token_scope`.\n\
- **Host and Origin.** `Host` must be `127.0.0.1`, `localhost` or `[::1]` (with the daemon's port); \
`Origin`, when sent, must be exactly the daemon's own origin. Anything else is 403 `FORBIDDEN`.\n\
- **Errors** are `{{\"error\":{{\"code\":\"NOT_FOUND\",\"message\":\"…\",\"details\":{{…}}}}}}` with the codes \
below (`/mcp` answers JSON-RPC error objects instead). 5xx messages are opaque; the cause is in the \
logs under the request's trace id.\n\
- **Tracing.** Every response carries `X-Coffer-Trace`; the same id is on every log line the request caused.\n\
- **Lists** answer `{{\"items\":[…],\"next_cursor\":…}}`; pass `next_cursor` back as `cursor`.\n\
- **Versions.** Servers carry a `version` and an `ETag`; a write with a stale `If-Match` gets 409 `CONFLICT`.\n\
- **Audit.** Writes are recorded with how the request was authenticated (`auth`: `token`, \
`agent_token`, `session:<hash>`, `internal:<service>`, found by the daemon) and the label named in `X-Coffer-Actor` \
(`cli`, `api`, `ui`, `mcp`, `agent`, `channel`; default `api`), which cannot replace it.\n\
- **Limits.** Request bodies: 2 MiB on `/v1/*`, 16 MiB on `/mcp` (413 `PAYLOAD_TOO_LARGE`).\n"
    );
    let _ = writeln!(w, "| code | HTTP status |\n|---|---|");
    for c in Code::ALL {
        let (name, status) = c.spec();
        let _ = writeln!(w, "| `{name}` | {} |", status.as_u16());
    }
    let _ = writeln!(w, "\nEvery authenticated route may also answer {}.\n", common_list());
    let _ = writeln!(w, "## Routes\n");
    let _ = writeln!(w, "| method | path | summary |\n|---|---|---|");
    for d in &described {
        let r = &d.route;
        let _ = writeln!(w, "| {} | [`{}`](#{}) | {} |", r.method, r.path, anchor(r), r.summary);
    }
    for (tag, about) in TAGS {
        let _ = writeln!(w, "\n## {}\n\n{about}", title(tag));
        for d in described.iter().filter(|d| d.route.tag == *tag) {
            route_markdown(w, d);
        }
    }
    let _ = writeln!(w, "\n## Schemas\n");
    for (name, s) in schemas {
        let _ = writeln!(w, "### {name}\n");
        if let Some(d) = s.get("description").and_then(Value::as_str) {
            let _ = writeln!(w, "{d}\n");
        }
        let _ = writeln!(w, "{}\n", code_shape(&s));
    }
    out
}

fn common_list() -> String {
    COMMON_ERRORS.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ")
}

fn title(tag: &str) -> String {
    let mut cs = tag.chars();
    cs.next().map(|c| c.to_ascii_uppercase().to_string() + cs.as_str()).unwrap_or_default()
}

/// The GitHub-style anchor of a route's heading (`### GET /v1/mcp/servers/{name}`).
fn anchor(r: &Route) -> String {
    format!("{} {}", r.method, r.path)
        .to_ascii_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A shape in a paragraph: links kept, so no code span around schema references.
fn code_shape(s: &Value) -> String {
    let text = shape(s);
    if text.contains("](#") { text } else { format!("`{}`", text.replace("\\|", "|")) }
}

fn route_markdown(w: &mut String, d: &Described) {
    let r = &d.route;
    let _ = writeln!(w, "\n### {} {}\n", r.method, r.path);
    let _ = writeln!(w, "{}.", r.summary);
    if !r.description.is_empty() {
        let _ = writeln!(w, "{}", r.description);
    }
    if r.open {
        let _ = writeln!(w, "\nNo token needed.");
    }
    if !r.params.is_empty() {
        let _ = writeln!(w, "\n| parameter | in | type | description |\n|---|---|---|---|");
        for p in &r.params {
            let _ = writeln!(
                w,
                "| `{}` | {} | {} | {} |",
                p.name,
                p.location.as_str(),
                code_shape(&p.schema),
                p.description
            );
        }
    }
    if let Some(b) = &d.body {
        let optional = if r.body_optional { " (optional)" } else { "" };
        let _ = writeln!(w, "\n**Body{optional}:** {}", code_shape(b));
    }
    let answer = match (&d.answer, r.answer.sse) {
        (Some(s), None) => code_shape(s),
        (Some(s), Some(d)) => format!("{} — or `text/event-stream`: {d}", code_shape(s)),
        (None, Some(d)) => format!("`text/event-stream`: {d}"),
        (None, None) => r.answer.raw.map_or_else(|| "no body".into(), |(media, d)| format!("`{media}`: {d}")),
    };
    let _ = writeln!(w, "\n**{} {}:** {answer}", r.answer.status, r.answer.description.trim_end_matches('.'));
    for ((status, description, _), schema) in r.answer.also.iter().zip(&d.also) {
        let shape = schema.as_ref().map_or_else(|| "no body".to_owned(), code_shape);
        let _ = writeln!(w, "\n**{status} {}:** {shape}", description.trim_end_matches('.'));
    }
    match r.error_format {
        Errors::JsonRpc => {
            let _ = writeln!(w, "\n**Errors:** JSON-RPC error objects ([JsonRpcError](#jsonrpcerror)).");
        }
        Errors::Envelope if !r.errors.is_empty() => {
            let list: Vec<String> = error_statuses(r)
                .into_iter()
                .flat_map(|(status, codes)| {
                    codes.into_iter().filter(|c| r.errors.contains(c)).map(move |c| format!("`{c}` {status}"))
                })
                .collect();
            let _ = writeln!(w, "\n**Errors:** {}.", list.join(", "));
        }
        Errors::Envelope => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::{Path, PathBuf};

    use super::*;

    #[test]
    fn table_is_consistent() {
        let routes = routes();
        let mut seen = BTreeSet::new();
        let mut ids = BTreeSet::new();
        let tags: Vec<&str> = TAGS.iter().map(|t| t.0).collect();
        for r in &routes {
            assert!(seen.insert((r.method, r.path)), "{} {} twice", r.method, r.path);
            assert!(ids.insert(operation_id(r)), "operationId {} twice", operation_id(r));
            assert!(r.path == "/mcp" || r.path.starts_with("/mcp/p/") || r.path.starts_with("/v1/"), "{}", r.path);
            assert!(tags.contains(&r.tag), "{} {}: unknown tag {}", r.method, r.path, r.tag);
            assert!(["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&r.method), "{}", r.method);
            // Path parameters in the template and in the list match.
            let in_path: BTreeSet<&str> =
                r.path.split('/').filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).collect();
            let listed: BTreeSet<&str> = r.params.iter().filter(|p| p.location == In::Path).map(|p| p.name).collect();
            assert_eq!(in_path, listed, "{} {}", r.method, r.path);
            for code in r.errors {
                assert!(Code::ALL.iter().any(|c| c.spec().0 == *code), "{} {}: unknown code {code}", r.method, r.path);
            }
        }
        assert_eq!(routes.iter().filter(|r| r.open).count(), 1, "only GET /v1/health is open");
        for code in COMMON_ERRORS {
            assert!(Code::ALL.iter().any(|c| c.spec().0 == *code), "{code}");
        }
    }

    fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r);
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn document_is_openapi_3_1_and_every_ref_resolves() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let mut found = Vec::new();
        refs(&doc, &mut found);
        assert!(!found.is_empty());
        for r in found {
            let name = r.strip_prefix("#/components/schemas/").unwrap_or_else(|| panic!("foreign $ref {r}"));
            assert!(doc["components"]["schemas"].get(name).is_some(), "{r} does not resolve");
        }
        // Every schema is used.
        let text = doc["paths"].to_string() + &doc["components"]["schemas"].to_string();
        for name in described().1.keys() {
            assert!(text.contains(&format!("#/components/schemas/{name}\"")), "schema {name} is unused");
        }
        let n: usize = doc["paths"].as_object().unwrap().values().map(|p| p.as_object().unwrap().len()).sum();
        assert_eq!(n, routes().len());
        assert_eq!(doc["paths"]["/v1/health"]["get"]["security"], json!([]));
        assert!(doc["paths"]["/v1/status"]["get"]["responses"].get("401").is_some());
        assert_eq!(doc["paths"]["/v1/mcp/servers"]["post"]["responses"]["409"]["description"], "ALREADY_EXISTS");
    }

    /// Every `.route("path", methods…)` in the crate's non-test source, as (METHOD, path);
    /// `any(…)` gives method `*`.
    fn routes_in_source() -> BTreeSet<(String, String)> {
        let mut files = Vec::new();
        let mut stack = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                // Test files (`tests.rs`, a `tests/` folder) hold fake servers, not REST routes.
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if p.is_dir() {
                    if name != "tests" {
                        stack.push(p);
                    }
                } else if p.extension().is_some_and(|x| x == "rs")
                    // A file of tests (`tests.rs`, `legacy_tests.rs`) holds fake servers, not
                    // the edge's routes.
                    && !name.ends_with("tests.rs")
                {
                    files.push(p);
                }
            }
        }
        let mut found = BTreeSet::new();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            // Test modules (fake servers) come last in a file.
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for unsupported in [".nest(", ".nest_service(", ".route_service("] {
                assert!(
                    !code.contains(unsupported),
                    "{}: {unsupported} is not understood by this check; extend it",
                    f.display()
                );
            }
            for (at, _) in code.match_indices(".route(") {
                let args = balanced(&code[at + ".route".len()..]);
                let path =
                    args.split('"').nth(1).unwrap_or_else(|| panic!("{}: a route without a literal path", f.display()));
                let after = args.find(path).map_or(0, |i| i + path.len() + 1);
                let methods = method_calls(&args[after..]);
                assert!(!methods.is_empty(), "{}: route {path} without a method", f.display());
                // The console's pages (`/ui…`) are not REST routes; the `console` tag describes them.
                if crate::ui::is_ui_path(path) {
                    continue;
                }
                for m in methods {
                    found.insert((m, path.to_owned()));
                }
            }
        }
        found
    }

    /// The parenthesised text starting at `s` (which starts with `(`), strings skipped.
    fn balanced(s: &str) -> &str {
        let (mut depth, mut in_str, mut prev) = (0, false, ' ');
        for (i, c) in s.char_indices() {
            match c {
                '"' if prev != '\\' => in_str = !in_str,
                '(' if !in_str => depth += 1,
                ')' if !in_str => {
                    depth -= 1;
                    if depth == 0 {
                        return &s[..=i];
                    }
                }
                _ => {}
            }
            prev = c;
        }
        s
    }

    fn method_calls(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        let bytes = s.as_bytes();
        for m in ["get", "post", "put", "patch", "delete", "head", "options", "trace", "any"] {
            for (i, _) in s.match_indices(&format!("{m}(")) {
                let before = if i == 0 { b' ' } else { bytes[i - 1] };
                if !(before.is_ascii_alphanumeric() || before == b'_') {
                    out.push(if m == "any" { "*".to_owned() } else { m.to_ascii_uppercase() });
                }
            }
        }
        out
    }

    #[test]
    fn every_route_in_the_source_is_documented_and_nothing_else() {
        let source = routes_in_source();
        let table: BTreeSet<(String, String)> =
            routes().iter().map(|r| (r.method.to_owned(), r.path.to_owned())).collect();
        let mut missing = Vec::new();
        for (m, p) in &source {
            let documented =
                if m == "*" { table.iter().any(|(_, tp)| tp == p) } else { table.contains(&(m.clone(), p.clone())) };
            if !documented {
                missing.push(format!("{m} {p}"));
            }
        }
        assert!(missing.is_empty(), "routes in gateway-edge/src that rest/openapi.rs does not document: {missing:?}");
        let extra: Vec<String> = table
            .iter()
            .filter(|(m, p)| {
                !source.contains(&(m.clone(), p.clone())) && !source.contains(&("*".to_owned(), p.clone()))
            })
            .map(|(m, p)| format!("{m} {p}"))
            .collect();
        assert!(extra.is_empty(), "documented routes the source does not define: {extra:?}");
    }

    #[test]
    fn rest_md_is_current() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/REST.md");
        let want = markdown();
        if std::env::var_os("COFFER_UPDATE_DOCS").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/REST.md is out of date with gateway-edge/src/rest/openapi.rs and the coffer-api types; regenerate it with\n  COFFER_UPDATE_DOCS=1 cargo test -p coffer-gateway --lib openapi"
        );
    }

    /// Every typed request body refuses unknown fields (`#[serde(deny_unknown_fields)]`, which
    /// `coffer_api::body::parse` turns into `UNKNOWN_FIELD`), and its schema says so.
    #[test]
    fn typed_request_bodies_refuse_unknown_fields() {
        let (routes, schemas) = described();
        let mut typed = 0;
        for d in &routes {
            let (Some(Schema::Typed(_)), Some(body)) = (&d.route.body, &d.body) else { continue };
            typed += 1;
            let name = body["$ref"].as_str().and_then(|r| r.rsplit('/').next()).expect("a named body");
            assert_eq!(
                schemas[name]["additionalProperties"],
                json!(false),
                "{} {}: {name} must say #[serde(deny_unknown_fields)]",
                d.route.method,
                d.route.path
            );
        }
        assert!(typed >= 20, "only {typed} typed request bodies");
    }

    #[test]
    fn every_v1_body_is_a_coffer_api_type() {
        let mut literal = Vec::new();
        for r in routes().iter().filter(|r| r.path.starts_with("/v1/")) {
            let body = matches!(r.body, Some(Schema::Literal(_)));
            let answer = matches!(r.answer.json, Some(Schema::Literal(_)));
            if body || answer {
                literal.push(format!("{} {}", r.method, r.path));
            }
        }
        assert!(literal.is_empty(), "bodies written as JSON Schema literals, not coffer-api types: {literal:?}");
        assert_eq!(schemas().keys().copied().collect::<Vec<_>>(), ["Error", "JsonRpcError"]);
    }

    #[test]
    fn shapes_read_like_types() {
        let s = json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}, "b": {"type": ["integer", "null"]}, "c": {"type": "array", "items": {"$ref": "#/components/schemas/Tool"}}}});
        assert_eq!(shape(&s), "{a: string, b?: integer \\| null, c?: [[Tool](#tool)]}");
        assert_eq!(shape(&json!({"enum": ["x", "y"]})), "\"x\" \\| \"y\"");
        assert_eq!(shape(&json!({"type": "object", "additionalProperties": {"type": "string"}})), "{…: string}");
    }
}
