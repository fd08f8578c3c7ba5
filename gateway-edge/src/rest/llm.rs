//! `/v1/llm/connections…`: the person's LLM connections (the store's `LlmConnections`,
//! `proto/store_llm.proto`) — CRUD with versions and `If-Match`, the one internal default — and
//! their probes (`test`, `models`), which go to coffer-chat's `Llm` service (`proto/llm.proto`):
//! chat is the one process that resolves a connection's credential.
//!
//! A connection names its key by `credential_ref`; its JSON says `credential_set` (whether that
//! credential has a value) and never a value. A create or patch body may carry `api_key` once:
//! it is stored in the credential store (under `credential_ref`, or `llm-<name>` when the
//! connection names none), never in the connection row, never echoed or logged. The acting
//! party in the audit log is `api` unless `X-Coffer-Actor` says otherwise. The bodies are the
//! `coffer_api::llm` types.
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coffer_api::Page;
use coffer_api::llm as api;
use coffer_proto::llm::{ConnectionRef, connection_ref::Target};
use coffer_proto::store::{
    CreateConnectionRequest, DeleteConnectionRequest, GetConnectionRequest, ListConnectionsRequest, LlmConnection,
    LlmWire, SetInternalDefaultRequest, UpdateConnectionRequest,
};
use coffer_types::llm as rules;
use serde_json::json;

use crate::error::{ApiError, Code, JsonBody};
use crate::rest::owned_credentials::{credential_names, drop_if_unused, store_secret};
use crate::rest::servers::{actor, etag, parse_if_match, settle, version_conflict};
use crate::state::AppState;

/// Attempts of a `PATCH` without `If-Match` that loses a race with another writer.
const PATCH_ATTEMPTS: usize = 3;

/// LLM connection routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/llm/connections", get(list).post(create))
        .route("/v1/llm/connections/test", post(test_draft))
        .route("/v1/llm/connections/models", post(models_draft))
        .route("/v1/llm/connections/{name}", get(get_one).patch(patch).delete(delete))
        .route("/v1/llm/connections/{name}/default", post(make_default).delete(clear_default))
        .route("/v1/llm/connections/{name}/test", post(test_saved))
        .route("/v1/llm/connections/{name}/models", get(models_saved))
}

/// A connection as REST answers it (`base_url`, `credential_ref`, `fast_model` null when
/// unset); `credential_set` says whether its credential has a value. Never a secret.
pub fn connection(c: &LlmConnection, credential_set: bool) -> api::LlmConnection {
    let opt = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    api::LlmConnection {
        name: c.name.clone(),
        wire: c.wire().as_str().to_owned(),
        base_url: opt(&c.base_url),
        credential_ref: opt(&c.credential_ref),
        credential_set,
        model: c.model.clone(),
        fast_model: opt(&c.fast_model),
        internal_default: c.internal_default,
        version: c.version,
        created_at: c.created_at.clone(),
        updated_at: c.updated_at.clone(),
    }
}

/// Refuses to make `generated` (`llm-<name>`) the home of a new key when a credential of that name
/// already exists: it may be another server's secret, which replacing would lose.
async fn refuse_taken_credential(st: &AppState, generated: &str) -> Result<(), ApiError> {
    if credential_names(st).await?.contains(generated) {
        return Err(ApiError::new(
            Code::Conflict,
            format!(
                "a credential named {generated:?} already exists; to keep the key there, name it with credential_ref \"{generated}\" (CLI: --credential {generated}), or remove it first (coffer credentials delete {generated})"
            ),
        )
        .with_details(json!({"field": "api_key", "credential": generated})));
    }
    Ok(())
}

async fn rendered(st: &AppState, c: &LlmConnection) -> Result<api::LlmConnection, ApiError> {
    let set = !c.credential_ref.is_empty() && credential_names(st).await?.contains(&c.credential_ref);
    Ok(connection(c, set))
}

/// A single-connection response with its `ETag`.
async fn with_etag(st: &AppState, status: StatusCode, c: &LlmConnection) -> Result<Response, ApiError> {
    let mut r = (status, Json(rendered(st, c).await?)).into_response();
    r.headers_mut().insert(header::ETAG, etag(c.version));
    Ok(r)
}

