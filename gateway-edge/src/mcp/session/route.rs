//! Routing a session's requests to their upstream: `tools/call` and `prompts/get` by exposed
//! name, `resources/*` by URI, `completion/complete` by its reference, `logging/setLevel` to
//! every upstream. Each request is resolved and admitted by [`crate::mcp::policy`] first, forwarded
//! with the original name (or URI) and a fresh upstream request id, and answered with the
//! upstream's result or error verbatim (raw JSON, never re-typed); calls and reads are recorded
//! in the invocation log.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coffer_types::BUILTIN_SERVER;
use futures_util::future::BoxFuture;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::mcp::answer::{Answer, RpcError};
use crate::mcp::builtin;
use crate::mcp::catalog::{ListKind, expose_uri, split_uri};
use crate::mcp::jsonrpc::INVALID_PARAMS;
use crate::mcp::naming;
use crate::mcp::policy;
use crate::mcp::session::{RequestCtx, Session};
use crate::mcp::upstream::era::Era;
use crate::mcp::upstream::mrtr as upstream_mrtr;
use crate::mcp::upstream::{Reply, Upstream, UpstreamError};

impl Session {
    /// Routes `tools/call` or `prompts/get`: resolve, check policy, forward with the original
    /// name (a built-in tool is called in-process), return the answer verbatim; records the
    /// invocation.
    pub(in crate::mcp) async fn route_call_ctx(
        &self,
        kind: ListKind,
        params: Option<&RawValue>,
        ctx: &RequestCtx,
    ) -> Answer {
        let started = Instant::now();
        let method = if kind == ListKind::Tools { "tools/call" } else { "prompts/get" };
        let fields = match parse_fields(params) {
            Some(f) => f,
            None => {
                return Answer::Error(RpcError::new(
                    INVALID_PARAMS,
                    format!("{method} needs params {{name, arguments}}"),
                ));
            }
        };
        let exposed: String = match fields.get("name").map(|n| serde_json::from_str::<String>(n.get())) {
            Some(Ok(n)) => n,
            _ => return Answer::Error(RpcError::new(INVALID_PARAMS, format!("{method} needs a string params.name"))),
        };
        // MCP: `arguments` is an object when present (`{ [key: string]: unknown }`); anything
        // else, `null` included (a client with no arguments omits the member), is refused here
        // instead of reaching an upstream that may crash on it.
        if let Some(a) = fields.get("arguments")
            && !a.get().trim_start().starts_with('{')
        {
            return Answer::Error(RpcError::new(
                INVALID_PARAMS,
                format!("{method} params.arguments must be an object, not {}", json_kind(a.get())),
            ));
        }
        let mut usage = None;
        let mut builtin_outcome = None;
        // Boxed, and its result taken apart before the call's own awaits: the profile's
        // resolution would otherwise grow every call's future past its bound
        // (`a_call_s_future_stays_small`).
        let resolved = Box::pin(self.resolve_call(kind, &exposed, fields.get("arguments").map(|a| a.get()))).await;
        let (server, original) = match resolved {
            Ok(found) => found,
            Err((e, server)) => {
                let answer = Answer::Error(e);
                self.shared.record_with_usage(
                    method,
                    &exposed,
                    &server,
                    self,
                    started.elapsed(),
                    answer.outcome(),
                    None,
                );
                return answer;
            }
        };
        let answer = if server == BUILTIN_SERVER && kind == ListKind::Tools {
            let args = fields.get("arguments").map(|a| a.get().to_owned());
            let meta = fields.get("_meta").map(|m| m.get());
            let (called, routed) = Box::pin(self.call_builtin(&original, args.as_deref(), meta, ctx)).await;
            if routed {
                // `coffer__call_tool` routed a call, which recorded itself (the real tool, with
                // this session's client and profile): one record per call, not two.
                return called.answer;
            }
            usage = called.usage;
            builtin_outcome = Some(called.outcome);
            called.answer
        } else {
            let forwarded = to_raw(&fields, "name", &raw_string(&original));
            let answer = self.forward(&server, method, &forwarded, ctx).await;
            if kind == ListKind::Tools
                && let Answer::Result(r) = &answer
            {
                self.catalog.learn_uris(&server, r);
            }
            answer
        };
        let outcome = builtin_outcome.unwrap_or_else(|| answer.outcome());
        self.shared.record_with_usage(method, &exposed, &server, self, started.elapsed(), outcome, usage);
        answer
    }

