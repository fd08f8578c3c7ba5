//! The edge's client of `coffer-retrieval` (`proto/retrieval.proto`, `coffer.retrieval.v1`)
//! and the one JSON form of its messages, shared by REST (`rest::knowledge`) and the built-in
//! MCP tools (`mcp::builtin`).
//!
//! JSON: the proto messages with their field names (snake_case), enums as lowercase words (job
//! state `idle|scanning|indexing|failed`, engine state `ok|failed|timeout|disabled`), times as
//! `*_ms` Unix milliseconds (`null` when the service sent 0: never, unknown).
//!
//! Every call goes through [`call`]: a deadline ([`CALL_TIMEOUT`]), and a channel whose HTTP/2
//! keep-alive pings notice within ~3 s (`COFFER_RETRIEVAL_PING_MS`, [`keepalive`]) a peer that does not run (the supervisor keeps the
//! listener of a stopped or restarting service, so the connection is accepted by the kernel
//! and nobody answers). Failures become the envelope in `error::ApiError::from_retrieval`.
use std::time::Duration;

use coffer_proto::retrieval::retrieval_client::RetrievalClient;
use coffer_proto::retrieval::{
    EngineConfig, EngineReport, EngineState, Fact, FileError, InvalidSkill, JobState, KnowledgeBaseInfo, Progress,
    RememberReply, SearchReply, SearchResult, Skill, SkillSummary,
};
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;
use serde_json::{Value, json};

/// The Retrieval client type; cheap to clone (call a method on a clone: tonic clients take
/// `&mut self`).
pub type Client = RetrievalClient<AuthChannel>;

/// Longest retrieval reply the edge decodes (bytes): a status with many file errors can be large.
pub const MAX_REPLY: usize = 16 * 1024 * 1024;

/// Deadline of one retrieval call. Searches answer within their engines' deadline
/// (`retrieval.engine_timeout_ms`), everything else answers at once (indexing runs in the
/// background); this only bounds a service that accepted the call and never answers.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the channel pings the peer while a call is in flight, and how long it waits for
/// the answer before it gives the connection up (the call then fails as `UNAVAILABLE`).
/// `COFFER_RETRIEVAL_PING_MS` sets the interval ([`keepalive`]).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The keep-alive (interval, answer timeout): [`KEEPALIVE_INTERVAL`] and [`KEEPALIVE_TIMEOUT`],
/// or, when `COFFER_RETRIEVAL_PING_MS` is a whole number of milliseconds in 100-60000, that
/// interval and twice it (a bad value is logged and the default used). The end-to-end tests
/// shorten it to prove the 503 of a stopped service without waiting 3 s per call.
pub fn keepalive() -> (Duration, Duration) {
    keepalive_from(std::env::var(coffer_runtime::env::RETRIEVAL_PING_MS).ok().as_deref())
}

fn keepalive_from(value: Option<&str>) -> (Duration, Duration) {
    let Some(v) = value else { return (KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT) };
    match v.trim().parse::<u64>() {
        Ok(ms) if (100..=60_000).contains(&ms) => (Duration::from_millis(ms), Duration::from_millis(2 * ms)),
        _ => {
            tracing::warn!(
                value = %coffer_runtime::logging::clip(v),
                "{} is not a number of milliseconds in 100-60000; using 1000.",
                coffer_runtime::env::RETRIEVAL_PING_MS
            );
            (KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
        }
    }
}

/// A lazily connecting client of the retrieval service at `addr` (`127.0.0.1:port`) presenting
/// `token`, with the keep-alive described in the module docs.
///
/// # Errors
/// When `addr` is not a valid authority.
pub fn client(addr: &str, token: &SecretString) -> Result<Client, tonic::transport::Error> {
    Ok(over(channel(addr, token)?))
}

/// A lazily connecting channel to the service at `addr` presenting `token`, with the
/// keep-alive described in the module docs; every client of this service shares it
/// ([`crate::clients::Clients`]).
///
/// # Errors
/// When `addr` is not a valid authority.
pub fn channel(addr: &str, token: &SecretString) -> Result<AuthChannel, tonic::transport::Error> {
    let (interval, timeout) = keepalive();
    coffer_runtime::grpc::watched_channel(addr, token, interval, timeout)
}

/// The client over `ch` (from [`channel`]), with its message size limits.
pub fn over(ch: AuthChannel) -> Client {
    RetrievalClient::new(ch).max_decoding_message_size(MAX_REPLY)
}

/// Runs one retrieval call with [`CALL_TIMEOUT`]; a call that takes longer is
/// `DEADLINE_EXCEEDED`.
///
/// # Errors
/// The call's status.
pub async fn call<T>(
    fut: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    coffer_runtime::grpc::call_within("retrieval service", CALL_TIMEOUT, fut).await
}

// ---------------------------------------------------------------------------------------------
// JSON.

/// A Unix-ms time, `null` for 0 (never / unknown).
fn ms(v: i64) -> Value {
    if v > 0 { json!(v) } else { Value::Null }
}

/// A job state as its lowercase word (`idle` for an unspecified one: nothing is known to run).
pub fn job_state(s: JobState) -> &'static str {
    match s {
        JobState::Unspecified | JobState::Idle => "idle",
        JobState::Scanning => "scanning",
        JobState::Indexing => "indexing",
        JobState::Failed => "failed",
    }
}

