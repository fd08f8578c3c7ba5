//! `/v1/knowledge…`, `/v1/memory…`, `/v1/skills…`: REST over `coffer-retrieval`
//! (`proto/retrieval.proto`). Each route checks its body, makes one Retrieval call and answers
//! with the reply as its `coffer_api::knowledge` / `coffer_api::skills` type (converted by
//! [`crate::retrieval`]); a failed call is the envelope of
//! [`ApiError::from_retrieval`] (400 `INVALID_ARGUMENT`, 404 `NOT_FOUND`, 409 `CONFLICT`, 503
//! `SERVICE_UNAVAILABLE` while the service is not running).
//!
//! Bodies are the `coffer_api::knowledge` types, read by [`JsonBody`]: an unknown field is
//! `UNKNOWN_FIELD`, a value of the wrong type `INVALID_ARGUMENT` naming the field, the type it
//! needs and the type it got (`coffer_api::body`). Limits on contents (query length, names,
//! globs) are the service's, which names the field and the limit.
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use coffer_api::knowledge::{
    self as api, FactCreate, KnowledgeBaseCreate, KnowledgeBasePatch, RecallRequest as RecallBody, Reindex,
    SearchRequest as SearchBody,
};
use coffer_api::skills;
use coffer_proto::retrieval::{
    AddKnowledgeBaseRequest, FactId, KnowledgeBaseName, ListFactsRequest, ListSkillsRequest, ReadNoteRequest,
    RecallRequest, ReindexRequest, RememberRequest, SearchFilters, SearchRequest, SetWritableRequest, SkillName,
    StatusRequest,
};
use serde_json::json;

use crate::error::{ApiError, JsonBody};
use crate::retrieval::{self, call};
use crate::state::AppState;

/// Names a knowledge base cannot have here: `/v1/knowledge/<name>` would be these routes.
pub const RESERVED_KB_NAMES: &[&str] = &["reindex", "search"];

/// Longest knowledge base name (the service's rule: 1-64 of a-z, 0-9, `_`, `-`).
pub const MAX_KB_NAME_BYTES: usize = 64;
/// Longest `path_prefix` of a search, bytes.
pub const MAX_PATH_PREFIX_BYTES: usize = 1024;
/// Longest `query` of a search, bytes (after trimming, as the service counts).
pub const MAX_QUERY_BYTES: usize = 8192;
/// Longest `cursor` of a search (a `next_cursor` is a KB name, `:` and a note path).
pub const MAX_CURSOR_BYTES: usize = 2048;

/// Refuses `value` of `field` when it is longer than `max` bytes: 400 `INVALID_ARGUMENT` naming
/// the field, its length and the limit (`details: {"field", "limit"}`), before any service is
/// called. The value itself is not echoed (it may be megabytes).
///
/// # Errors
/// The envelope above.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.len() <= max {
        return Ok(());
    }
    Err(ApiError::invalid(format!("{field} is {} bytes; at most {max}", value.len()))
        .with_details(json!({"field": field, "limit": max})))
}

/// Default and largest page of `GET /v1/memory`.
pub const FACTS_PAGE: u32 = 50;
pub const MAX_FACTS_PAGE: u32 = 500;

/// The routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/knowledge", get(list_kbs).post(add_kb))
        .route("/v1/knowledge/reindex", post(reindex))
        .route("/v1/knowledge/search", post(search))
        .route("/v1/knowledge/{kb}", get(get_kb).delete(remove_kb).patch(patch_kb))
        .route("/v1/knowledge/{kb}/note", get(read_note))
        .route("/v1/memory", get(list_facts).post(remember))
        .route("/v1/memory/recall", post(recall))
        .route("/v1/memory/{id}", get(get_fact).delete(forget))
        .route("/v1/skills", get(list_skills))
        .route("/v1/skills/{name}", get(load_skill))
}

// ---------------------------------------------------------------------------------------------
// Knowledge bases.