    /// Calls built-in tool `original` with `arguments` (raw JSON object text) for this
    /// session's request `ctx` whose params carried `meta` (`_meta`, raw JSON). A call the tool
    /// routes ([`builtin::Caller::call_tool`], `coffer__call_tool`) goes through this session's
    /// own `tools/call` with the same `ctx` and `_meta`: its progress token reaches the upstream
    /// and its progress the caller's stream, and cancelling the request cancels it. Returns the
    /// call and whether it routed one (which then recorded itself).
    async fn call_builtin(
        &self,
        original: &str,
        arguments: Option<&str>,
        meta: Option<&str>,
        ctx: &RequestCtx,
    ) -> (builtin::Called, bool) {
        let caller = InCall { session: self, ctx, meta, routed: AtomicBool::new(false) };
        let called = self.shared.builtins.call_metered(original, &caller, arguments).await;
        (called, caller.routed.load(Ordering::Acquire))
    }

    /// Resolves the name of a `tools/call` or `prompts/get` through the session's profile
    /// ([`Session::resolve_named`]) and refuses a tool call whose `arguments` (raw JSON) set a
    /// parameter the profile hides. `(server, original)`, or the error with the server to
    /// record it under.
    async fn resolve_call(
        &self,
        kind: ListKind,
        exposed: &str,
        arguments: Option<&str>,
    ) -> Result<(String, String), (RpcError, String)> {
        match self.resolve_named(kind, exposed).await {
            Ok((server, original, named)) if kind == ListKind::Tools => {
                // A parameter the profile hides is not the client's to set (the upstream
                // applies its own default).
                let hidden = self.hidden_params(&named).await;
                match crate::mcp::profile::hidden_param_error(&self.profile_name(), exposed, &hidden, arguments) {
                    Some(e) => Err((e, server)),
                    None => Ok((server, original)),
                }
            }
            Ok((server, original, _)) => Ok((server, original)),
            Err(e) => Err((e, naming::split(exposed).map(|(s, _)| s.to_owned()).unwrap_or_default())),
        }
    }

