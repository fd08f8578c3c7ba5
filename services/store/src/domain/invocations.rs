//! The `Invocations` service: the invocation log (`mcp_invocations`: who called what through
//! the gateway, how long it took, how it ended; never arguments or results). Appends come in
//! batches from the gateway's invocation writer; they produce no change rows (logs are not part
//! of the change stream).
use coffer_proto::store::invocations_server::Invocations;
use coffer_proto::store::*;
use rusqlite::params;
use tonic::{Request, Response, Status};

use super::{MAX_PAGE, page, required};
use crate::db::Db;

/// Most rows one `AppendInvocations` takes.
pub const MAX_BATCH: usize = 10_000;

/// The actor recorded for a row that names none: an MCP client session.
pub const DEFAULT_ACTOR: &str = "mcp";

/// The `Invocations` gRPC service.
pub struct InvocationsService {
    db: Db,
}

impl InvocationsService {
    /// The service over `db`.
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[tonic::async_trait]
impl Invocations for InvocationsService {
    async fn append_invocations(
        &self,
        req: Request<AppendInvocationsRequest>,
    ) -> Result<Response<AppendInvocationsReply>, Status> {
        let items = req.into_inner().invocations;
        if items.len() > MAX_BATCH {
            return Err(Status::invalid_argument(format!("at most {MAX_BATCH} invocations per batch")));
        }
        let words = items
            .iter()
            .map(|i| {
                Ok((
                    required::<InvocationMethod>(i.method, "method")?.as_str(),
                    required::<InvocationOutcome>(i.outcome, "outcome")?.as_str(),
                ))
            })
            .collect::<Result<Vec<_>, crate::db::StoreError>>()?;
        let (ids, seq) = self
            .db
            .write(move |t, _| {
                let mut ids = Vec::with_capacity(items.len());
                let mut st = t.prepare_cached(
                    "INSERT INTO mcp_invocations (at, target, method, server, session_id, duration_ms, outcome, trace_id, actor,
                       usage_connection, usage_model, usage_input_tokens, usage_output_tokens, usage_iterations,
                       client_name, client_version, conversation_id, profile)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
                )?;
                for (i, (method, outcome)) in items.into_iter().zip(words) {
                    let actor = if i.actor.is_empty() { DEFAULT_ACTOR } else { &i.actor };
                    let u = i.usage.as_ref();
                    st.execute(params![
                        i.at,
                        i.target,
                        method,
                        i.server,
                        i.session_id,
                        i.duration_ms as i64,
                        outcome,
                        i.trace_id,
                        actor,
                        u.map(|u| u.connection.as_str()),
                        u.map(|u| u.model.as_str()),
                        u.map(|u| u.input_tokens.min(i64::MAX as u64) as i64),
                        u.map(|u| u.output_tokens.min(i64::MAX as u64) as i64),
                        u.map(|u| i64::from(u.iterations)),
                        i.client_name,
                        i.client_version,
                        i.conversation_id,
                        i.profile,
                    ])?;
                    ids.push(t.last_insert_rowid());
                }
                Ok(ids)
            })
            .await?;
        Ok(Response::new(AppendInvocationsReply { seq, ids }))
    }