/// `GET /v1/knowledge` → [`api::KnowledgeBases`] (the memory KB included, kind `memory`).
async fn list_kbs(State(st): State<Arc<AppState>>) -> Result<Json<api::KnowledgeBases>, ApiError> {
    let r = call(st.retrieval.clone().status(StatusRequest {})).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(api::KnowledgeBases {
        items: r.knowledge_bases.into_iter().map(retrieval::kb).collect(),
        next_cursor: None,
        engines: r.engines.into_iter().map(retrieval::engine_config).collect(),
    }))
}

/// The `AddKnowledgeBase` request of a `POST /v1/knowledge` body.
///
/// # Errors
/// `INVALID_ARGUMENT` for a reserved name ([`RESERVED_KB_NAMES`]) or a relative `path`.
pub fn add_request(body: KnowledgeBaseCreate) -> Result<AddKnowledgeBaseRequest, ApiError> {
    let name = body.name;
    if RESERVED_KB_NAMES.contains(&name.as_str()) {
        return Err(ApiError::invalid(format!(
            "{name:?} cannot name a knowledge base (it is a route: /v1/knowledge/{name})"
        ))
        .with_details(json!({"field": "name"})));
    }
    let path = body.path.unwrap_or_default();
    if !path.is_empty() && !std::path::Path::new(&path).is_absolute() {
        return Err(ApiError::invalid(format!(
            "field \"path\" must be an absolute path (got {:?}); the CLI resolves relative ones",
            path.chars().take(200).collect::<String>()
        ))
        .with_details(json!({"field": "path"})));
    }
    Ok(AddKnowledgeBaseRequest {
        name,
        path,
        include: body.include.unwrap_or_default(),
        exclude: body.exclude.unwrap_or_default(),
    })
}

/// `POST /v1/knowledge {name, path?, include?, exclude?}` → 201 [`api::KnowledgeBaseInfo`];
/// indexing starts in the background.
async fn add_kb(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<KnowledgeBaseCreate>,
) -> Result<(StatusCode, Json<api::KnowledgeBaseInfo>), ApiError> {
    let req = add_request(body)?;
    let kb = call(st.retrieval.clone().add_knowledge_base(req)).await.map_err(ApiError::from_retrieval)?;
    // Logged once added: a refused add (a name or folder taken, a bad path) is not one.
    tracing::info!(kb = %kb.name, "Knowledge base added.");
    Ok((StatusCode::CREATED, Json(retrieval::kb(kb))))
}

/// `GET /v1/knowledge/{kb}` → [`api::KnowledgeBaseInfo`] with `progress` and `errors`.
async fn get_kb(
    State(st): State<Arc<AppState>>,
    Path(kb): Path<String>,
) -> Result<Json<api::KnowledgeBaseInfo>, ApiError> {
    check_len("kb", &kb, MAX_KB_NAME_BYTES)?;
    let kb = call(st.retrieval.clone().get_knowledge_base(KnowledgeBaseName { name: kb }))
        .await
        .map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::kb(kb)))
}

/// `PATCH /v1/knowledge/{kb} {"writable": bool}` → [`api::KnowledgeBaseInfo`]: marks the user's
/// folder writable (or read-only again) for `coffer__write_note`.
async fn patch_kb(
    State(st): State<Arc<AppState>>,
    Path(kb): Path<String>,
    JsonBody(body): JsonBody<KnowledgeBasePatch>,
) -> Result<Json<api::KnowledgeBaseInfo>, ApiError> {
    check_len("kb", &kb, MAX_KB_NAME_BYTES)?;
    let info = match body.writable {
        Some(writable) => {
            tracing::info!(kb = %kb, writable, "Knowledge base writability set.");
            call(st.retrieval.clone().set_writable(SetWritableRequest { kb, writable })).await
        }
        None => call(st.retrieval.clone().get_knowledge_base(KnowledgeBaseName { name: kb })).await,
    }
    .map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::kb(info)))
}

/// The query of `GET /v1/knowledge/{kb}/note`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoteQuery {
    path: String,
    #[serde(default)]
    start_line: Option<u32>,
    #[serde(default)]
    end_line: Option<u32>,
    #[serde(default)]
    start_byte: Option<u32>,
}