    /// `resources/read`, `resources/subscribe`, `resources/unsubscribe`: resolve the URI, forward
    /// with the original one; in read results, `contents[].uri` is rewritten to the exposed form
    /// when the request used it. Reads are recorded in the invocation log.
    pub(in crate::mcp) async fn route_resource(
        self: &Arc<Self>,
        method: &str,
        params: Option<&RawValue>,
        ctx: &RequestCtx,
    ) -> Answer {
        let started = Instant::now();
        let Some(fields) = parse_fields(params) else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, format!("{method} needs params {{uri}}")));
        };
        let Some(Ok(uri)) = fields.get("uri").map(|u| serde_json::from_str::<String>(u.get())) else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, format!("{method} needs a string params.uri")));
        };
        let resolved =
            policy::resolve_uri(&self.shared.snapshot.current(), &self.catalog, &uri).and_then(|(server, original)| {
                // A server the session's profile does not select is refused like a disabled one.
                if self.profiled && !self.view().selects_server(&server) {
                    return Err(policy::Refusal::Disabled {
                        noun: policy::Noun::Resource,
                        exposed: uri.clone(),
                        server,
                        scope: policy::Scope::Capability,
                    });
                }
                Ok((server, original))
            });
        let (server, original) = match resolved {
            Ok(p) => p,
            Err(e) => {
                let mut e = RpcError::from(e);
                // MCP 2026-07-28 (SEP-2164): a resource not found names its URI in `data`.
                if e.data.is_none() {
                    e = e.with_data(json!({"uri": uri}));
                }
                if method == "resources/read" {
                    let server = split_uri(&uri).map(|(s, _)| s.to_owned()).unwrap_or_default();
                    self.shared.record("resources/read", &uri, &server, self, started.elapsed(), e.outcome());
                }
                return Answer::Error(e);
            }
        };
        let forwarded = to_raw(&fields, "uri", &raw_string(&original));
        let mut answer = self.forward(&server, method, &forwarded, ctx).await;
        if method == "resources/read"
            && split_uri(&uri).is_some()
            && let Answer::Result(r) = &answer
            && let Ok(mut v) = serde_json::from_str::<Value>(r.get())
        {
            if let Some(contents) = v.get_mut("contents").and_then(Value::as_array_mut) {
                for c in contents {
                    if let Some(u) = c.get("uri").and_then(Value::as_str) {
                        c["uri"] = Value::String(expose_uri(&server, u));
                    }
                }
            }
            answer = Answer::ok(v);
        }
        if method == "resources/read" {
            let outcome = answer.outcome();
            self.shared.record("resources/read", &uri, &server, self, started.elapsed(), outcome);
        }
        answer
    }

    /// `completion/complete`: routes by `ref/prompt` name or `ref/resource` URI.
    pub(in crate::mcp) async fn route_completion(
        self: &Arc<Self>,
        params: Option<&RawValue>,
        ctx: &RequestCtx,
    ) -> Answer {
        let Some(mut p) = params.and_then(|p| serde_json::from_str::<Value>(p.get()).ok()) else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, "completion/complete needs params {ref, argument}"));
        };
        let server = match p["ref"]["type"].as_str() {
            Some("ref/prompt") => {
                let name = p["ref"]["name"].as_str().unwrap_or_default().to_owned();
                match self.resolve(ListKind::Prompts, &name).await {
                    Ok((server, original)) => {
                        p["ref"]["name"] = Value::String(original);
                        server
                    }
                    Err(e) => return Answer::Error(e),
                }
            }
            Some("ref/resource") => {
                let uri = p["ref"]["uri"].as_str().unwrap_or_default().to_owned();
                match policy::resolve_uri(&self.shared.snapshot.current(), &self.catalog, &uri) {
                    Ok((server, original)) => {
                        p["ref"]["uri"] = Value::String(original);
                        server
                    }
                    Err(e) => return Answer::Error(e.into()),
                }
            }
            _ => {
                return Answer::Error(RpcError::new(
                    INVALID_PARAMS,
                    "completion/complete needs ref.type ref/prompt or ref/resource",
                ));
            }
        };
        let raw = RawValue::from_string(p.to_string()).expect("json");
        self.forward(&server, "completion/complete", &raw, ctx).await
    }

    /// `logging/setLevel`: remembered for the session and applied to every running upstream
    /// that offers logging; from then on upstream log messages at that level or above reach
    /// the client ([`crate::mcp::flow::Flow::admit_log`]). -32602 for a level MCP does not name.
    pub(in crate::mcp) async fn set_level(&self, params: Option<&RawValue>) -> Answer {
        let level = params
            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
            .and_then(|v| v["level"].as_str().map(str::to_owned));
        let Some(level) = level else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, "logging/setLevel needs params.level"));
        };
        if let Err(e) = self.flow.set_log_level(&level) {
            return Answer::Error(RpcError::new(INVALID_PARAMS, format!("logging/setLevel: {e}")));
        }
        self.pool.set_level(level).await;
        Answer::ok(json!({}))
    }

    /// Sends request `method` with `params` to `server`'s upstream (started if needed) and
    /// waits for its answer, at most the server's timeout (else the default call timeout).
    /// While it runs, requests from that upstream may be relayed on `ctx.side`, and the client
    /// may cancel it by `ctx.id`; its progress notifications reach `ctx.progress` under the
    /// client's own token ([`crate::mcp::session::progress`]). A 2026-07-28 upstream that answers with an
    /// `InputRequiredResult` gets its input requests relayed to the client and the request
    /// retried with the answers ([`crate::mcp::upstream::mrtr`]): the client sees the final result.
    async fn forward(&self, server: &str, method: &str, params: &RawValue, ctx: &RequestCtx) -> Answer {
        let snapshot = self.shared.snapshot.current();
        let Some(spec) = snapshot.servers.get(server) else {
            return Answer::Error(RpcError::new(INVALID_PARAMS, format!("Unknown server {server:?}")));
        };
        let up = match self.pool.upstream(spec, snapshot.generation(spec)).await {
            Ok(u) => u,
            Err(e) => return Answer::Error(e.into()),
        };
        let timeout =
            if spec.timeout_ms > 0 { Duration::from_millis(spec.timeout_ms) } else { self.shared.call_timeout() };
        if let Some(lane) = &ctx.progress
            && params.get().contains("progressToken")
        {
            // Boxed: a rare path, kept out of every call's future.
            return Box::pin(self.forward_with_progress(server, method, params, ctx, lane)).await;
        }
        let _guard = ctx.side.as_ref().map(|side| self.relays.open_stream(server, side));
        // `exchange` written out: the hot path's future stays small.
        let heard = up.heard();
        let (uid, rx) = match up.begin(method, Some(params)).await {
            Ok(p) => p,
            Err(e) => return Answer::Error(e.into()),
        };
        if let Some(id) = &ctx.id {
            self.relays.begin(id, server, uid);
        }
        let mut res = up.finish(uid, rx, timeout, Some(heard)).await;
        if let Some(id) = &ctx.id
            && self.relays.end(id)
        {
            return Answer::Cancelled;
        }
        if up.era() == Era::Modern
            && let Ok(Reply::Result(r)) = &res
            && upstream_mrtr::input_required(method, r)
        {
            // Boxed: a rare path, kept out of every call's future.
            res = match Box::pin(self.input_rounds(&up, server, method, params, res, timeout, ctx)).await {
                Ok(res) => res,
                Err(answer) => return answer,
            };
        }
        match res {
            Ok(Reply::Result(r)) => {
                up.answered();
                Answer::Result(r)
            }
            Ok(Reply::Error(e)) => {
                up.answered();
                Answer::UpstreamError(e)
            }
            Err(e) => {
                // A crash is the server's fault (its cause, e.g. the exit status, is found off
                // this path); a stop Coffer asked for is not.
                if let UpstreamError::Closed { reason, .. } = &e {
                    let (shared, server, reason) = (self.shared.clone(), server.to_owned(), reason.clone());
                    let at = Instant::now();
                    tokio::spawn(async move {
                        let why = up.crash_cause(reason).await;
                        shared.health.crashed(&server, &format!("upstream {server} closed the connection: {why}"), at);
                    });
                }
                Answer::Error(e.into())
            }
        }
    }
}

