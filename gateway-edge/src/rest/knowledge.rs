//! `/v1/knowledge…`, `/v1/memory…`, `/v1/skills…`: REST over `coffer-retrieval`
//! (`proto/retrieval.proto`). Each route checks its body, makes one Retrieval call and answers
//! with the reply in the JSON of [`crate::retrieval`]; a failed call is the envelope of
//! [`ApiError::from_retrieval`] (400 `INVALID_ARGUMENT`, 404 `NOT_FOUND`, 409 `CONFLICT`, 503
//! `SERVICE_UNAVAILABLE` while the service is not running).
//!
//! Bodies are JSON objects checked field by field ([`Fields`]): an unknown field is
//! `UNKNOWN_FIELD`, a value of the wrong type `INVALID_ARGUMENT` naming the field, the type it
//! needs and the type it got. Limits on contents (query length, names, globs) are the service's,
//! which names the field and the limit.
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coffer_proto::retrieval::{
    AddKnowledgeBaseRequest, FactId, KnowledgeBaseName, ListFactsRequest, ListSkillsRequest, RecallRequest,
    ReindexRequest, RememberRequest, SearchFilters, SearchRequest, SkillName, StatusRequest,
};
use serde_json::{Map, Value, json};

use crate::error::{ApiError, Code, JsonBody};
use crate::retrieval::{self, call};
use crate::state::AppState;

/// Names a knowledge base cannot have here: `/v1/knowledge/<name>` would be these routes.
pub const RESERVED_KB_NAMES: &[&str] = &["reindex", "search"];

/// Default and largest page of `GET /v1/memory`.
pub const FACTS_PAGE: u32 = 50;
pub const MAX_FACTS_PAGE: u32 = 500;

/// The routes.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/knowledge", get(list_kbs).post(add_kb))
        .route("/v1/knowledge/reindex", post(reindex))
        .route("/v1/knowledge/search", post(search))
        .route("/v1/knowledge/{kb}", get(get_kb).delete(remove_kb))
        .route("/v1/memory", get(list_facts).post(remember))
        .route("/v1/memory/recall", post(recall))
        .route("/v1/memory/{id}", get(get_fact).delete(forget))
        .route("/v1/skills", get(list_skills))
        .route("/v1/skills/{name}", get(load_skill))
}

// ---------------------------------------------------------------------------------------------
// Body checks.

/// A JSON type's name as a message says it.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A request body: one JSON object whose fields are read one at a time, each checked for its
/// type (a `null` field counts as absent).
pub struct Fields(Map<String, Value>);

