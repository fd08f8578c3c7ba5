//! The edge's client of `coffer-retrieval` (`proto/retrieval.proto`, `coffer.retrieval.v1`)
//! and the one JSON form of its messages, shared by REST (`rest::knowledge`) and the built-in
//! MCP tools (`mcp::builtin`).
//!
//! JSON: the proto messages as the contract's types (`coffer_api::knowledge`,
//! `coffer_api::skills`): their field names (snake_case), enums as lowercase words (job state
//! `idle|scanning|indexing|failed`, engine state `ok|failed|timeout|disabled`), times as `*_ms`
//! Unix milliseconds (`null` when the service sent 0: never, unknown).
//!
//! Every call goes through [`call`]: a deadline ([`CALL_TIMEOUT`]), and a channel whose HTTP/2
//! keep-alive pings notice within ~3 s (`COFFER_RETRIEVAL_PING_MS`, [`keepalive`]) a peer that does not run (the supervisor keeps the
//! listener of a stopped or restarting service, so the connection is accepted by the kernel
//! and nobody answers). Failures become the envelope in `error::ApiError::from_retrieval`.
use std::time::Duration;

use coffer_api::knowledge as api;
use coffer_api::skills;
use coffer_proto::retrieval::retrieval_client::RetrievalClient;
use coffer_proto::retrieval::{
    EngineConfig, EngineState, Fact, InvalidSkill, JobState, KnowledgeBaseInfo, Progress, RememberReply, SearchReply,
    SearchResult, Skill, SkillSummary,
};
use coffer_runtime::grpc::AuthChannel;
use secrecy::SecretString;
use serde_json::Value;

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
// JSON: the proto messages as the `coffer_api::knowledge` / `coffer_api::skills` types.

/// A Unix-ms time, `None` for 0 (never / unknown).
fn ms(v: i64) -> Option<i64> {
    (v > 0).then_some(v)
}

/// A job state as the API names it (`idle` for an unspecified one: nothing is known to run).
pub fn job_state(s: JobState) -> api::JobState {
    match s {
        JobState::Unspecified | JobState::Idle => api::JobState::Idle,
        JobState::Scanning => api::JobState::Scanning,
        JobState::Indexing => api::JobState::Indexing,
        JobState::Failed => api::JobState::Failed,
    }
}

/// An engine state as the API names it (`disabled` for an unspecified one).
pub fn engine_state(s: EngineState) -> api::EngineState {
    match s {
        EngineState::Ok => api::EngineState::Ok,
        EngineState::Failed => api::EngineState::Failed,
        EngineState::Timeout => api::EngineState::Timeout,
        EngineState::Unspecified | EngineState::Disabled => api::EngineState::Disabled,
    }
}

/// `Progress` as the API shows it (`started_ms` null for 0).
pub fn progress(p: &Progress) -> api::Progress {
    api::Progress {
        state: job_state(p.state()),
        done: p.done,
        total: p.total,
        bytes_done: p.bytes_done,
        bytes_total: p.bytes_total,
        started_ms: ms(p.started_ms),
        message: p.message.clone(),
        job: p.job,
    }
}

/// `KnowledgeBaseInfo` as the API shows it (`progress` null when the service sent none).
pub fn kb(k: KnowledgeBaseInfo) -> api::KnowledgeBaseInfo {
    api::KnowledgeBaseInfo {
        progress: k.progress.as_ref().map(progress),
        name: k.name,
        kind: k.kind,
        root: k.root,
        include: k.include,
        exclude: k.exclude,
        created_ms: ms(k.created_ms),
        documents: k.documents,
        chunks: k.chunks,
        embedded: k.embedded,
        last_sync_ms: ms(k.last_sync_ms),
        pending: k.pending,
        pending_embeddings: k.pending_embeddings,
        errors: k.errors.into_iter().map(|e| api::FileError { path: e.path, error: e.error }).collect(),
        watching: k.watching,
        hidden_skipped: k.hidden_skipped,
        hidden_skipped_count: k.hidden_skipped_count,
        corpus_bytes: k.corpus_bytes,
        index_bytes: k.index_bytes,
        writable: k.writable,
    }
}