/// Every job state word, for schemas.
pub const JOB_STATES: &[&str] = &["idle", "scanning", "indexing", "failed"];

/// An engine state as its lowercase word (`disabled` for an unspecified one).
pub fn engine_state(s: EngineState) -> &'static str {
    match s {
        EngineState::Ok => "ok",
        EngineState::Failed => "failed",
        EngineState::Timeout => "timeout",
        EngineState::Unspecified | EngineState::Disabled => "disabled",
    }
}

/// Every engine state word, for schemas.
pub const ENGINE_STATES: &[&str] = &["ok", "failed", "timeout", "disabled"];

/// `Progress` → `{state, done, total, bytes_done, bytes_total, started_ms, message, job}`.
pub fn progress_json(p: &Progress) -> Value {
    json!({
        "state": job_state(p.state()), "done": p.done, "total": p.total,
        "bytes_done": p.bytes_done, "bytes_total": p.bytes_total, "started_ms": ms(p.started_ms),
        "message": p.message, "job": p.job,
    })
}

fn file_error_json(e: &FileError) -> Value {
    json!({"path": e.path, "error": e.error})
}

/// `KnowledgeBaseInfo` → its JSON (`progress` null when the service sent none).
pub fn kb_json(k: &KnowledgeBaseInfo) -> Value {
    json!({
        "name": k.name, "kind": k.kind, "root": k.root, "include": k.include, "exclude": k.exclude,
        "created_ms": ms(k.created_ms), "documents": k.documents, "chunks": k.chunks, "embedded": k.embedded,
        "last_sync_ms": ms(k.last_sync_ms), "pending": k.pending, "pending_embeddings": k.pending_embeddings,
        "errors": k.errors.iter().map(file_error_json).collect::<Vec<_>>(),
        "progress": k.progress.as_ref().map_or(Value::Null, progress_json),
        "watching": k.watching,
    })
}

/// `EngineConfig` → `{name, enabled, detail}`.
pub fn engine_config_json(e: &EngineConfig) -> Value {
    json!({"name": e.name, "enabled": e.enabled, "detail": e.detail})
}

/// `SearchReply` → `{results, engines, warnings, took_ms, fusion}` as a JSON value (the built-in
/// tools' `structuredContent`); REST serializes [`SearchReplyView`] directly.
pub fn search_reply_json(r: &SearchReply) -> Value {
    serde_json::to_value(SearchReplyView::from(r)).unwrap_or(Value::Null)
}

/// The JSON form of a `SearchReply`, serialized straight from the reply (no intermediate
/// `Value`: a search's answer is on the path its caller waits on). A result is `{kb, path,
/// title, heading_path, line_start, line_end, snippet, score, ranks: [{engine, rank, score}],
/// tags, modified_ms, fact_id, absolute_path}` (`fact_id` `null` outside memory,
/// `modified_ms` `null` when unknown); an engine report `{engine, state, hits, took_ms,
/// message}`.
#[derive(serde::Serialize)]
pub struct SearchReplyView<'a> {
    results: Vec<SearchResultView<'a>>,
    engines: Vec<EngineReportView<'a>>,
    warnings: &'a [String],
    took_ms: u32,
    fusion: &'a str,
}