/// `GET /v1/knowledge/{kb}/note?path=&start_line=&end_line=&start_byte=` → [`api::Note`].
async fn read_note(
    State(st): State<Arc<AppState>>,
    Path(kb): Path<String>,
    query: Result<Query<NoteQuery>, QueryRejection>,
) -> Result<Json<api::Note>, ApiError> {
    check_len("kb", &kb, MAX_KB_NAME_BYTES)?;
    let Query(q) = query.map_err(|e| ApiError::invalid(format!("malformed query string: {}", e.body_text())))?;
    let req = ReadNoteRequest {
        kb,
        path: q.path,
        start_line: q.start_line.unwrap_or(0),
        end_line: q.end_line.unwrap_or(0),
        start_byte: q.start_byte.unwrap_or(0),
    };
    let n = call(st.retrieval.clone().read_note(req)).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::note(n)))
}

/// `DELETE /v1/knowledge/{kb}` → `{"removed": N}` (documents forgotten); never deletes a file.
async fn remove_kb(State(st): State<Arc<AppState>>, Path(kb): Path<String>) -> Result<Json<api::Removed>, ApiError> {
    check_len("kb", &kb, MAX_KB_NAME_BYTES)?;
    tracing::info!(kb = %kb, "Knowledge base removed.");
    let r = call(st.retrieval.clone().remove_knowledge_base(KnowledgeBaseName { name: kb }))
        .await
        .map_err(ApiError::from_retrieval)?;
    Ok(Json(api::Removed { removed: r.removed }))
}

/// The `Reindex` request of a `POST /v1/knowledge/reindex` body.
///
/// # Errors
/// `INVALID_ARGUMENT` for a `kb` name over [`MAX_KB_NAME_BYTES`].
pub fn reindex_request(body: Reindex) -> Result<ReindexRequest, ApiError> {
    let kb = body.kb.unwrap_or_default();
    check_len("kb", &kb, MAX_KB_NAME_BYTES)?;
    Ok(ReindexRequest { kb, clean: body.clean.unwrap_or(false) })
}

/// `POST /v1/knowledge/reindex {kb?, clean?}` → 202 [`api::ReindexStarted`]: the pass has
/// started; follow it with `GET /v1/knowledge/{kb}`.
async fn reindex(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<Reindex>,
) -> Result<(StatusCode, Json<api::ReindexStarted>), ApiError> {
    let req = reindex_request(body)?;
    let r = call(st.retrieval.clone().reindex(req)).await.map_err(ApiError::from_retrieval)?;
    let items = r.knowledge_bases.into_iter().map(retrieval::kb).collect();
    Ok((StatusCode::ACCEPTED, Json(api::ReindexStarted { items })))
}

/// The `Search` request of a `POST /v1/knowledge/search` body.
///
/// # Errors
/// `INVALID_ARGUMENT` ([`check_len`]) for a `query`, `kb` name, `path_prefix` or `cursor` over
/// its limit.
pub fn search_request(body: SearchBody) -> Result<SearchRequest, ApiError> {
    check_len("query", body.query.trim(), MAX_QUERY_BYTES)?;
    for kb in body.kb.iter().flatten() {
        check_len("kb", kb, MAX_KB_NAME_BYTES)?;
    }
    check_len("path_prefix", body.path_prefix.as_deref().unwrap_or_default(), MAX_PATH_PREFIX_BYTES)?;
    check_len("cursor", body.cursor.as_deref().unwrap_or_default(), MAX_CURSOR_BYTES)?;
    Ok(SearchRequest {
        query: body.query,
        filters: Some(SearchFilters {
            kb: body.kb.unwrap_or_default(),
            path_prefix: body.path_prefix.unwrap_or_default(),
            tags: body.tags.unwrap_or_default(),
            modified_after_ms: body.modified_after_ms.unwrap_or(0),
        }),
        engines: body.engines.unwrap_or_default(),
        limit: body.limit.unwrap_or(0),
        snippet_chars: body.snippet_chars.unwrap_or(0),
        regex: body.regex.unwrap_or(false),
        cursor: body.cursor.unwrap_or_default(),
    })
}