/// The wire a body names: one of [`rules::WIRES`] (the REST words; the CLI's `openai` alias is
/// the CLI's).
fn parse_wire(word: &str) -> Result<LlmWire, ApiError> {
    LlmWire::parse(word).ok_or_else(|| {
        let shown: String = word.chars().take(40).collect();
        ApiError::invalid(format!("wire {shown:?} is not one of {}", rules::WIRES.join(", ")))
            .with_details(json!({"field": "wire", "allowed": rules::WIRES}))
    })
}

/// Refuses an `api_key` the credential store would refuse, before anything is written.
fn check_key(key: &str) -> Result<(), ApiError> {
    rules::check_api_key(key).map_err(|m| ApiError::invalid(m).with_details(json!({"field": "api_key"})))
}

/// The fields a store refusal may name; its message starts with the field
/// (`coffer_types::llm`'s rules and the store's).
const FIELDS: &[&str] = &["name", "wire", "base_url", "credential_ref", "model", "fast_model"];

/// A store write's refusal as an envelope whose `details.field` names the field the message
/// starts with, so a form can show it next to that field.
fn refused(s: tonic::Status) -> ApiError {
    let e = ApiError::from(s);
    if e.code != Code::InvalidArgument {
        return e;
    }
    let first = e.message.split([' ', ':']).next().unwrap_or_default().to_owned();
    match FIELDS.iter().find(|f| **f == first) {
        Some(f) => e.with_details(json!({"field": f})),
        None => e,
    }
}

async fn fetch(st: &AppState, name: &str) -> Result<LlmConnection, ApiError> {
    Ok(st.store.llm.clone().get_connection(GetConnectionRequest { name: name.to_owned() }).await?.into_inner())
}

// ---------------------------------------------------------------------------------------------
// CRUD.

/// `GET /v1/llm/connections` → `{"items":[connection…],"next_cursor":null}`, sorted by name.
///
/// Errors: `SERVICE_UNAVAILABLE` while the store restarts.
async fn list(State(st): State<Arc<AppState>>) -> Result<Json<Page<api::LlmConnection>>, ApiError> {
    let all = st.store.llm.clone().list_connections(ListConnectionsRequest {}).await?.into_inner().connections;
    let set = credential_names(&st).await?;
    let items =
        all.iter().map(|c| connection(c, !c.credential_ref.is_empty() && set.contains(&c.credential_ref))).collect();
    Ok(Json(Page::all(items)))
}

/// `GET /v1/llm/connections/{name}` → the connection with `ETag: "<version>"`.
///
/// Errors: `NOT_FOUND`.
async fn get_one(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let c = fetch(&st, &name).await?;
    with_etag(&st, StatusCode::OK, &c).await
}