/// `Note` as the API shows it.
pub fn note(n: coffer_proto::retrieval::Note) -> api::Note {
    api::Note {
        kb: n.kb,
        path: n.path,
        absolute_path: n.absolute_path,
        title: n.title,
        tags: n.tags,
        text: n.text,
        start_line: n.start_line,
        end_line: n.end_line,
        total_lines: n.total_lines,
        truncated: n.truncated,
        next: n.next,
        start_byte: n.start_byte,
        cut_at_byte: n.cut_at_byte,
        links: n
            .links
            .into_iter()
            .map(|l| api::NoteLink {
                target: l.target,
                fragment: l.fragment,
                alias: l.alias,
                embed: l.embed,
                line: l.line,
                resolved_path: l.resolved_path,
            })
            .collect(),
        backlinks: n
            .backlinks
            .into_iter()
            .map(|b| api::NoteBacklink {
                path: b.path,
                title: b.title,
                line: b.line,
                alias: b.alias,
                fragment: b.fragment,
                embed: b.embed,
            })
            .collect(),
        backlinks_truncated: n.backlinks_truncated,
        modified_ms: n.modified_ms,
        size: n.size,
        indexed: n.indexed,
    }
}

/// `EngineConfig` as the API shows it.
pub fn engine_config(e: EngineConfig) -> api::EngineConfig {
    api::EngineConfig { name: e.name, enabled: e.enabled, detail: e.detail }
}

/// `SearchReply` as the API shows it (`fact_id` null outside memory, `modified_ms` null when
/// unknown). Takes the reply: a search's answer is on the path its caller waits on, so its
/// strings are moved, not copied.
pub fn search_reply(r: SearchReply) -> api::SearchReply {
    api::SearchReply {
        results: r.results.into_iter().map(search_result).collect(),
        engines: r
            .engines
            .into_iter()
            .map(|e| api::EngineReport {
                state: engine_state(e.state()),
                engine: e.engine,
                hits: e.hits,
                took_ms: e.took_ms,
                message: e.message,
            })
            .collect(),
        warnings: r.warnings,
        took_ms: r.took_ms,
        fusion: r.fusion,
        next_cursor: (!r.next_cursor.is_empty()).then_some(r.next_cursor),
    }
}

fn search_result(r: SearchResult) -> api::SearchResult {
    api::SearchResult {
        kb: r.kb,
        path: r.path,
        title: r.title,
        heading_path: r.heading_path,
        line_start: r.line_start,
        line_end: r.line_end,
        snippet: r.snippet,
        score: r.score,
        ranks: r
            .ranks
            .into_iter()
            .map(|k| api::EngineRank { engine: k.engine, rank: k.rank, score: k.score })
            .collect(),
        tags: r.tags,
        modified_ms: ms(r.modified_ms),
        fact_id: (!r.fact_id.is_empty()).then_some(r.fact_id),
        absolute_path: r.absolute_path,
    }
}

/// `SearchReply` as a JSON value (the built-in tools' `structuredContent`).
pub fn search_reply_json(r: &SearchReply) -> Value {
    to_json(&search_reply(r.clone()))
}

/// `Fact` as the API shows it (`warning` only when the file has a problem).
pub fn fact(f: Fact) -> api::Fact {
    api::Fact {
        id: f.id,
        text: f.text,
        tags: f.tags,
        source: f.source,
        created_ms: ms(f.created_ms),
        path: f.path,
        warning: (!f.warning.is_empty()).then_some(f.warning),
    }
}

/// `RememberReply` as the API shows it: `similarity` only for an existing duplicate.
pub fn remember(r: RememberReply) -> api::RememberReply {
    api::RememberReply {
        fact: fact(r.fact.unwrap_or_default()),
        created: r.created,
        similarity: (!r.created).then_some(r.similarity),
    }
}