/// `POST /v1/knowledge/search {query, kb?, path_prefix?, tags?, modified_after_ms?, engines?,
/// limit?, snippet_chars?, regex?, cursor?}` → [`api::SearchReply`] (without a query but with
/// tags: the notes with those tags, a page at a time, `next_cursor` for the next).
async fn search(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<SearchBody>,
) -> Result<Json<api::SearchReply>, ApiError> {
    let req = search_request(body)?;
    let r = call(st.retrieval.clone().search(req)).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::search_reply(r)))
}

// ---------------------------------------------------------------------------------------------
// Memory.

/// The `Remember` request of a `POST /v1/memory` body; `source` defaults to the request's
/// actor (`cli`, `api`, …); `allow_secret: true` stores a text that looks like it holds a
/// secret (refused otherwise).
pub fn remember_request(body: FactCreate, actor: String) -> RememberRequest {
    RememberRequest {
        text: body.text,
        tags: body.tags.unwrap_or_default(),
        source: body.source.filter(|s| !s.is_empty()).unwrap_or(actor),
        allow_secret: body.allow_secret.unwrap_or(false),
    }
}

/// `POST /v1/memory {text, tags?, source?, allow_secret?}` → 201 `{"fact": Fact, "created": true}`, or 200
/// `{"fact": existing, "created": false, "similarity": 0.97}` for a duplicate ([`api::RememberReply`]).
async fn remember(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<FactCreate>,
) -> Result<(StatusCode, Json<api::RememberReply>), ApiError> {
    let req = remember_request(body, crate::rest::servers::actor(&headers));
    let r = call(st.retrieval.clone().remember(req)).await.map_err(ApiError::from_retrieval)?;
    let status = if r.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(retrieval::remember(r))))
}

/// The `ListFacts` request of `GET /v1/memory?limit=&cursor=&tag=` (`tag` repeatable).
///
/// # Errors
/// `INVALID_ARGUMENT` naming an unknown or repeated parameter or a bad limit.
pub fn list_facts_request(pairs: Vec<(String, String)>) -> Result<ListFactsRequest, ApiError> {
    let mut req = ListFactsRequest { limit: FACTS_PAGE, after: String::new(), tags: Vec::new() };
    let mut seen = std::collections::HashSet::new();
    for (k, v) in pairs {
        let bad = |msg: String| ApiError::invalid(msg).with_details(json!({"parameter": k}));
        if k != "tag" && !seen.insert(k.clone()) {
            return Err(bad(format!("parameter {k:?} is given more than once")));
        }
        match k.as_str() {
            "limit" => {
                req.limit =
                    v.parse::<u32>().ok().filter(|n| (1..=MAX_FACTS_PAGE).contains(n)).ok_or_else(|| {
                        bad(format!("limit must be an integer from 1 to {MAX_FACTS_PAGE} (got {:?})", v))
                    })?;
            }
            "cursor" => req.after = v,
            "tag" if !v.is_empty() => req.tags.push(v),
            "tag" => {}
            _ => {
                let shown: String = k.chars().take(40).collect();
                return Err(bad(format!("unknown parameter {shown:?}; expected one of limit, cursor, tag")));
            }
        }
    }
    Ok(req)
}

/// `GET /v1/memory?limit=&cursor=&tag=` → `{"items":[Fact…],"next_cursor":…}` ([`api::Facts`]),
/// newest first.
async fn list_facts(
    State(st): State<Arc<AppState>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<api::Facts>, ApiError> {
    let Query(pairs) = query.map_err(|e| ApiError::invalid(format!("malformed query string: {}", e.body_text())))?;
    let r =
        call(st.retrieval.clone().list_facts(list_facts_request(pairs)?)).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(api::Facts {
        items: r.facts.into_iter().map(retrieval::fact).collect(),
        next_cursor: (!r.next_cursor.is_empty()).then_some(r.next_cursor),
    }))
}