impl Fields {
    /// `body` as an object with no field outside `allowed`.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` when the body is not an object; `UNKNOWN_FIELD` naming the first
    /// unknown field (`details.field`, `details.allowed`).
    pub fn new(body: Value, allowed: &[&str]) -> Result<Self, ApiError> {
        let Value::Object(map) = body else {
            return Err(ApiError::invalid(format!("the body must be a JSON object, not {}", type_name(&body))));
        };
        if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            let shown: String = k.chars().take(40).collect();
            return Err(ApiError::new(
                Code::UnknownField,
                format!("unknown field {shown:?}; expected one of {}", allowed.join(", ")),
            )
            .with_details(json!({"field": shown, "allowed": allowed})));
        }
        Ok(Self(map))
    }

    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    /// Whether the body has field `k` (not `null`).
    pub fn has(&self, k: &str) -> bool {
        self.get(k).is_some()
    }

    fn wrong(k: &str, expected: &str, got: &Value) -> ApiError {
        ApiError::invalid(format!("field {k:?} must be {expected}, not {}", type_name(got)))
            .with_details(json!({"field": k, "expected": expected, "got": type_name(got).rsplit(' ').next()}))
    }

    /// A string field.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field when it is not a string.
    pub fn string(&self, k: &str) -> Result<Option<String>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(Self::wrong(k, "a string", v)),
        }
    }

    /// A string field that must be present.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field when it is absent or not a string.
    pub fn required_string(&self, k: &str) -> Result<String, ApiError> {
        self.string(k)?.ok_or_else(|| {
            ApiError::invalid(format!("field {k:?} is required (a string)")).with_details(json!({"field": k}))
        })
    }

    /// An array of strings (absent: empty).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field when it is not an array of strings.
    pub fn strings(&self, k: &str) -> Result<Vec<String>, ApiError> {
        match self.get(k) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| Self::wrong(k, "an array of strings", v)))
                .collect(),
            Some(v) => Err(Self::wrong(k, "an array of strings", v)),
        }
    }

    /// A non-negative integer field of at most `max`.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field and the range.
    pub fn uint(&self, k: &str, max: u64) -> Result<Option<u64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n)),
                _ if v.is_i64() || v.is_u64() => {
                    Err(ApiError::invalid(format!("field {k:?} must be an integer from 0 to {max} (got {v})"))
                        .with_details(json!({"field": k, "min": 0, "max": max})))
                }
                _ => Err(Self::wrong(k, &format!("an integer from 0 to {max}"), v)),
            },
        }
    }

    /// An integer field (Unix milliseconds and the like).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field.
    pub fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| Self::wrong(k, "an integer", v)),
        }
    }

    /// An object field checked like a body (no field outside `allowed`), absent: `None`.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field when it is not an object; `UNKNOWN_FIELD` naming
    /// `field.inner`.
    pub fn object(&self, k: &str, allowed: &[&str]) -> Result<Option<Fields>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v @ Value::Object(_)) => Fields::new(v.clone(), allowed).map(Some).map_err(|e| prefixed(k, e)),
            Some(v) => Err(Self::wrong(k, "an object", v)),
        }
    }

    /// An array of objects, each checked like a body (absent: empty).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field when it is not an array of objects; `UNKNOWN_FIELD`
    /// naming `field[i].inner`.
    pub fn objects(&self, k: &str, allowed: &[&str]) -> Result<Vec<Fields>, ApiError> {
        match self.get(k) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Object(_) => Fields::new(v.clone(), allowed).map_err(|e| prefixed(&format!("{k}[{i}]"), e)),
                    other => Err(Self::wrong(k, "an array of objects", other)),
                })
                .collect(),
            Some(v) => Err(Self::wrong(k, "an array of objects", v)),
        }
    }

    /// A boolean field, `None` when absent (for a patch: absent = unchanged).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field.
    pub fn opt_bool(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Self::wrong(k, "a boolean", v)),
        }
    }

    /// A boolean field (absent: false).
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` naming the field.
    pub fn bool(&self, k: &str) -> Result<bool, ApiError> {
        match self.get(k) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(Self::wrong(k, "a boolean", v)),
        }
    }
}

/// An error about a field of the object at `outer`, renamed `outer.field` (message and
/// `details.field`).
pub fn prefixed(outer: &str, mut e: ApiError) -> ApiError {
    if let Some(inner) = e.details.get("field").and_then(Value::as_str).map(str::to_owned) {
        let full = format!("{outer}.{inner}");
        e.message = e.message.replacen(&format!("{inner:?}"), &format!("{full:?}"), 1);
        e.details["field"] = json!(full);
    } else {
        e.message = format!("{outer}: {}", e.message);
    }
    e
}

// ---------------------------------------------------------------------------------------------
// Knowledge bases.

/// `GET /v1/knowledge` → `{"items":[KnowledgeBaseInfo…],"next_cursor":null,"engines":[EngineConfig…]}`
/// (the memory KB included, kind `memory`).
async fn list_kbs(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = call(st.retrieval.clone().status(StatusRequest {})).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(json!({
        "items": r.knowledge_bases.iter().map(retrieval::kb_json).collect::<Vec<_>>(),
        "next_cursor": null,
        "engines": r.engines.iter().map(retrieval::engine_config_json).collect::<Vec<_>>(),
    })))
}

/// The `AddKnowledgeBase` request of a `POST /v1/knowledge` body `{name, path?, include?,
/// exclude?}`.
///
/// # Errors
/// `INVALID_ARGUMENT` for a missing name, a reserved name ([`RESERVED_KB_NAMES`]), a relative
/// `path` or a field of the wrong type; `UNKNOWN_FIELD`.
pub fn add_request(body: Value) -> Result<AddKnowledgeBaseRequest, ApiError> {
    let f = Fields::new(body, &["name", "path", "include", "exclude"])?;
    let name = f.required_string("name")?;
    if RESERVED_KB_NAMES.contains(&name.as_str()) {
        return Err(ApiError::invalid(format!(
            "{name:?} cannot name a knowledge base (it is a route: /v1/knowledge/{name})"
        ))
        .with_details(json!({"field": "name"})));
    }
    let path = f.string("path")?.unwrap_or_default();
    if !path.is_empty() && !std::path::Path::new(&path).is_absolute() {
        return Err(ApiError::invalid(format!(
            "field \"path\" must be an absolute path (got {:?}); the CLI resolves relative ones",
            path.chars().take(200).collect::<String>()
        ))
        .with_details(json!({"field": "path"})));
    }
    Ok(AddKnowledgeBaseRequest { name, path, include: f.strings("include")?, exclude: f.strings("exclude")? })
}

/// `POST /v1/knowledge {name, path?, include?, exclude?}` → 201 KnowledgeBaseInfo; indexing
/// starts in the background.
async fn add_kb(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<Value>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let req = add_request(body)?;
    tracing::info!(kb = %req.name, "Knowledge base added.");
    let kb = call(st.retrieval.clone().add_knowledge_base(req)).await.map_err(ApiError::from_retrieval)?;
    Ok((StatusCode::CREATED, Json(retrieval::kb_json(&kb))))
}

/// `GET /v1/knowledge/{kb}` → KnowledgeBaseInfo with `progress` and `errors`.
async fn get_kb(State(st): State<Arc<AppState>>, Path(kb): Path<String>) -> Result<Json<Value>, ApiError> {
    let kb = call(st.retrieval.clone().get_knowledge_base(KnowledgeBaseName { name: kb }))
        .await
        .map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::kb_json(&kb)))
}