    async fn list_invocations(
        &self,
        req: Request<ListInvocationsRequest>,
    ) -> Result<Response<ListInvocationsReply>, Status> {
        let q = req.into_inner();
        let limit = q.limit.clamp(1, MAX_PAGE);
        // Unspecified (or unknown) is "any outcome": the empty word.
        let outcome = q.outcome().as_str();
        let items = self
            .db
            .read(move |c| {
                let mut st = c.prepare_cached(
                    // The conversation's title comes from its row (a deleted one's is empty).
                    "SELECT i.id, i.at, i.target, i.method, i.server, i.session_id, i.duration_ms, i.outcome,
                       i.trace_id, i.actor, i.usage_connection, i.usage_model, i.usage_input_tokens,
                       i.usage_output_tokens, i.usage_iterations, i.client_name, i.client_version,
                       i.conversation_id, coalesce(c.title, ''), i.profile
                     FROM mcp_invocations i
                     LEFT JOIN conversations c ON i.conversation_id <> '' AND c.id = i.conversation_id
                     WHERE (?1 = '' OR i.server = ?1) AND (?2 = '' OR i.target = ?2) AND (?3 = '' OR i.outcome = ?3)
                       AND (?4 = '' OR i.at >= ?4) AND (?5 = '' OR i.at < ?5) AND (?6 = 0 OR i.id < ?6)
                       AND (?8 = '' OR i.actor = ?8) AND (?9 = '' OR i.client_name = ?9)
                       AND (?10 = '' OR i.conversation_id = ?10) AND (?11 = '' OR i.profile = ?11)
                     ORDER BY i.id DESC LIMIT ?7",
                )?;
                let args = params![
                    q.server,
                    q.target,
                    outcome,
                    q.since,
                    q.until,
                    q.before_id,
                    limit + 1,
                    q.actor,
                    q.client_name,
                    q.conversation_id,
                    q.profile
                ];
                let rows = st.query_map(args, |r| {
                    Ok(Invocation {
                        id: r.get(0)?,
                        at: r.get(1)?,
                        target: r.get(2)?,
                        method: InvocationMethod::parse(&r.get::<_, String>(3)?).unwrap_or_default().into(),
                        server: r.get(4)?,
                        session_id: r.get(5)?,
                        duration_ms: r.get::<_, i64>(6)? as u64,
                        outcome: InvocationOutcome::parse(&r.get::<_, String>(7)?).unwrap_or_default().into(),
                        trace_id: r.get(8)?,
                        actor: r.get(9)?,
                        usage: match r.get::<_, Option<String>>(10)? {
                            None => None,
                            Some(connection) => Some(InvocationUsage {
                                connection,
                                model: r.get::<_, Option<String>>(11)?.unwrap_or_default(),
                                input_tokens: r.get::<_, Option<i64>>(12)?.unwrap_or(0).max(0) as u64,
                                output_tokens: r.get::<_, Option<i64>>(13)?.unwrap_or(0).max(0) as u64,
                                iterations: r.get::<_, Option<i64>>(14)?.unwrap_or(0).clamp(0, i64::from(u32::MAX))
                                    as u32,
                            }),
                        },
                        client_name: r.get(15)?,
                        client_version: r.get(16)?,
                        conversation_id: r.get(17)?,
                        conversation_title: r.get(18)?,
                        profile: r.get(19)?,
                    })
                })?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        let (items, next) = page(items, limit, |i| i.id);
        Ok(Response::new(ListInvocationsReply { items, next_before_id: next }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, outcome: InvocationOutcome, actor: &str) -> Invocation {
        Invocation {
            at: "2026-11-30T10:00:00.000Z".into(),
            target: target.into(),
            method: InvocationMethod::ToolsCall.into(),
            server: "s".into(),
            session_id: "x".into(),
            duration_ms: 3,
            outcome: outcome.into(),
            actor: actor.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn rows_keep_their_actor_and_filter_on_it() {
        let dir = tempfile::tempdir().unwrap();
        let svc = InvocationsService::new(Db::open(&dir.path().join("coffer.db")).unwrap());
        let rows = vec![
            row("s__a", InvocationOutcome::Ok, ""),
            row("s__b", InvocationOutcome::Disabled, "agent"),
            row("s__c", InvocationOutcome::Ok, "channel:telegram"),
        ];
        let ids = svc
            .append_invocations(Request::new(AppendInvocationsRequest { invocations: rows }))
            .await
            .unwrap()
            .into_inner()
            .ids;
        let list = |q: ListInvocationsRequest| async {
            let items = svc.list_invocations(Request::new(q)).await.unwrap().into_inner().items;
            items.into_iter().map(|i| (i.target, i.actor)).collect::<Vec<_>>()
        };
        let all = list(ListInvocationsRequest { limit: 10, ..Default::default() }).await;
        let pairs = |v: &[(&str, &str)]| v.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect::<Vec<_>>();
        assert_eq!(all, pairs(&[("s__c", "channel:telegram"), ("s__b", "agent"), ("s__a", "mcp")]));
        let agent = list(ListInvocationsRequest { actor: "agent".into(), ..Default::default() }).await;
        assert_eq!(agent, pairs(&[("s__b", "agent")]));
        let ok =
            list(ListInvocationsRequest { outcome: InvocationOutcome::Ok.into(), limit: 10, ..Default::default() })
                .await;
        assert_eq!(ok.len(), 2);
        let items = svc
            .list_invocations(Request::new(ListInvocationsRequest { limit: 1, ..Default::default() }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (items.items[0].method(), items.items[0].outcome()),
            (InvocationMethod::ToolsCall, InvocationOutcome::Ok)
        );
        assert_eq!(items.next_before_id, items.items[0].id);
        // The reply names each row's id, in the request's order.
        let listed = svc
            .list_invocations(Request::new(ListInvocationsRequest { limit: 10, ..Default::default() }))
            .await
            .unwrap()
            .into_inner()
            .items;
        let by_target: Vec<i64> =
            ["s__a", "s__b", "s__c"].iter().map(|t| listed.iter().find(|i| i.target == *t).unwrap().id).collect();
        assert_eq!(ids, by_target);

        // A run's usage is kept on its row; other rows have none.
        let mut ask = row("coffer__ask", InvocationOutcome::Ok, "mcp");
        ask.usage = Some(InvocationUsage {
            connection: "local".into(),
            model: "m-1".into(),
            input_tokens: 1200,
            output_tokens: 80,
            iterations: 3,
        });
        svc.append_invocations(Request::new(AppendInvocationsRequest { invocations: vec![ask.clone()] }))
            .await
            .unwrap();
        let listed = svc
            .list_invocations(Request::new(ListInvocationsRequest { limit: 2, ..Default::default() }))
            .await
            .unwrap()
            .into_inner()
            .items;
        assert_eq!(listed[0].usage, ask.usage);
        assert_eq!(listed[1].usage, None);

        // The client's name and version are kept, and listed by name.
        let mut from_claude = row("s__f", InvocationOutcome::Ok, "mcp");
        (from_claude.client_name, from_claude.client_version) = ("claude-code".into(), "2.1.0".into());
        svc.append_invocations(Request::new(AppendInvocationsRequest { invocations: vec![from_claude] }))
            .await
            .unwrap();
        let by_client = svc
            .list_invocations(Request::new(ListInvocationsRequest {
                client_name: "claude-code".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner()
            .items;
        assert_eq!(
            by_client
                .iter()
                .map(|i| (i.target.as_str(), i.client_name.as_str(), i.client_version.as_str()))
                .collect::<Vec<_>>(),
            [("s__f", "claude-code", "2.1.0")]
        );

        // An agent turn's call keeps its conversation and is listed by it; the title of a
        // conversation the store does not hold (deleted) is empty.
        let from_agent = Invocation { conversation_id: "conv-1".into(), ..row("s__g", InvocationOutcome::Ok, "mcp") };
        svc.append_invocations(Request::new(AppendInvocationsRequest { invocations: vec![from_agent] })).await.unwrap();
        let by_conversation = svc
            .list_invocations(Request::new(ListInvocationsRequest {
                conversation_id: "conv-1".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner()
            .items;
        assert_eq!(
            by_conversation
                .iter()
                .map(|i| (i.target.as_str(), i.conversation_id.as_str(), i.conversation_title.as_str()))
                .collect::<Vec<_>>(),
            [("s__g", "conv-1", "")]
        );
        // A session's profile is kept and listed by.
        let profiled = Invocation { profile: "work".into(), ..row("s__p", InvocationOutcome::Ok, "mcp") };
        svc.append_invocations(Request::new(AppendInvocationsRequest { invocations: vec![profiled] })).await.unwrap();
        let by_profile = svc
            .list_invocations(Request::new(ListInvocationsRequest { profile: "work".into(), ..Default::default() }))
            .await
            .unwrap()
            .into_inner()
            .items;
        assert_eq!(
            by_profile.iter().map(|i| (i.target.as_str(), i.profile.as_str())).collect::<Vec<_>>(),
            [("s__p", "work")]
        );
        let rows_before = 7;

        // A row without a method or outcome refuses the batch.
        let bad = vec![row("s__d", InvocationOutcome::Ok, ""), row("s__e", InvocationOutcome::Unspecified, "")];
        let e = svc.append_invocations(Request::new(AppendInvocationsRequest { invocations: bad })).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::InvalidArgument, "outcome is required"));
        assert_eq!(list(ListInvocationsRequest { limit: 10, ..Default::default() }).await.len(), rows_before);
    }
}