/// `POST /v1/llm/connections` with `{name, wire, base_url?, credential_ref?, api_key?, model,
/// fast_model?, internal_default?}` → 201 with the connection, `ETag` and `Location`.
///
/// `api_key` becomes the value of credential `credential_ref` (created or replaced), or of
/// `llm-<name>` when no `credential_ref` is given (which the connection then names). With
/// `internal_default: true` the previous default loses the flag.
///
/// Errors: `INVALID_ARGUMENT` (unknown wire, the store's validation: name, base URL, model,
/// credential rule; a bad `api_key`), `UNKNOWN_FIELD`, `BAD_REQUEST`, `ALREADY_EXISTS`.
async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(b): JsonBody<api::LlmConnectionCreate>,
) -> Result<Response, ApiError> {
    let wire = parse_wire(&b.wire)?;
    if let Some(k) = &b.api_key {
        check_key(k)?;
    }
    let mut credential_ref = b.credential_ref.unwrap_or_default();
    if b.api_key.is_some() && credential_ref.is_empty() {
        credential_ref = rules::generated_credential(&b.name);
        refuse_taken_credential(&st, &credential_ref).await?;
    }
    let connection = LlmConnection {
        name: b.name,
        wire: wire.into(),
        base_url: b.base_url.unwrap_or_default(),
        credential_ref,
        model: b.model,
        fast_model: b.fast_model.unwrap_or_default(),
        internal_default: b.internal_default,
        ..Default::default()
    };
    // The record first: the store validates it, so a refused one writes no credential either.
    let reply = st
        .store
        .llm
        .clone()
        .create_connection(CreateConnectionRequest { connection: Some(connection), actor: actor(&headers) })
        .await
        .map_err(refused)?
        .into_inner();
    let c = reply.connection.unwrap_or_default();
    if let Some(key) = b.api_key
        && let Err(e) = store_secret(&st, &c.credential_ref, key, &headers).await
    {
        // Undo the half: a connection whose key could not be stored is not what was asked for.
        let undo =
            DeleteConnectionRequest { name: c.name.clone(), expected_version: Some(c.version), actor: actor(&headers) };
        if let Err(u) = st.store.llm.clone().delete_connection(undo).await {
            tracing::warn!(connection = %c.name, error = %u, "Could not undo a connection whose key was refused.");
        }
        return Err(e);
    }
    settle(&st, reply.seq).await;
    tracing::info!(connection = %c.name, wire = c.wire().as_str(), "LLM connection added.");
    let mut r = with_etag(&st, StatusCode::CREATED, &c).await?;
    if let Ok(loc) = HeaderValue::from_str(&format!("/v1/llm/connections/{}", c.name)) {
        r.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(r)
}

/// Applies `p` to `cur` (the key aside: an `api_key` with no credential named gets
/// `llm-<name>`).
fn apply_patch(cur: &LlmConnection, p: &api::LlmConnectionPatch) -> Result<LlmConnection, ApiError> {
    if p.name.as_deref().is_some_and(|n| n != cur.name) {
        return Err(ApiError::invalid("an LLM connection cannot be renamed; remove it and add it under the new name")
            .with_details(json!({"field": "name"})));
    }
    let mut c = cur.clone();
    if let Some(w) = &p.wire {
        c.wire = parse_wire(w)?.into();
    }
    if let Some(u) = &p.base_url {
        c.base_url = u.clone().unwrap_or_default();
    }
    if let Some(r) = &p.credential_ref {
        c.credential_ref = r.clone().unwrap_or_default();
    }
    if let Some(m) = &p.model {
        c.model = m.clone();
    }
    if let Some(f) = &p.fast_model {
        c.fast_model = f.clone().unwrap_or_default();
    }
    if let Some(d) = p.internal_default {
        c.internal_default = d;
    }
    if p.api_key.is_some() && c.credential_ref.is_empty() {
        c.credential_ref = rules::generated_credential(&c.name);
    }
    Ok(c)
}

/// `PATCH /v1/llm/connections/{name}` with a partial body → the connection after the change
/// with its new `ETag`. With `If-Match: "<version>"` the write happens only at that version;
/// without it the patch applies to the current version (retried if another writer wins). A
/// patch that changes nothing writes nothing; `api_key` alone replaces the key's value and
/// leaves the record (and its version) as it is.
///
/// Errors: `NOT_FOUND`, `CONFLICT` (stale `If-Match`), `INVALID_ARGUMENT`, `UNKNOWN_FIELD`,
/// `BAD_REQUEST`.
async fn patch(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    JsonBody(mut p): JsonBody<api::LlmConnectionPatch>,
) -> Result<Response, ApiError> {
    let expected = parse_if_match(&headers)?;
    if let Some(k) = &p.api_key {
        check_key(k)?;
    }
    let mut store = st.store.llm.clone();
    let mut attempt = 0;
    let generated = rules::generated_credential(&name);
    let mut before = String::new();
    let c = loop {
        attempt += 1;
        let cur = fetch(&st, &name).await?;
        if let Some(e) = expected
            && e != cur.version
        {
            return Err(version_conflict("LLM connection", &name, e, cur.version));
        }
        let next = apply_patch(&cur, &p)?;
        if p.api_key.is_some() && next.credential_ref == generated && cur.credential_ref != generated {
            refuse_taken_credential(&st, &generated).await?;
        }
        before.clone_from(&cur.credential_ref);
        if next == cur {
            break cur;
        }
        let req = UpdateConnectionRequest {
            connection: Some(next),
            expected_version: Some(cur.version),
            actor: actor(&headers),
        };
        match store.update_connection(req).await {
            Ok(r) => {
                let r = r.into_inner();
                settle(&st, r.seq).await;
                let c = r.connection.unwrap_or_default();
                tracing::info!(connection = %c.name, version = c.version, "LLM connection updated.");
                break c;
            }
            Err(e) if e.code() == tonic::Code::Aborted && expected.is_none() && attempt < PATCH_ATTEMPTS => continue,
            Err(e) => return Err(refused(e)),
        }
    };
    if let Some(key) = p.api_key.take() {
        store_secret(&st, &c.credential_ref, key, &headers).await?;
        tracing::info!(connection = %c.name, credential = %c.credential_ref, "LLM connection key replaced.");
    }
    // The key Coffer kept for this connection goes once the connection names another (or none).
    if before == generated && c.credential_ref != generated {
        drop_if_unused(&st, &generated, &headers).await?;
    }
    with_etag(&st, StatusCode::OK, &c).await
}

/// `DELETE /v1/llm/connections/{name}` → 204. Honours `If-Match`. The credential Coffer made for
/// it (`llm-<name>`, from an `api_key`) goes too, unless another connection or an MCP server
/// references it; a credential the person named stays.
///
/// Errors: `NOT_FOUND`, `CONFLICT` (stale `If-Match`), `INVALID_ARGUMENT` (bad `If-Match`).
async fn delete(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let expected = parse_if_match(&headers)?;
    let cur = fetch(&st, &name).await?;
    if let Some(e) = expected
        && e != cur.version
    {
        return Err(version_conflict("LLM connection", &name, e, cur.version));
    }
    let req =
        DeleteConnectionRequest { name: name.clone(), expected_version: Some(cur.version), actor: actor(&headers) };
    let seq = st.store.llm.clone().delete_connection(req).await?.into_inner().seq;
    settle(&st, seq).await;
    tracing::info!(connection = %name, "LLM connection removed.");
    let generated = rules::generated_credential(&name);
    if cur.credential_ref == generated {
        drop_if_unused(&st, &generated, &headers).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/llm/connections/{name}/default` → the connection, now the internal default (the
/// previous one loses the flag). Idempotent.
///
/// Errors: `NOT_FOUND`.
async fn make_default(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let req = SetInternalDefaultRequest { name: name.clone(), actor: actor(&headers) };
    let seq = st.store.llm.clone().set_internal_default(req).await?.into_inner().seq;
    settle(&st, seq).await;
    tracing::info!(connection = %name, "Internal default LLM connection set.");
    let c = fetch(&st, &name).await?;
    with_etag(&st, StatusCode::OK, &c).await
}

/// `DELETE /v1/llm/connections/{name}/default` → 204: the connection is no longer the internal
/// default (then none is: `coffer__ask` answers how to configure one). Nothing changes when it
/// was not the default.
///
/// Errors: `NOT_FOUND`, `CONFLICT` when it changed meanwhile (retry).
async fn clear_default(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let cur = fetch(&st, &name).await?;
    if !cur.internal_default {
        return Ok(StatusCode::NO_CONTENT);
    }
    let version = cur.version;
    let next = LlmConnection { internal_default: false, ..cur };
    let req =
        UpdateConnectionRequest { connection: Some(next), expected_version: Some(version), actor: actor(&headers) };
    let seq = st.store.llm.clone().update_connection(req).await?.into_inner().seq;
    settle(&st, seq).await;
    tracing::info!(connection = %name, "Internal default LLM connection cleared.");
    Ok(StatusCode::NO_CONTENT)
}

// ---------------------------------------------------------------------------------------------
// Probes (coffer-chat's Llm service).

/// A checked draft: the record (its `credential_ref` always empty) and the key sent with it.
struct Draft {
    record: LlmConnection,
    api_key: Option<String>,
}

impl Draft {
    fn into_ref(self) -> ConnectionRef {
        ConnectionRef { target: Some(Target::Draft(self.record)), draft_api_key: self.api_key.unwrap_or_default() }
    }
}

/// The draft as a record, checked with the store's field rules (so a probe is never sent for a
/// record the store would refuse to save, except that `model` may be absent for a listing).
fn draft(b: api::LlmDraft, need_model: bool) -> Result<Draft, ApiError> {
    let field = |f: &'static str| move |m: String| ApiError::invalid(m).with_details(json!({"field": f}));
    if b.credential_ref.as_deref().is_some_and(|r| !r.is_empty()) {
        return Err(ApiError::invalid(
            "an unsaved connection cannot use a stored credential (credential_ref): a stored key goes only to the base URL \
             of the connection it was saved with; send the key in api_key, or test the saved connection \
             (POST /v1/llm/connections/{name}/test)",
        )
        .with_details(json!({"field": "credential_ref", "reason": "stored_credential_in_draft"})));
    }
    if let Some(key) = &b.api_key {
        check_key(key)?;
    }
    let wire = parse_wire(&b.wire)?;
    let name = b.name.unwrap_or_else(|| "draft".to_owned());
    rules::check_name(&name).map_err(field("name"))?;
    let base_url = b.base_url.unwrap_or_default();
    if !base_url.is_empty() {
        rules::check_base_url(&base_url).map_err(field("base_url"))?;
    } else if wire == LlmWire::Ollama {
        return Err(ApiError::invalid("base_url is required for an ollama connection (e.g. http://127.0.0.1:11434)")
            .with_details(json!({"field": "base_url"})));
    }
    let model = b.model.unwrap_or_default();
    if need_model || !model.is_empty() {
        rules::check_model("model", &model).map_err(field("model"))?;
    }
    let fast_model = b.fast_model.unwrap_or_default();
    if !fast_model.is_empty() {
        rules::check_model("fast_model", &fast_model).map_err(field("fast_model"))?;
    }
    let record = LlmConnection { name, wire: wire.into(), base_url, model, fast_model, ..Default::default() };
    Ok(Draft { record, api_key: b.api_key })
}

/// `TestConnection` on `client` for `target`, as its REST body.
///
/// # Errors
/// The `Llm` service's status as an envelope ([`ApiError::from_llm`]).
pub(crate) async fn test_with(client: &crate::llm::Client, target: Target) -> Result<api::LlmTestReport, ApiError> {
    test_ref_with(client, ConnectionRef { target: Some(target), draft_api_key: String::new() }).await
}

async fn test_ref_with(client: &crate::llm::Client, target: ConnectionRef) -> Result<api::LlmTestReport, ApiError> {
    let mut c = client.clone();
    let ask = c.test_connection(target);
    let r = crate::llm::call(crate::llm::PROBE_TIMEOUT, ask).await.map_err(ApiError::from_llm)?;
    Ok(crate::llm::test_report(&r))
}

/// `ListModels` on `client` for `target`, as its REST body.
///
/// # Errors
/// As [`test_with`].
pub(crate) async fn models_with(client: &crate::llm::Client, target: Target) -> Result<api::LlmModels, ApiError> {
    models_ref_with(client, ConnectionRef { target: Some(target), draft_api_key: String::new() }).await
}

async fn models_ref_with(client: &crate::llm::Client, target: ConnectionRef) -> Result<api::LlmModels, ApiError> {
    let mut c = client.clone();
    let ask = c.list_models(target);
    let r = crate::llm::call(crate::llm::PROBE_TIMEOUT, ask).await.map_err(ApiError::from_llm)?;
    Ok(crate::llm::models(&r))
}

async fn test_ref(st: &AppState, target: Target) -> Result<Json<api::LlmTestReport>, ApiError> {
    test_with(&st.llm, target).await.map(Json)
}

async fn models_ref(st: &AppState, target: Target) -> Result<Json<api::LlmModels>, ApiError> {
    models_with(&st.llm, target).await.map(Json)
}

/// `POST /v1/llm/connections/{name}/test` → `{ok, latency_ms, model, failure}`: one minimal
/// request to the provider; persists nothing. A provider's failure is 200 with `ok: false` and
/// `failure: {kind, message, http_status, retry_after_ms}`.
///
/// Errors: `NOT_FOUND`, `CONFLICT` (the connection's credential has no value),
/// `SERVICE_UNAVAILABLE` (coffer-chat not running).
async fn test_saved(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<api::LlmTestReport>, ApiError> {
    test_ref(&st, Target::Name(name)).await
}

/// `GET /v1/llm/connections/{name}/models` → `{items: [{id}…], next_cursor: null, hint,
/// failure}`: the provider's model ids, sorted; an empty list with a `hint` when listing is
/// impossible (the user may type an id).
///
/// Errors: as [`test_saved`].
async fn models_saved(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<api::LlmModels>, ApiError> {
    models_ref(&st, Target::Name(name)).await
}

/// `POST /v1/llm/connections/test` with an unsaved connection `{name?, wire, base_url?,
/// api_key?, model, fast_model?}` → as [`test_saved`]. The key is used for this probe only,
/// never stored; a stored credential is never sent to a draft's URL.
///
/// Errors: `INVALID_ARGUMENT` (unknown wire, bad base URL, model or key; `credential_ref`
/// given: details `{field: "credential_ref", reason: "stored_credential_in_draft"}`),
/// `UNKNOWN_FIELD`, `BAD_REQUEST`.
async fn test_draft(
    State(st): State<Arc<AppState>>,
    JsonBody(b): JsonBody<api::LlmDraft>,
) -> Result<Json<api::LlmTestReport>, ApiError> {
    test_ref_with(&st.llm, draft(b, true)?.into_ref()).await.map(Json)
}

/// `POST /v1/llm/connections/models` with an unsaved connection (`model` optional) → as
/// [`models_saved`].
///
/// Errors: as [`test_draft`].
async fn models_draft(
    State(st): State<Arc<AppState>>,
    JsonBody(b): JsonBody<api::LlmDraft>,
) -> Result<Json<api::LlmModels>, ApiError> {
    models_ref_with(&st.llm, draft(b, false)?.into_ref()).await.map(Json)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, to_value};

    use super::*;

    fn record() -> LlmConnection {
        LlmConnection {
            name: "claude".into(),
            wire: LlmWire::Anthropic.into(),
            credential_ref: "llm-claude".into(),
            model: "claude-sonnet-4-5".into(),
            internal_default: true,
            version: 4,
            ..Default::default()
        }
    }

    fn patch_body(v: Value) -> Result<api::LlmConnectionPatch, ApiError> {
        crate::error::parse_json(v.to_string().as_bytes())
    }

    fn draft_body(v: Value) -> Result<api::LlmDraft, ApiError> {
        crate::error::parse_json(v.to_string().as_bytes())
    }

    #[test]
    fn shape() {
        let v = serde_json::to_value(connection(&record(), true)).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "base_url",
                "created_at",
                "credential_ref",
                "credential_set",
                "fast_model",
                "internal_default",
                "model",
                "name",
                "updated_at",
                "version",
                "wire"
            ]
        );
        assert_eq!(
            (v["wire"].as_str(), &v["base_url"], &v["fast_model"]),
            (Some("anthropic"), &json!(null), &json!(null))
        );
        assert_eq!(v["credential_set"], true);
    }

    #[test]
    fn patches() {
        let cur = record();
        let p = patch_body(json!({"model": "m2", "fast_model": "f", "base_url": "http://x"})).unwrap();
        let c = apply_patch(&cur, &p).unwrap();
        assert_eq!((c.model.as_str(), c.fast_model.as_str(), c.base_url.as_str()), ("m2", "f", "http://x"));
        let p = patch_body(json!({"base_url": null, "credential_ref": null, "fast_model": null})).unwrap();
        let c = apply_patch(&LlmConnection { fast_model: "f".into(), base_url: "http://x".into(), ..cur.clone() }, &p)
            .unwrap();
        assert_eq!((c.base_url.as_str(), c.credential_ref.as_str(), c.fast_model.as_str()), ("", "", ""));
        // A key with no credential named gets the generated one.
        let p = patch_body(json!({"credential_ref": null, "api_key": "k"})).unwrap();
        assert_eq!(apply_patch(&cur, &p).unwrap().credential_ref, "llm-claude");
        assert_eq!(apply_patch(&cur, &patch_body(json!({})).unwrap()).unwrap(), cur);
        assert_eq!(apply_patch(&cur, &patch_body(json!({"name": "claude"})).unwrap()).unwrap(), cur);
        assert!(
            apply_patch(&cur, &patch_body(json!({"name": "other"})).unwrap()).unwrap_err().message.contains("renamed")
        );
        let e = apply_patch(&cur, &patch_body(json!({"wire": "gemini"})).unwrap()).unwrap_err();
        assert_eq!(e.details["field"], "wire");
        assert!(e.message.contains("anthropic, openai-responses, openai-chat, ollama"), "{}", e.message);
        assert_eq!(patch_body(json!({"bogus": 1})).err().unwrap().code, Code::UnknownField);
        assert_eq!(patch_body(json!({"internal_default": "yes"})).err().unwrap().code, Code::InvalidArgument);
    }

    #[test]
    fn store_refusals_name_their_field() {
        let e = refused(tonic::Status::invalid_argument("base_url \"x\" is not an absolute URL"));
        assert_eq!((e.code, e.details["field"].as_str()), (Code::InvalidArgument, Some("base_url")));
        let e = refused(tonic::Status::invalid_argument("model must be 1-256 bytes, not 0"));
        assert_eq!(e.details["field"], "model");
        assert_eq!(refused(tonic::Status::invalid_argument("connection is required")).details, json!({}));
        assert_eq!(refused(tonic::Status::already_exists("x")).code, Code::AlreadyExists);
    }

    /// A fake of coffer-chat's `Llm` service: answers by connection name, and for a draft echoes
    /// what it was sent in the reply's `model` (test) or `models` (listing).
    struct FakeLlm;

    type Rpc<T> = Result<tonic::Response<T>, tonic::Status>;

    fn target_of(r: ConnectionRef) -> Result<Target, tonic::Status> {
        r.target.ok_or_else(|| tonic::Status::invalid_argument("no target"))
    }

    #[tonic::async_trait]
    impl coffer_proto::llm::llm_server::Llm for FakeLlm {
        async fn test_connection(
            &self,
            r: tonic::Request<ConnectionRef>,
        ) -> Rpc<coffer_proto::llm::TestConnectionReply> {
            use coffer_proto::llm::{Failure, FailureKind, TestConnectionReply};
            let reply = match target_of(r.into_inner())? {
                Target::Name(n) if n == "ok" => {
                    TestConnectionReply { ok: true, latency_ms: 7, model: "m".into(), failure: None }
                }
                Target::Name(n) if n == "badkey" => TestConnectionReply {
                    ok: false,
                    latency_ms: 3,
                    model: "m".into(),
                    failure: Some(Failure {
                        kind: FailureKind::Auth.into(),
                        message: "anthropic at http://x refused the key (401)".into(),
                        http_status: 401,
                        retry_after_ms: 0,
                    }),
                },
                Target::Name(n) if n == "nokey" => {
                    return Err(tonic::Status::failed_precondition(
                        "LLM connection \"nokey\" needs the credential \"k\"",
                    ));
                }
                Target::Name(n) => return Err(tonic::Status::not_found(format!("no LLM connection named {n:?}"))),
                Target::Draft(d) => TestConnectionReply {
                    ok: true,
                    latency_ms: 1,
                    model: format!("{}|{}|{}|{}|{}", d.name, d.wire().as_str(), d.base_url, d.credential_ref, d.model),
                    failure: None,
                },
            };
            Ok(tonic::Response::new(reply))
        }

        async fn list_models(&self, r: tonic::Request<ConnectionRef>) -> Rpc<coffer_proto::llm::ListModelsReply> {
            use coffer_proto::llm::ListModelsReply;
            let reply = match target_of(r.into_inner())? {
                Target::Name(n) if n == "ok" => {
                    ListModelsReply { models: vec!["a".into(), "b".into()], hint: String::new(), failure: None }
                }
                Target::Name(_) => ListModelsReply { models: vec![], hint: "type an id".into(), failure: None },
                Target::Draft(d) => ListModelsReply { models: vec![d.base_url], hint: String::new(), failure: None },
            };
            Ok(tonic::Response::new(reply))
        }

        async fn ask(&self, _: tonic::Request<coffer_proto::llm::AskRequest>) -> Rpc<coffer_proto::llm::AskReply> {
            Err(tonic::Status::unimplemented("fake"))
        }
    }

    async fn serve_llm() -> crate::llm::Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(coffer_proto::llm::llm_server::LlmServer::new(FakeLlm))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        crate::llm::client(&addr.to_string(), &secrecy::SecretString::from("00".to_owned())).unwrap()
    }

    #[tokio::test]
    async fn probes_go_to_chat_and_come_back_as_rest_bodies() {
        let client = serve_llm().await;
        let name = |n: &str| Target::Name(n.to_owned());
        let ok = to_value(test_with(&client, name("ok")).await.unwrap()).unwrap();
        assert_eq!(ok, json!({"ok": true, "latency_ms": 7, "model": "m", "failure": null}));
        let bad = to_value(test_with(&client, name("badkey")).await.unwrap()).unwrap();
        assert_eq!(
            (bad["ok"].as_bool(), bad["failure"]["kind"].as_str(), bad["failure"]["http_status"].as_u64()),
            (Some(false), Some("auth"), Some(401))
        );
        let e = test_with(&client, name("ghost")).await.unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (Code::NotFound, "no LLM connection named \"ghost\""));
        let e = test_with(&client, name("nokey")).await.unwrap_err();
        assert_eq!(e.code, Code::Conflict);
        assert!(e.message.contains("needs the credential"), "{}", e.message);
        let models = to_value(models_with(&client, name("ok")).await.unwrap()).unwrap();
        assert_eq!(models["items"], json!([{"id": "a"}, {"id": "b"}]));
        assert_eq!(models_with(&client, name("x")).await.unwrap().hint.as_deref(), Some("type an id"));
        // A draft reaches chat as checked: the default name, the wire, the fields given.
        let d = draft(
            draft_body(json!({"wire": "openai-chat", "base_url": "http://127.0.0.1:8000", "model": "qwen"})).unwrap(),
            true,
        )
        .unwrap();
        let r = test_with(&client, Target::Draft(d.record.clone())).await.unwrap();
        assert_eq!(r.model, "draft|openai-chat|http://127.0.0.1:8000||qwen");
        assert_eq!(
            models_with(&client, Target::Draft(d.record)).await.unwrap().items,
            [api::LlmModel { id: "http://127.0.0.1:8000".into() }]
        );
    }

    #[tokio::test]
    async fn a_chat_that_does_not_serve_probes_is_a_503_saying_so() {
        // Nothing listens on this port: the chat service is down.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let client = crate::llm::client(&addr, &secrecy::SecretString::from("00".to_owned())).unwrap();
        let e = test_with(&client, Target::Name("x".into())).await.unwrap_err();
        assert_eq!(e.code, Code::ServiceUnavailable);
        assert!(e.message.starts_with("the chat service is not running"), "{}", e.message);
    }

    #[test]
    fn drafts() {
        let d =
            draft(draft_body(json!({"wire": "ollama", "base_url": "http://127.0.0.1:11434"})).unwrap(), false).unwrap();
        assert_eq!((d.record.name.as_str(), d.record.wire(), d.record.model.as_str()), ("draft", LlmWire::Ollama, ""));
        let e = |v: Value, need_model: bool| draft(draft_body(v).unwrap(), need_model).err().unwrap();
        // A key sent with the draft goes with it; a stored credential never does (issue 32).
        let d = draft(
            draft_body(json!({"wire": "ollama", "base_url": "http://h", "api_key": "sk-secret-0123456789"})).unwrap(),
            false,
        )
        .unwrap();
        let r = d.into_ref();
        assert_eq!(r.draft_api_key, "sk-secret-0123456789");
        let m = e(
            json!({"wire": "anthropic", "base_url": "http://evil.example", "model": "m", "credential_ref": "llm-claude"}),
            true,
        );
        assert_eq!(
            (m.code, &m.details["field"], &m.details["reason"]),
            (Code::InvalidArgument, &json!("credential_ref"), &json!("stored_credential_in_draft"))
        );
        assert!(m.message.contains("cannot use a stored credential"), "{}", m.message);
        assert_eq!(e(json!({"wire": "gemini"}), false).details["field"], "wire");
        assert_eq!(e(json!({"wire": "ollama"}), false).details["field"], "base_url");
        assert_eq!(e(json!({"wire": "anthropic", "base_url": "not a url"}), false).details["field"], "base_url");
        assert_eq!(e(json!({"wire": "anthropic"}), true).details["field"], "model");
        assert_eq!(e(json!({"wire": "anthropic", "model": "m", "api_key": ""}), true).details["field"], "api_key");
        assert_eq!(e(json!({"wire": "anthropic", "model": "m", "name": "Bad"}), true).details["field"], "name");
        assert_eq!(draft_body(json!({"wire": "anthropic", "extra": 1})).err().unwrap().code, Code::UnknownField);
    }
}