/// `GET /v1/memory/{id}` → [`api::Fact`].
async fn get_fact(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<api::Fact>, ApiError> {
    let f = call(st.retrieval.clone().get_fact(FactId { id })).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::fact(f)))
}

/// `DELETE /v1/memory/{id}` → `{"removed": 1}`: the fact's file and its index entries are gone.
async fn forget(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<api::Removed>, ApiError> {
    let r = call(st.retrieval.clone().forget(FactId { id: id.clone() })).await.map_err(ApiError::from_retrieval)?;
    if r.removed == 0 {
        return Err(ApiError::not_found(format!("no fact {id:?}")));
    }
    Ok(Json(api::Removed { removed: r.removed }))
}

/// The `Recall` request of a `POST /v1/memory/recall` body.
pub fn recall_request(body: RecallBody) -> RecallRequest {
    RecallRequest {
        query: body.query,
        tags: body.tags.unwrap_or_default(),
        limit: body.limit.unwrap_or(0),
        snippet_chars: body.snippet_chars.unwrap_or(0),
    }
}

/// `POST /v1/memory/recall {query, tags?, limit?, snippet_chars?}` → [`api::SearchReply`] over
/// memory.
async fn recall(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<RecallBody>,
) -> Result<Json<api::SearchReply>, ApiError> {
    let req = recall_request(body);
    let r = call(st.retrieval.clone().recall(req)).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::search_reply(r)))
}

// ---------------------------------------------------------------------------------------------
// Skills.

/// `GET /v1/skills` → `{"items":[SkillSummary…],"next_cursor":null,"invalid":[{name, error}…]}`
/// ([`skills::Skills`]).
async fn list_skills(State(st): State<Arc<AppState>>) -> Result<Json<skills::Skills>, ApiError> {
    let r = call(st.retrieval.clone().list_skills(ListSkillsRequest {})).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(skills::Skills {
        items: r.skills.into_iter().map(retrieval::skill_summary).collect(),
        next_cursor: None,
        invalid: r.invalid.into_iter().map(retrieval::invalid_skill).collect(),
    }))
}