impl Session {
    /// [`Session::forward`] of a request whose params may carry `_meta.progressToken`: the token
    /// is rewritten to one unique in the session and mapped back to the client's on `lane`
    /// while the call runs ([`crate::mcp::session::progress`]); without a token, forwarded as it is.
    async fn forward_with_progress(
        &self,
        server: &str,
        method: &str,
        params: &RawValue,
        ctx: &RequestCtx,
        lane: &crate::mcp::flow::Lane,
    ) -> Answer {
        let ctx = RequestCtx { id: ctx.id.clone(), side: ctx.side.clone(), progress: None };
        match self.progress.register(server, params, lane) {
            Some((params, _route)) => self.forward(server, method, &params, &ctx).await,
            None => self.forward(server, method, params, &ctx).await,
        }
    }

    /// One request to `up` and its reply (at most `timeout`); `Err(Answer::Cancelled)` when the
    /// client cancelled it meanwhile, `Err` with the error when it could not be sent.
    pub(in crate::mcp) async fn exchange(
        &self,
        up: &Arc<Upstream>,
        server: &str,
        method: &str,
        params: &RawValue,
        timeout: Duration,
        ctx: &RequestCtx,
    ) -> Result<Result<Reply, UpstreamError>, Answer> {
        let heard = up.heard();
        let (uid, rx) = match up.begin(method, Some(params)).await {
            Ok(p) => p,
            Err(e) => return Err(Answer::Error(e.into())),
        };
        if let Some(id) = &ctx.id {
            self.relays.begin(id, server, uid);
        }
        let res = up.finish(uid, rx, timeout, Some(heard)).await;
        if let Some(id) = &ctx.id
            && self.relays.end(id)
        {
            return Err(Answer::Cancelled);
        }
        Ok(res)
    }
}