impl<'a> From<&'a SearchReply> for SearchReplyView<'a> {
    fn from(r: &'a SearchReply) -> Self {
        Self {
            results: r.results.iter().map(SearchResultView::from).collect(),
            engines: r.engines.iter().map(EngineReportView::from).collect(),
            warnings: &r.warnings,
            took_ms: r.took_ms,
            fusion: &r.fusion,
        }
    }
}

#[derive(serde::Serialize)]
struct SearchResultView<'a> {
    kb: &'a str,
    path: &'a str,
    title: &'a str,
    heading_path: &'a [String],
    line_start: u32,
    line_end: u32,
    snippet: &'a str,
    score: f64,
    ranks: Vec<RankView<'a>>,
    tags: &'a [String],
    modified_ms: Option<i64>,
    fact_id: Option<&'a str>,
    absolute_path: &'a str,
}

impl<'a> From<&'a SearchResult> for SearchResultView<'a> {
    fn from(r: &'a SearchResult) -> Self {
        Self {
            kb: &r.kb,
            path: &r.path,
            title: &r.title,
            heading_path: &r.heading_path,
            line_start: r.line_start,
            line_end: r.line_end,
            snippet: &r.snippet,
            score: r.score,
            ranks: r.ranks.iter().map(|k| RankView { engine: &k.engine, rank: k.rank, score: k.score }).collect(),
            tags: &r.tags,
            modified_ms: (r.modified_ms > 0).then_some(r.modified_ms),
            fact_id: (!r.fact_id.is_empty()).then_some(r.fact_id.as_str()),
            absolute_path: &r.absolute_path,
        }
    }
}

#[derive(serde::Serialize)]
struct RankView<'a> {
    engine: &'a str,
    rank: u32,
    score: f64,
}

#[derive(serde::Serialize)]
struct EngineReportView<'a> {
    engine: &'a str,
    state: &'static str,
    hits: u32,
    took_ms: u32,
    message: &'a str,
}

impl<'a> From<&'a EngineReport> for EngineReportView<'a> {
    fn from(e: &'a EngineReport) -> Self {
        Self {
            engine: &e.engine,
            state: engine_state(e.state()),
            hits: e.hits,
            took_ms: e.took_ms,
            message: &e.message,
        }
    }
}

/// `Fact` → `{id, text, tags, source, created_ms, path}`.
pub fn fact_json(f: &Fact) -> Value {
    let mut v = json!({"id": f.id, "text": f.text, "tags": f.tags, "source": f.source, "created_ms": ms(f.created_ms), "path": f.path});
    if !f.warning.is_empty() {
        v["warning"] = json!(f.warning);
    }
    v
}

/// `RememberReply` → `{fact, created}` plus `similarity` for an existing duplicate.
pub fn remember_json(r: &RememberReply) -> Value {
    let mut v = json!({"fact": r.fact.as_ref().map_or(Value::Null, fact_json), "created": r.created});
    if !r.created {
        v["similarity"] = json!(r.similarity);
    }
    v
}

/// `SkillSummary` → `{name, description, path}`.
pub fn skill_summary_json(s: &SkillSummary) -> Value {
    json!({"name": s.name, "description": s.description, "path": s.path})
}

/// `InvalidSkill` → `{name, error}`.
pub fn invalid_skill_json(s: &InvalidSkill) -> Value {
    json!({"name": s.name, "error": s.error})
}