/// `GET /v1/skills/{name}` → [`skills::Skill`].
async fn load_skill(
    State(st): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Result<Json<skills::Skill>, ApiError> {
    let s = call(st.retrieval.clone().load_skill(SkillName { name })).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::skill(s)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use serde_json::Value;

    fn body<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, ApiError> {
        Ok(coffer_api::body::from_value(v)?)
    }
    fn add(v: Value) -> Result<AddKnowledgeBaseRequest, ApiError> {
        add_request(body(v)?)
    }
    fn reindex(v: Value) -> Result<ReindexRequest, ApiError> {
        reindex_request(body(v)?)
    }
    fn search(v: Value) -> Result<SearchRequest, ApiError> {
        search_request(body(v)?)
    }
    fn recall(v: Value) -> Result<RecallRequest, ApiError> {
        body(v).map(recall_request)
    }
    fn remember(v: Value, actor: String) -> Result<RememberRequest, ApiError> {
        body(v).map(|b| remember_request(b, actor))
    }

    #[test]
    fn knowledge_base_bodies_are_checked_field_by_field() {
        let r = add(json!({"name": "notes", "path": "/srv/notes", "include": ["**/*.md"]})).unwrap();
        assert_eq!((r.name.as_str(), r.path.as_str(), r.include.len(), r.exclude.len()), ("notes", "/srv/notes", 1, 0));
        assert_eq!(add(json!({"name": "notes", "path": null})).unwrap().path, "");
        let e = add(json!({"name": "notes", "path": "notes"})).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("absolute"), "{}", e.message);
        let e = add(json!({"name": "notes", "paht": "/x"})).unwrap_err();
        assert_eq!((e.code, &e.details["field"]), (Code::UnknownField, &json!("paht")));
        let e = add(json!({"name": 7})).unwrap_err();
        assert_eq!(e.message, "field \"name\" must be a string, not an integer");
        assert_eq!((&e.details["field"], &e.details["got"]), (&json!("name"), &json!("integer")));
        let e = add(json!({"name": "n", "include": ["a", 1]})).unwrap_err();
        assert_eq!(e.message, "field \"include[1]\" must be a string, not an integer");
        assert_eq!(add(json!({})).unwrap_err().message, "field \"name\" is required");
        assert_eq!(add(json!([1])).unwrap_err().message, "the body must be a JSON object, not an array");
        for reserved in RESERVED_KB_NAMES {
            assert_eq!(add(json!({"name": reserved})).unwrap_err().code, Code::InvalidArgument);
        }
        let r = reindex(json!({"kb": "notes", "clean": true})).unwrap();
        assert_eq!((r.kb.as_str(), r.clean), ("notes", true));
        assert_eq!(
            reindex(json!({"clean": "yes"})).unwrap_err().message,
            "field \"clean\" must be a boolean, not a string"
        );
    }

    #[test]
    fn search_bodies_carry_every_filter() {
        let r = search(json!({
            "query": "rotate keys", "kb": ["notes"], "path_prefix": "ops/", "tags": ["a"], "modified_after_ms": 5,
            "engines": ["keyword"], "limit": 3, "snippet_chars": 100, "regex": true,
        }))
        .unwrap();
        let f = r.filters.unwrap();
        assert_eq!((r.query.as_str(), r.limit, r.snippet_chars, r.regex), ("rotate keys", 3, 100, true));
        assert_eq!(
            (f.kb, f.path_prefix, f.tags, f.modified_after_ms),
            (vec!["notes".to_owned()], "ops/".to_owned(), vec!["a".to_owned()], 5)
        );
        assert_eq!(r.engines, ["keyword"]);
        // The query's contents are the service's to judge (empty, too long); its type is ours.
        assert_eq!(search(json!({"query": ""})).unwrap().query, "");
        let e = search(json!({"query": "x", "limit": -1})).unwrap_err();
        assert_eq!(e.message, "field \"limit\" must be an integer from 0 to 4294967295 (got -1)");
        let e = search(json!({"query": "x", "limit": 1.5})).unwrap_err();
        assert!(e.message.ends_with("not a number"), "{}", e.message);
        let e = search(json!({"query": "x", "kb": "notes"})).unwrap_err();
        assert_eq!(e.message, "field \"kb\" must be an array, not a string");
        assert_eq!(search(json!({"q": "x"})).unwrap_err().code, Code::UnknownField);
        let r = recall(json!({"query": "x", "tags": ["t"], "limit": 2})).unwrap();
        assert_eq!((r.tags.len(), r.limit, r.snippet_chars), (1, 2, 0));
    }

    #[test]
    fn facts_take_their_source_from_the_actor_unless_given() {
        let r = remember(json!({"text": "t", "tags": ["x"]}), "cli".into()).unwrap();
        assert_eq!((r.source.as_str(), r.tags.len()), ("cli", 1));
        let r = remember(json!({"text": "t", "source": "import"}), "cli".into()).unwrap();
        assert_eq!(r.source, "import");
        assert_eq!(remember(json!({"txt": "t"}), "api".into()).unwrap_err().code, Code::UnknownField);
    }

    #[test]
    fn fact_pages_take_repeated_tags() {
        let pairs = |p: &[(&str, &str)]| p.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<Vec<_>>();
        let r = list_facts_request(pairs(&[("tag", "a"), ("tag", "b"), ("limit", "5"), ("cursor", "01J")])).unwrap();
        assert_eq!((r.tags, r.limit, r.after.as_str()), (vec!["a".to_owned(), "b".to_owned()], 5, "01J"));
        assert_eq!(list_facts_request(Vec::new()).unwrap().limit, FACTS_PAGE);
        for bad in [
            &[("limit", "0")][..],
            &[("limit", "501")],
            &[("limit", "x")],
            &[("nope", "1")],
            &[("limit", "1"), ("limit", "2")],
        ] {
            let e = list_facts_request(pairs(bad)).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad:?}");
            assert!(e.details.get("parameter").is_some(), "{bad:?}");
        }
    }
}