/// `DELETE /v1/knowledge/{kb}` → `{"removed": N}` (documents forgotten); never deletes a file.
async fn remove_kb(State(st): State<Arc<AppState>>, Path(kb): Path<String>) -> Result<Json<Value>, ApiError> {
    tracing::info!(kb = %kb, "Knowledge base removed.");
    let r = call(st.retrieval.clone().remove_knowledge_base(KnowledgeBaseName { name: kb }))
        .await
        .map_err(ApiError::from_retrieval)?;
    Ok(Json(json!({"removed": r.removed})))
}

/// The `Reindex` request of a `POST /v1/knowledge/reindex` body `{kb?, clean?}`.
///
/// # Errors
/// `INVALID_ARGUMENT` for a field of the wrong type; `UNKNOWN_FIELD`.
pub fn reindex_request(body: Value) -> Result<ReindexRequest, ApiError> {
    let f = Fields::new(body, &["kb", "clean"])?;
    Ok(ReindexRequest { kb: f.string("kb")?.unwrap_or_default(), clean: f.bool("clean")? })
}

/// `POST /v1/knowledge/reindex {kb?, clean?}` → 202 `{"items":[KnowledgeBaseInfo…]}`: the pass
/// has started; follow it with `GET /v1/knowledge/{kb}`.
async fn reindex(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody<Value>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let req = reindex_request(body)?;
    let r = call(st.retrieval.clone().reindex(req)).await.map_err(ApiError::from_retrieval)?;
    let items: Vec<Value> = r.knowledge_bases.iter().map(retrieval::kb_json).collect();
    Ok((StatusCode::ACCEPTED, Json(json!({"items": items}))))
}

/// The `Search` request of a `POST /v1/knowledge/search` body.
///
/// # Errors
/// `INVALID_ARGUMENT` for a missing query or a field of the wrong type; `UNKNOWN_FIELD`.
pub fn search_request(body: Value) -> Result<SearchRequest, ApiError> {
    let f = Fields::new(
        body,
        &["query", "kb", "path_prefix", "tags", "modified_after_ms", "engines", "limit", "snippet_chars", "regex"],
    )?;
    Ok(SearchRequest {
        query: f.required_string("query")?,
        filters: Some(SearchFilters {
            kb: f.strings("kb")?,
            path_prefix: f.string("path_prefix")?.unwrap_or_default(),
            tags: f.strings("tags")?,
            modified_after_ms: f.int("modified_after_ms")?.unwrap_or(0),
        }),
        engines: f.strings("engines")?,
        limit: f.uint("limit", u64::from(u32::MAX))?.unwrap_or(0) as u32,
        snippet_chars: f.uint("snippet_chars", u64::from(u32::MAX))?.unwrap_or(0) as u32,
        regex: f.bool("regex")?,
    })
}

