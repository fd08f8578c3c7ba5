//! The knowledge, memory and skill built-ins against a fake `coffer-retrieval` on loopback.
use super::*;

/// A fake `coffer-retrieval` on loopback (real gRPC): canned answers, and every `Remember` and
/// `Search` request it received.
#[derive(Default)]
struct FakeRetrieval {
    remembered: Mutex<Vec<coffer_proto::retrieval::RememberRequest>>,
    searched: Mutex<Vec<coffer_proto::retrieval::SearchRequest>>,
}

type Rpc<T> = Result<tonic::Response<T>, tonic::Status>;

#[tonic::async_trait]
impl coffer_proto::retrieval::retrieval_server::Retrieval for FakeRetrieval {
    async fn add_knowledge_base(
        &self,
        _: tonic::Request<coffer_proto::retrieval::AddKnowledgeBaseRequest>,
    ) -> Rpc<coffer_proto::retrieval::KnowledgeBaseInfo> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn list_knowledge_bases(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ListKnowledgeBasesRequest>,
    ) -> Rpc<coffer_proto::retrieval::ListKnowledgeBasesReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn get_knowledge_base(
        &self,
        _: tonic::Request<coffer_proto::retrieval::KnowledgeBaseName>,
    ) -> Rpc<coffer_proto::retrieval::KnowledgeBaseInfo> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn remove_knowledge_base(
        &self,
        _: tonic::Request<coffer_proto::retrieval::KnowledgeBaseName>,
    ) -> Rpc<coffer_proto::retrieval::RemoveReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn reindex(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ReindexRequest>,
    ) -> Rpc<coffer_proto::retrieval::ReindexReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn status(
        &self,
        _: tonic::Request<coffer_proto::retrieval::StatusRequest>,
    ) -> Rpc<coffer_proto::retrieval::StatusReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn embed(
        &self,
        _: tonic::Request<coffer_proto::retrieval::EmbedRequest>,
    ) -> Rpc<coffer_proto::retrieval::EmbedReply> {
        Err(tonic::Status::failed_precondition("no embeddings endpoint: retrieval.embeddings.url is not set"))
    }
    async fn search(
        &self,
        r: tonic::Request<coffer_proto::retrieval::SearchRequest>,
    ) -> Rpc<coffer_proto::retrieval::SearchReply> {
        use coffer_proto::retrieval::{EngineReport, EngineState, SearchReply, SearchResult};
        let r = r.into_inner();
        if r.query.trim().is_empty() {
            return Err(tonic::Status::invalid_argument("query is empty: give 1-8192 bytes of text"));
        }
        self.searched.lock().unwrap().push(r);
        let results = (1..=40)
            .map(|i| SearchResult {
                kb: "notes".into(),
                path: format!("n{i}.md"),
                heading_path: vec!["Top".into()],
                line_start: i,
                line_end: i + 1,
                snippet: format!("**word** {}", "y".repeat(3000)),
                ..Default::default()
            })
            .collect();
        let engines = vec![
            EngineReport { engine: "keyword".into(), state: EngineState::Ok as i32, hits: 40, ..Default::default() },
            EngineReport {
                engine: "vector".into(),
                state: EngineState::Failed as i32,
                message: "embeddings endpoint refused the connection".into(),
                ..Default::default()
            },
        ];
        Ok(tonic::Response::new(SearchReply {
            results,
            engines,
            warnings: vec![],
            took_ms: 1,
            fusion: "rrf k=60".into(),
            next_cursor: String::new(),
        }))
    }
    async fn remember(
        &self,
        r: tonic::Request<coffer_proto::retrieval::RememberRequest>,
    ) -> Rpc<coffer_proto::retrieval::RememberReply> {
        let r = r.into_inner();
        let n = {
            let mut seen = self.remembered.lock().unwrap();
            seen.push(r.clone());
            seen.len()
        };
        let fact = coffer_proto::retrieval::Fact {
            id: format!("01FACT{n}"),
            text: r.text,
            tags: r.tags,
            source: r.source,
            created_ms: 1,
            path: format!("/home/memory/01FACT{n}.md"),
            warning: String::new(),
        };
        Ok(tonic::Response::new(coffer_proto::retrieval::RememberReply {
            fact: Some(fact),
            created: n == 1,
            similarity: 1.0,
        }))
    }
    async fn recall(
        &self,
        _: tonic::Request<coffer_proto::retrieval::RecallRequest>,
    ) -> Rpc<coffer_proto::retrieval::SearchReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn list_facts(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ListFactsRequest>,
    ) -> Rpc<coffer_proto::retrieval::ListFactsReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn get_fact(&self, _: tonic::Request<coffer_proto::retrieval::FactId>) -> Rpc<coffer_proto::retrieval::Fact> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn forget(
        &self,
        r: tonic::Request<coffer_proto::retrieval::FactId>,
    ) -> Rpc<coffer_proto::retrieval::RemoveReply> {
        Err(tonic::Status::not_found(format!("no fact {:?}", r.into_inner().id)))
    }
    async fn list_skills(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ListSkillsRequest>,
    ) -> Rpc<coffer_proto::retrieval::ListSkillsReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn load_skill(
        &self,
        _: tonic::Request<coffer_proto::retrieval::SkillName>,
    ) -> Rpc<coffer_proto::retrieval::Skill> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn read_note(
        &self,
        _: tonic::Request<coffer_proto::retrieval::ReadNoteRequest>,
    ) -> Rpc<coffer_proto::retrieval::Note> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn write_note(
        &self,
        _: tonic::Request<coffer_proto::retrieval::WriteNoteRequest>,
    ) -> Rpc<coffer_proto::retrieval::WriteNoteReply> {
        Err(tonic::Status::unimplemented("fake"))
    }
    async fn set_writable(
        &self,
        _: tonic::Request<coffer_proto::retrieval::SetWritableRequest>,
    ) -> Rpc<coffer_proto::retrieval::KnowledgeBaseInfo> {
        Err(tonic::Status::unimplemented("fake"))
    }
}