/// [`remember`] as a JSON value (the built-in tools' `structuredContent`).
pub fn remember_json(r: &RememberReply) -> Value {
    to_json(&remember(r.clone()))
}

/// `SkillSummary` as the API shows it.
pub fn skill_summary(s: SkillSummary) -> skills::SkillSummary {
    skills::SkillSummary { name: s.name, description: s.description, path: s.path }
}

/// `InvalidSkill` as the API shows it.
pub fn invalid_skill(s: InvalidSkill) -> skills::InvalidSkill {
    skills::InvalidSkill { name: s.name, error: s.error }
}

/// `Skill` as the API shows it (metadata keys sorted).
pub fn skill(s: Skill) -> skills::Skill {
    skills::Skill {
        name: s.name,
        description: s.description,
        body: s.body,
        path: s.path,
        files: s.files,
        metadata: s.metadata.into_iter().collect(),
    }
}

/// A contract type as a JSON value (for the built-in tools' `structuredContent`).
pub fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use coffer_proto::retrieval::{EngineRank, EngineReport, FileError};
    use serde_json::json;

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
        let v = to_json(&super::kb(kb));
        assert_eq!(v["progress"]["state"], "indexing");
        assert_eq!(v["progress"]["started_ms"], Value::Null);
        assert_eq!((&v["created_ms"], &v["last_sync_ms"]), (&json!(5), &Value::Null));
        assert_eq!(v["errors"], json!([{"path": "a.bin", "error": "binary"}]));
        assert_eq!(to_json(&super::kb(KnowledgeBaseInfo::default()))["progress"], Value::Null);
        for (s, w) in [(JobState::Unspecified, "idle"), (JobState::Scanning, "scanning"), (JobState::Failed, "failed")]
        {
            assert_eq!(to_json(&job_state(s)), w);
            assert_eq!(job_state(s).word(), w);
        }
        for (s, w) in
            [(EngineState::Timeout, "timeout"), (EngineState::Ok, "ok"), (EngineState::Unspecified, "disabled")]
        {
            assert_eq!(to_json(&engine_state(s)), w);
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
            ..Default::default()
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

    /// The wire keeps the field order (and nulls) it had when these bodies were `json!` literals.
    #[test]
    fn bodies_keep_their_field_order() {
        let keys = |v: Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>().join(",");
        assert_eq!(
            keys(to_json(&super::kb(KnowledgeBaseInfo::default()))),
            "name,kind,root,include,exclude,created_ms,documents,chunks,embedded,last_sync_ms,pending,pending_embeddings,errors,progress,watching,hidden_skipped,hidden_skipped_count,corpus_bytes,index_bytes,writable"
        );
        let p = Progress::default();
        assert_eq!(keys(to_json(&progress(&p))), "state,done,total,bytes_done,bytes_total,started_ms,message,job");
        let f = Fact { id: "01J".into(), warning: "bad front matter".into(), ..Default::default() };
        assert_eq!(keys(to_json(&fact(f.clone()))), "id,text,tags,source,created_ms,path,warning");
        assert_eq!(
            keys(to_json(&fact(Fact { warning: String::new(), ..f }))),
            "id,text,tags,source,created_ms,path",
            "no warning: no key"
        );
        let r = SearchReply { results: vec![SearchResult::default()], ..Default::default() };
        let v = search_reply_json(&r);
        assert_eq!(keys(v.clone()), "results,engines,warnings,took_ms,fusion");
        assert_eq!(
            keys(v["results"][0].clone()),
            "kb,path,title,heading_path,line_start,line_end,snippet,score,ranks,tags,modified_ms,fact_id,absolute_path"
        );
        let s = to_json(&skill(Skill::default()));
        assert_eq!(keys(s), "name,description,body,path,files,metadata");
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