/// What a built-in tool sees of the session during one `tools/call` of it: the session, and
/// the request's context and `_meta`, which a call the tool routes carries on.
struct InCall<'a> {
    session: &'a Session,
    ctx: &'a RequestCtx,
    /// The `_meta` of the built-in's `tools/call` params (raw JSON), e.g. `{"progressToken": 7}`.
    meta: Option<&'a str>,
    /// Set when the tool routed a call through [`builtin::Caller::call_tool`].
    routed: AtomicBool,
}

impl builtin::Caller for InCall<'_> {
    fn session_id(&self) -> &str {
        builtin::Caller::session_id(self.session)
    }

    fn list_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String)>> {
        builtin::Caller::list_tools(self.session)
    }

    fn list_all_tools(&self) -> BoxFuture<'_, Vec<(Value, String, String, bool)>> {
        builtin::Caller::list_all_tools(self.session)
    }

    fn client_name(&self) -> &str {
        builtin::Caller::client_name(self.session)
    }

    fn actor(&self) -> &str {
        builtin::Caller::actor(self.session)
    }

    fn call_tool<'a>(&'a self, name: &'a str, arguments: Option<&'a str>) -> BoxFuture<'a, Answer> {
        Box::pin(async move {
            self.routed.store(true, Ordering::Release);
            let params = builtin::meta::call_params_with_meta(name, arguments, self.meta);
            self.session.route_call_ctx(ListKind::Tools, Some(&params), self.ctx).await
        })
    }
}

/// Top-level params fields with raw values, borrowed from the params text (so everything but
/// the field we rewrite stays verbatim, and nothing is copied per call). A repeated key: the
/// last one counts. `None` when params is absent or not a JSON object.
fn parse_fields(params: Option<&RawValue>) -> Option<BTreeMap<FieldKey<'_>, &RawValue>> {
    serde_json::from_str(params?.get()).ok()
}

/// The fields again as one JSON object, with `key` set to `value` (keys in sorted order).
fn to_raw(fields: &BTreeMap<FieldKey<'_>, &RawValue>, key: &str, value: &RawValue) -> Box<RawValue> {
    let mut out: BTreeMap<&str, &RawValue> = fields.iter().map(|(k, v)| (&*k.0, *v)).collect();
    out.insert(key, value);
    RawValue::from_string(serde_json::to_string(&out).expect("json")).expect("json")
}

/// An object key as it appears in the params text: borrowed, or unescaped when it has escapes.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct FieldKey<'a>(std::borrow::Cow<'a, str>);

impl std::borrow::Borrow<str> for FieldKey<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl<'de> serde::Deserialize<'de> for FieldKey<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = FieldKey<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(FieldKey(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(FieldKey(std::borrow::Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(Visit)
    }
}

fn raw_string(s: &str) -> Box<RawValue> {
    RawValue::from_string(serde_json::to_string(s).expect("json")).expect("json")
}

/// The JSON type of a raw value, for error messages ("an array", "a string", …).
fn json_kind(raw: &str) -> &'static str {
    match raw.trim_start().as_bytes().first() {
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_rewritten_field_changes_and_the_rest_stays_verbatim() {
        let params = RawValue::from_string(
            r#"{"name":"srv__x","arguments":{"b": [1, 2 ], "a":"\u00e9"},"_meta":{"progressToken":1}}"#.into(),
        )
        .unwrap();
        let fields = parse_fields(Some(&params)).unwrap();
        let out = to_raw(&fields, "name", &raw_string("x"));
        assert_eq!(out.get(), r#"{"_meta":{"progressToken":1},"arguments":{"b": [1, 2 ], "a":"\u00e9"},"name":"x"}"#);
        assert!(parse_fields(Some(&RawValue::from_string("[1]".into()).unwrap())).is_none(), "not an object");
        assert!(parse_fields(None).is_none());
        // An escaped key is unescaped, and a repeated key keeps its last value.
        let params = RawValue::from_string(r#"{"n\u0061me":"a","name":"b"}"#.into()).unwrap();
        let fields = parse_fields(Some(&params)).unwrap();
        assert_eq!(fields.get("name").map(|v| v.get()), Some("\"b\""));
    }
}