/// `POST /v1/knowledge/search {query, kb?, path_prefix?, tags?, modified_after_ms?, engines?,
/// limit?, snippet_chars?, regex?}` → SearchReply.
async fn search(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody<Value>) -> Result<Response, ApiError> {
    let req = search_request(body)?;
    let r = call(st.retrieval.clone().search(req)).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::SearchReplyView::from(&r)).into_response())
}

// ---------------------------------------------------------------------------------------------
// Memory.

/// The `Remember` request of a `POST /v1/memory` body `{text, tags?, source?, allow_secret?}`;
/// `source` defaults to the request's actor (`cli`, `api`, …); `allow_secret: true` stores a
/// text that looks like it holds a secret (refused otherwise).
///
/// # Errors
/// `INVALID_ARGUMENT` for a missing text or a field of the wrong type; `UNKNOWN_FIELD`.
pub fn remember_request(body: Value, actor: String) -> Result<RememberRequest, ApiError> {
    let f = Fields::new(body, &["text", "tags", "source", "allow_secret"])?;
    Ok(RememberRequest {
        text: f.required_string("text")?,
        tags: f.strings("tags")?,
        source: f.string("source")?.filter(|s| !s.is_empty()).unwrap_or(actor),
        allow_secret: f.bool("allow_secret")?,
    })
}

/// `POST /v1/memory {text, tags?, source?, allow_secret?}` → 201 `{"fact": Fact, "created": true}`, or 200
/// `{"fact": existing, "created": false, "similarity": 0.97}` for a duplicate.
async fn remember(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let req = remember_request(body, crate::rest::servers::actor(&headers))?;
    let r = call(st.retrieval.clone().remember(req)).await.map_err(ApiError::from_retrieval)?;
    let status = if r.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(retrieval::remember_json(&r))))
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

/// `GET /v1/memory?limit=&cursor=&tag=` → `{"items":[Fact…],"next_cursor":…}`, newest first.
async fn list_facts(
    State(st): State<Arc<AppState>>,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(pairs) = query.map_err(|e| ApiError::invalid(format!("malformed query string: {}", e.body_text())))?;
    let r =
        call(st.retrieval.clone().list_facts(list_facts_request(pairs)?)).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(json!({
        "items": r.facts.iter().map(retrieval::fact_json).collect::<Vec<_>>(),
        "next_cursor": if r.next_cursor.is_empty() { Value::Null } else { json!(r.next_cursor) },
    })))
}

/// `GET /v1/memory/{id}` → Fact.
async fn get_fact(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let f = call(st.retrieval.clone().get_fact(FactId { id })).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::fact_json(&f)))
}

/// `DELETE /v1/memory/{id}` → `{"removed": 1}`: the fact's file and its index entries are gone.
async fn forget(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let r = call(st.retrieval.clone().forget(FactId { id: id.clone() })).await.map_err(ApiError::from_retrieval)?;
    if r.removed == 0 {
        return Err(ApiError::not_found(format!("no fact {id:?}")));
    }
    Ok(Json(json!({"removed": r.removed})))
}

/// The `Recall` request of a `POST /v1/memory/recall` body `{query, tags?, limit?,
/// snippet_chars?}`.
///
/// # Errors
/// `INVALID_ARGUMENT` for a missing query or a field of the wrong type; `UNKNOWN_FIELD`.
pub fn recall_request(body: Value) -> Result<RecallRequest, ApiError> {
    let f = Fields::new(body, &["query", "tags", "limit", "snippet_chars"])?;
    Ok(RecallRequest {
        query: f.required_string("query")?,
        tags: f.strings("tags")?,
        limit: f.uint("limit", u64::from(u32::MAX))?.unwrap_or(0) as u32,
        snippet_chars: f.uint("snippet_chars", u64::from(u32::MAX))?.unwrap_or(0) as u32,
    })
}

/// `POST /v1/memory/recall {query, tags?, limit?, snippet_chars?}` → SearchReply over memory.
async fn recall(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody<Value>) -> Result<Response, ApiError> {
    let req = recall_request(body)?;
    let r = call(st.retrieval.clone().recall(req)).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::SearchReplyView::from(&r)).into_response())
}

// ---------------------------------------------------------------------------------------------
// Skills.