/// `Skill` → `{name, description, body, path, files, metadata}` (metadata keys sorted).
pub fn skill_json(s: &Skill) -> Value {
    let metadata: std::collections::BTreeMap<&String, &String> = s.metadata.iter().collect();
    json!({"name": s.name, "description": s.description, "body": s.body, "path": s.path, "files": s.files, "metadata": metadata})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ping_variable_sets_the_interval_and_twice_it_and_ignores_anything_else() {
        let default = (Duration::from_secs(1), Duration::from_secs(2));
        assert_eq!(keepalive_from(None), default);
        assert_eq!(keepalive_from(Some("250")), (Duration::from_millis(250), Duration::from_millis(500)));
        assert_eq!(keepalive_from(Some("60000")), (Duration::from_secs(60), Duration::from_secs(120)));
        for bad in ["", "0", "99", "60001", "1s", "x"] {
            assert_eq!(keepalive_from(Some(bad)), default, "{bad:?}");
        }
    }
    use coffer_proto::retrieval::EngineRank;

    #[test]
    fn enums_are_lowercase_words_and_zero_times_are_null() {
        let kb = KnowledgeBaseInfo {
            name: "notes".into(),
            kind: "folder".into(),
            root: "/n".into(),
            created_ms: 5,
            errors: vec![FileError { path: "a.bin".into(), error: "binary".into() }],
            progress: Some(Progress {
                state: JobState::Indexing as i32,
                done: 1,
                total: 4,
                job: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = kb_json(&kb);
        assert_eq!(v["progress"]["state"], "indexing");
        assert_eq!(v["progress"]["started_ms"], Value::Null);
        assert_eq!((&v["created_ms"], &v["last_sync_ms"]), (&json!(5), &Value::Null));
        assert_eq!(v["errors"], json!([{"path": "a.bin", "error": "binary"}]));
        assert_eq!(kb_json(&KnowledgeBaseInfo::default())["progress"], Value::Null);
        for (s, w) in [(JobState::Unspecified, "idle"), (JobState::Scanning, "scanning"), (JobState::Failed, "failed")]
        {
            assert_eq!(job_state(s), w);
            assert!(JOB_STATES.contains(&w));
        }
        for (s, w) in
            [(EngineState::Timeout, "timeout"), (EngineState::Ok, "ok"), (EngineState::Unspecified, "disabled")]
        {
            assert_eq!(engine_state(s), w);
            assert!(ENGINE_STATES.contains(&w));
        }
    }

    #[test]
    fn search_replies_keep_every_proto_field() {
        let r = SearchReply {
            results: vec![SearchResult {
                kb: "notes".into(),
                path: "a.md".into(),
                heading_path: vec!["A".into(), "B".into()],
                line_start: 3,
                line_end: 9,
                snippet: "the **word**".into(),
                ranks: vec![EngineRank { engine: "keyword".into(), rank: 1, score: 2.5 }],
                ..Default::default()
            }],
            engines: vec![EngineReport {
                engine: "vector".into(),
                state: EngineState::Failed as i32,
                message: "connection refused".into(),
                ..Default::default()
            }],
            warnings: vec!["vector engine failed: connection refused".into()],
            took_ms: 4,
            fusion: "rrf k=60".into(),
        };
        let v = search_reply_json(&r);
        let res = &v["results"][0];
        for key in [
            "kb",
            "path",
            "title",
            "heading_path",
            "line_start",
            "line_end",
            "snippet",
            "score",
            "ranks",
            "tags",
            "modified_ms",
            "fact_id",
            "absolute_path",
        ] {
            assert!(res.get(key).is_some(), "{key} missing: {res}");
        }
        assert_eq!(res["ranks"], json!([{"engine": "keyword", "rank": 1, "score": 2.5}]));
        assert_eq!(res["fact_id"], Value::Null);
        assert_eq!(v["engines"][0]["state"], "failed");
        assert_eq!((&v["took_ms"], &v["fusion"]), (&json!(4), &json!("rrf k=60")));
    }

    #[test]
    fn remember_reports_similarity_only_for_a_duplicate() {
        let fact = Fact { id: "01J".into(), text: "t".into(), ..Default::default() };
        let new = remember_json(&RememberReply { fact: Some(fact.clone()), created: true, similarity: 0.0 });
        assert!(new.get("similarity").is_none(), "{new}");
        let dup = remember_json(&RememberReply { fact: Some(fact), created: false, similarity: 0.97 });
        assert_eq!(
            (&dup["created"], &dup["similarity"], &dup["fact"]["id"]),
            (&json!(false), &json!(0.97), &json!("01J"))
        );
    }
}