/// Serves `fake` on a loopback port; returns a client of it.
async fn serve_retrieval(fake: Arc<FakeRetrieval>) -> crate::clients::retrieval::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(coffer_proto::retrieval::retrieval_server::RetrievalServer::from_arc(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    crate::clients::retrieval::client(&addr.to_string(), &SecretString::from("00".to_owned())).unwrap()
}

#[tokio::test]
async fn retrieval_tools_set_the_source_bound_results_and_obey_policy_and_the_log() {
    let fake = Arc::new(FakeRetrieval::default());
    let client = serve_retrieval(fake.clone()).await;
    let mut h = Harness::with(snapshot(vec![], &[]), Registry::standard(Some(client)), FixedCredentials::default());
    let s = h.session();
    let listed = s.list(ListKind::Tools).await;
    let listed = names(&listed);
    for tool in ["search_knowledge", "recall", "remember", "forget", "list_skills", "load_skill"] {
        assert!(listed.contains(&format!("coffer__{tool}").as_str()), "{listed:?}");
    }

    // remember: the source is the session's client (clientInfo.name "test"); a duplicate says so.
    let out =
        result(call(&s, "coffer__remember", json!({"text": "The user deploys on Fridays", "tags": ["deploy"]})).await);
    assert_eq!(out["content"][0]["text"], "Remembered as fact 01FACT1.");
    assert_eq!(out["structuredContent"]["fact"]["id"], "01FACT1");
    assert_eq!(out["structuredContent"]["created"], true);
    let dup = result(call(&s, "coffer__remember", json!({"text": "The user deploys on Fridays"})).await);
    let text = dup["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("Not saved again: fact 01FACT2 already says this (similarity 1.00)"), "{text}");
    {
        let seen = fake.remembered.lock().unwrap();
        assert_eq!(seen[0].source, "mcp:test");
        assert_eq!((seen[0].tags.clone(), seen[1].tags.len()), (vec!["deploy".to_owned()], 0));
    }
    let r = h.record();
    assert_eq!((r.target.as_str(), r.server.as_str(), r.outcome.as_str()), ("coffer__remember", BUILTIN_SERVER, "ok"));
    let _ = h.record();

    // search: bounded to 8 results of at most 240-character snippets; the failed engine is named.
    let out = result(call(&s, "coffer__search_knowledge", json!({"query": "word", "kb": "notes"})).await);
    assert_eq!(out["structuredContent"]["results"].as_array().unwrap().len(), 8);
    assert!(out["structuredContent"]["results"][0]["snippet"].as_str().unwrap().chars().count() <= 242);
    let text = out["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("notes:n1.md:1-2  > Top\n**word** yyy"), "{text}");
    assert!(text.contains("warning: the vector engine failed: embeddings endpoint refused the connection"), "{text}");
    let asked = fake.searched.lock().unwrap()[0].clone();
    assert_eq!((asked.limit, asked.snippet_chars, asked.filters.unwrap().kb), (8, 240, vec!["notes".to_owned()]));
    let big = result(
        call(&s, "coffer__search_knowledge", json!({"query": "word", "limit": 20, "snippet_chars": 1000})).await,
    );
    assert_eq!(big["structuredContent"]["results"].as_array().unwrap().len(), 20);
    assert_eq!(fake.searched.lock().unwrap()[1].snippet_chars, 1000);
    let _ = (h.record(), h.record());
    // Over the schema's maximum: refused by name, not lowered.
    for (args, says) in [
        (json!({"query": "word", "limit": 21}), "argument \"limit\" is 21, over its maximum of 20"),
        (
            json!({"query": "word", "snippet_chars": 9999}),
            "argument \"snippet_chars\" is 9999, over its maximum of 1000",
        ),
    ] {
        let r = result(call(&s, "coffer__search_knowledge", args).await);
        assert_eq!(r["isError"], true, "{r}");
        assert!(r["content"][0]["text"].as_str().unwrap().contains(says), "{r}");
        let _ = h.record();
    }

    // The service's refusals are tool errors with its message; the log records them. (An
    // empty query without tags is refused before the service: tags alone list notes.)
    let bad = result(call(&s, "coffer__search_knowledge", json!({"query": "  "})).await);
    assert_eq!(bad["isError"], true);
    assert_eq!(
        bad["content"][0]["text"],
        "coffer__search_knowledge: invalid arguments: give a query, or tags to list the notes with them"
    );
    let _ = h.record();
    let gone = result(call(&s, "coffer__forget", json!({"id": "01NOPE"})).await);
    assert_eq!((&gone["isError"], &gone["content"][0]["text"]), (&json!(true), &json!("no fact \"01NOPE\"")));
    let _ = h.record();

    // Disabled like any tool: refused before the service is asked, and recorded as disabled.
    h.policy.send_replace(Arc::new(snapshot(vec![], &[(BUILTIN_SERVER, Kind::Tool, "remember", false)])));
    let e = error(call(&s, "coffer__remember", json!({"text": "refused"})).await);
    assert_eq!((e.code, e.message.as_str()), (TOOL_DISABLED, "Tool coffer__remember is disabled"));
    assert_eq!(h.record().outcome.as_str(), "disabled");
    assert_eq!(fake.remembered.lock().unwrap().len(), 2, "the service never saw the refused call");
    assert!(!names(&s.list(ListKind::Tools).await).contains(&"coffer__remember"));
    s.close().await;
}