/// `GET /v1/skills` → `{"items":[SkillSummary…],"next_cursor":null,"invalid":[{name, error}…]}`.
async fn list_skills(State(st): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = call(st.retrieval.clone().list_skills(ListSkillsRequest {})).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(json!({
        "items": r.skills.iter().map(retrieval::skill_summary_json).collect::<Vec<_>>(),
        "next_cursor": null,
        "invalid": r.invalid.iter().map(retrieval::invalid_skill_json).collect::<Vec<_>>(),
    })))
}

/// `GET /v1/skills/{name}` → Skill.
async fn load_skill(State(st): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let s = call(st.retrieval.clone().load_skill(SkillName { name })).await.map_err(ApiError::from_retrieval)?;
    Ok(Json(retrieval::skill_json(&s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knowledge_base_bodies_are_checked_field_by_field() {
        let r = add_request(json!({"name": "notes", "path": "/srv/notes", "include": ["**/*.md"]})).unwrap();
        assert_eq!((r.name.as_str(), r.path.as_str(), r.include.len(), r.exclude.len()), ("notes", "/srv/notes", 1, 0));
        assert_eq!(add_request(json!({"name": "notes", "path": null})).unwrap().path, "");
        let e = add_request(json!({"name": "notes", "path": "notes"})).unwrap_err();
        assert_eq!(e.code, Code::InvalidArgument);
        assert!(e.message.contains("absolute"), "{}", e.message);
        let e = add_request(json!({"name": "notes", "paht": "/x"})).unwrap_err();
        assert_eq!((e.code, &e.details["field"]), (Code::UnknownField, &json!("paht")));
        let e = add_request(json!({"name": 7})).unwrap_err();
        assert_eq!(e.message, "field \"name\" must be a string, not an integer");
        assert_eq!((&e.details["field"], &e.details["got"]), (&json!("name"), &json!("integer")));
        let e = add_request(json!({"name": "n", "include": ["a", 1]})).unwrap_err();
        assert_eq!(e.message, "field \"include\" must be an array of strings, not an integer");
        assert_eq!(add_request(json!({})).unwrap_err().message, "field \"name\" is required (a string)");
        assert_eq!(add_request(json!([1])).unwrap_err().message, "the body must be a JSON object, not an array");
        for reserved in RESERVED_KB_NAMES {
            assert_eq!(add_request(json!({"name": reserved})).unwrap_err().code, Code::InvalidArgument);
        }
        let r = reindex_request(json!({"kb": "notes", "clean": true})).unwrap();
        assert_eq!((r.kb.as_str(), r.clean), ("notes", true));
        assert_eq!(
            reindex_request(json!({"clean": "yes"})).unwrap_err().message,
            "field \"clean\" must be a boolean, not a string"
        );
    }

    #[test]
    fn search_bodies_carry_every_filter() {
        let r = search_request(json!({
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
        assert_eq!(search_request(json!({"query": ""})).unwrap().query, "");
        let e = search_request(json!({"query": "x", "limit": -1})).unwrap_err();
        assert_eq!(e.message, "field \"limit\" must be an integer from 0 to 4294967295 (got -1)");
        let e = search_request(json!({"query": "x", "limit": 1.5})).unwrap_err();
        assert!(e.message.ends_with("not a number"), "{}", e.message);
        let e = search_request(json!({"query": "x", "kb": "notes"})).unwrap_err();
        assert_eq!(e.message, "field \"kb\" must be an array of strings, not a string");
        assert_eq!(search_request(json!({"q": "x"})).unwrap_err().code, Code::UnknownField);
        let r = recall_request(json!({"query": "x", "tags": ["t"], "limit": 2})).unwrap();
        assert_eq!((r.tags.len(), r.limit, r.snippet_chars), (1, 2, 0));
    }

    #[test]
    fn facts_take_their_source_from_the_actor_unless_given() {
        let r = remember_request(json!({"text": "t", "tags": ["x"]}), "cli".into()).unwrap();
        assert_eq!((r.source.as_str(), r.tags.len()), ("cli", 1));
        let r = remember_request(json!({"text": "t", "source": "import"}), "cli".into()).unwrap();
        assert_eq!(r.source, "import");
        assert_eq!(remember_request(json!({"txt": "t"}), "api".into()).unwrap_err().code, Code::UnknownField);
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
