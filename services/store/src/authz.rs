//! Who may call which store RPC: one row per method, keyed by the full gRPC path
//! (`/<service>/<method>`), checked by the internal auth layer before the method runs.
//!
//! The rule of thumb: reads are open to every authenticated service; a write only to the
//! services that own its domain (the gateway owns all but the retrieval indexes, which
//! `coffer-retrieval` owns, and the conversations, which `coffer-chat` owns — and alone reads:
//! they are the owner's private talk with an agent); `ResolveCredentials`, which returns credential values, only to those
//! that use them (the gateway to start processes and send headers, retrieval for the embeddings
//! endpoint's API key; chat for LLM connections' keys, which it alone puts into provider requests and
//! agent CLIs' environments). A method with no row is refused, so a new RPC is closed until its row
//! is written; `every_store_method_has_exactly_one_rule` keeps the table and `proto/store_*.proto`
//! in step.
use coffer_proto::store::{
    audit_server, changes_server, channels_server, conversations_server, credentials_server, index_server,
    invocations_server, llm_connections_server, maintenance_server, profiles_server, registry_server, settings_server,
    vault_state_server,
};
use coffer_runtime::authz::{Allow, Policy, Rule, Unlisted};
use coffer_runtime::identity::Identity;

// Where each domain is served: one gRPC service per domain (`coffer.store.v1.<Domain>`).
const REGISTRY: &str = registry_server::SERVICE_NAME;
const CREDENTIALS: &str = credentials_server::SERVICE_NAME;
const SETTINGS: &str = settings_server::SERVICE_NAME;
const AUDIT: &str = audit_server::SERVICE_NAME;
const INVOCATIONS: &str = invocations_server::SERVICE_NAME;
const CHANGES: &str = changes_server::SERVICE_NAME;
const MAINTENANCE: &str = maintenance_server::SERVICE_NAME;
const INDEX: &str = index_server::SERVICE_NAME;
const CONVERSATIONS: &str = conversations_server::SERVICE_NAME;
const LLM: &str = llm_connections_server::SERVICE_NAME;
const CHANNELS: &str = channels_server::SERVICE_NAME;
const VAULT: &str = vault_state_server::SERVICE_NAME;
const PROFILES: &str = profiles_server::SERVICE_NAME;

/// Every authenticated service.
const ANY: Allow = Allow::AnyService;
/// The owner of every domain written today.
const GATEWAY: Allow = Allow::Only(&[Identity::Gateway]);
/// The owner of the retrieval indexes (`coffer-retrieval`).
const RETRIEVAL: Allow = Allow::Only(&[Identity::Retrieval]);
/// The owner and only reader of conversations (`coffer-chat`): the gateway asks it, never the
/// store.
const CHAT: Allow = Allow::Only(&[Identity::Chat]);
/// Those that write audit entries: the gateway (REST and CLI changes) and chat (each completed
/// turn, actor `agent`).
const AUDITORS: Allow = Allow::Only(&[Identity::Gateway, Identity::Chat]);
/// Those that use credential values: the gateway (server processes and headers), retrieval
/// (the embeddings endpoint's API key) and chat (LLM connections' keys, for provider requests
/// and bound agent CLIs).
const CREDENTIAL_USERS: Allow = Allow::Only(&[Identity::Gateway, Identity::Retrieval, Identity::Chat]);
/// Those that read LLM connections: the gateway (REST, status) and chat (it resolves them).
const LLM_READERS: Allow = Allow::Only(&[Identity::Gateway, Identity::Chat]);
/// Those that read channels: the gateway (REST, status) and chat (its adapter coordinator).
const CHANNEL_READERS: Allow = Allow::Only(&[Identity::Gateway, Identity::Chat]);

const fn rule(service: &'static str, method: &'static str, allow: Allow) -> Rule {
    Rule { service, method, allow }
}

/// The store's table; passed to the auth layer in [`crate::run`].
pub const POLICY: Policy = Policy {
    rules: &[
        // Registry and preferences: written by the gateway (REST and CLI).
        rule(REGISTRY, "ListServers", ANY),
        rule(REGISTRY, "GetServer", ANY),
        rule(REGISTRY, "CreateServer", GATEWAY),
        rule(REGISTRY, "UpdateServer", GATEWAY),
        rule(REGISTRY, "DeleteServer", GATEWAY),
        rule(REGISTRY, "ListPreferences", ANY),
        rule(REGISTRY, "SetPreference", GATEWAY),
        // Credentials: values leave the store only for whoever starts a process with them.
        rule(CREDENTIALS, "SetCredential", GATEWAY),
        rule(CREDENTIALS, "ListCredentials", ANY),
        rule(CREDENTIALS, "DeleteCredential", GATEWAY),
        rule(CREDENTIALS, "DeleteCredentialIfUnused", GATEWAY),
        rule(CREDENTIALS, "ResolveCredentials", CREDENTIAL_USERS),
        rule(SETTINGS, "GetSettings", ANY),
        rule(SETTINGS, "PatchSettings", GATEWAY),
        rule(AUDIT, "AppendAudit", AUDITORS),
        rule(AUDIT, "ListAudit", ANY),
        rule(INVOCATIONS, "AppendInvocations", GATEWAY),
        rule(INVOCATIONS, "ListInvocations", ANY),
        rule(CHANGES, "Head", ANY),
        rule(CHANGES, "WatchChanges", ANY),
        rule(MAINTENANCE, "PruneNow", GATEWAY),
        rule(MAINTENANCE, "Backup", GATEWAY),
        // Retrieval's derived indexes: written by coffer-retrieval only, read by anyone.
        rule(INDEX, "CreateKnowledgeBase", RETRIEVAL),
        rule(INDEX, "ListKnowledgeBases", ANY),
        rule(INDEX, "GetKnowledgeBase", ANY),
        rule(INDEX, "DeleteKnowledgeBase", RETRIEVAL),
        rule(INDEX, "ListDocuments", ANY),
        rule(INDEX, "UpsertDocument", RETRIEVAL),
        rule(INDEX, "MarkDocumentError", RETRIEVAL),
        rule(INDEX, "DeleteDocument", RETRIEVAL),
        rule(INDEX, "ClearIndex", RETRIEVAL),
        rule(INDEX, "KeywordQuery", ANY),
        rule(INDEX, "VectorQuery", ANY),
        rule(INDEX, "LocateLines", ANY),
        rule(INDEX, "GetChunks", ANY),
        rule(INDEX, "ConfigureVectors", RETRIEVAL),
        rule(INDEX, "PendingEmbeddings", ANY),
        rule(INDEX, "PutEmbeddings", RETRIEVAL),
        rule(INDEX, "Stats", ANY),
        rule(INDEX, "NoteLinks", ANY),
        rule(INDEX, "TaggedDocuments", ANY),
        rule(INDEX, "SetKnowledgeBaseWritable", RETRIEVAL),
        // Conversations: the chat service's state, read and written by coffer-chat alone (the
        // messages are the owner's private talk with an agent; the gateway goes through chat).
        rule(CONVERSATIONS, "CreateConversation", CHAT),
        rule(CONVERSATIONS, "ListConversations", CHAT),
        rule(CONVERSATIONS, "GetConversation", CHAT),
        rule(CONVERSATIONS, "UpdateConversation", CHAT),
        rule(CONVERSATIONS, "DeleteConversation", CHAT),
        rule(CONVERSATIONS, "AppendMessage", CHAT),
        rule(CONVERSATIONS, "StartTurn", CHAT),
        rule(CONVERSATIONS, "UpdateMessage", CHAT),
        rule(CONVERSATIONS, "ListMessages", CHAT),
        rule(CONVERSATIONS, "FailStreamingMessages", CHAT),
        rule(CONVERSATIONS, "SetPending", CHAT),
        rule(CONVERSATIONS, "GetPending", CHAT),
        rule(CONVERSATIONS, "ListPendingQueues", CHAT),
        rule(CONVERSATIONS, "ReserveEventSeq", CHAT),
        rule(CONVERSATIONS, "AllowTool", CHAT),
        rule(CONVERSATIONS, "ListAllowedTools", CHAT),
        rule(CONVERSATIONS, "ClearAllowedTools", CHAT),
        // LLM connections: written by the gateway (REST, CLI, console), read by chat, which
        // resolves them into provider endpoints.
        rule(LLM, "ListConnections", LLM_READERS),
        rule(LLM, "GetConnection", LLM_READERS),
        rule(LLM, "CreateConnection", GATEWAY),
        rule(LLM, "UpdateConnection", GATEWAY),
        rule(LLM, "DeleteConnection", GATEWAY),
        rule(LLM, "SetInternalDefault", GATEWAY),
        // Channels: configuration, pairing codes and unpairing are the gateway's (REST, CLI,
        // console); the adapters' state — the claimed owner, the cursor, the seen events — is
        // chat's, which never changes the configuration.
        rule(CHANNELS, "ListChannels", CHANNEL_READERS),
        rule(CHANNELS, "GetChannel", CHANNEL_READERS),
        rule(CHANNELS, "CreateChannel", GATEWAY),
        rule(CHANNELS, "UpdateChannel", GATEWAY),
        rule(CHANNELS, "DeleteChannel", GATEWAY),
        rule(CHANNELS, "StartPairing", GATEWAY),
        rule(CHANNELS, "Unpair", GATEWAY),
        rule(CHANNELS, "ClaimPairing", CHAT),
        rule(CHANNELS, "SetCursor", CHAT),
        rule(CHANNELS, "RecordEvent", CHAT),
        // Profiles: written by the gateway (REST, CLI, console), read by anyone (the gateway's
        // snapshot; the sync engine exports them with the vault).
        rule(PROFILES, "ListProfiles", ANY),
        rule(PROFILES, "GetProfile", ANY),
        rule(PROFILES, "PutProfile", GATEWAY),
        rule(PROFILES, "DeleteProfile", GATEWAY),
        // The vault state as text: the sync engine (coffer-retrieval) alone exports and applies
        // it (`coffer sync`, proto/store_vault.proto); credential values never enter it.
        rule(VAULT, "ExportVault", RETRIEVAL),
        rule(VAULT, "ApplyVault", RETRIEVAL),
    ],
    unlisted: Unlisted::Deny,
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// `(package.Service, Method)` of every rpc in a `.proto` text: enough of the grammar for
    /// Coffer's files (`package x;`, `service S {`, `rpc M(`).
    fn rpcs(proto: &str) -> BTreeSet<(String, String)> {
        let (mut package, mut service, mut out) = (String::new(), String::new(), BTreeSet::new());
        for line in proto.lines().map(str::trim) {
            if let Some(p) = line.strip_prefix("package ") {
                package = p.trim_end_matches(';').trim().to_owned();
            } else if let Some(s) = line.strip_prefix("service ") {
                service = s.trim_end_matches('{').trim().to_owned();
            } else if let Some(r) = line.strip_prefix("rpc ") {
                let method = r.split('(').next().unwrap_or_default().trim().to_owned();
                out.insert((format!("{package}.{service}"), method));
            }
        }
        out
    }

    #[test]
    fn every_store_method_has_exactly_one_rule() {
        let declared: BTreeSet<(String, String)> = [
            include_str!("../../../proto/store_registry.proto"),
            include_str!("../../../proto/store_credentials.proto"),
            include_str!("../../../proto/store_settings.proto"),
            include_str!("../../../proto/store_audit.proto"),
            include_str!("../../../proto/store_invocations.proto"),
            include_str!("../../../proto/store_changes.proto"),
            include_str!("../../../proto/store_maintenance.proto"),
            include_str!("../../../proto/store_common.proto"),
            include_str!("../../../proto/store_index.proto"),
            include_str!("../../../proto/store_conversations.proto"),
            include_str!("../../../proto/store_llm.proto"),
            include_str!("../../../proto/store_channels.proto"),
            include_str!("../../../proto/store_vault.proto"),
            include_str!("../../../proto/store_profiles.proto"),
        ]
        .into_iter()
        .flat_map(rpcs)
        .collect();
        assert!(declared.len() >= 67, "parsed {declared:?}");
        let ruled: Vec<(String, String)> =
            POLICY.rules.iter().map(|r| (r.service.to_owned(), r.method.to_owned())).collect();
        let unique: BTreeSet<_> = ruled.iter().cloned().collect();
        assert_eq!(unique.len(), ruled.len(), "a method has two rules");
        let missing: Vec<_> = declared.difference(&unique).collect();
        let stale: Vec<_> = unique.difference(&declared).collect();
        assert!(missing.is_empty(), "store RPCs without a rule (they are refused): {missing:?}");
        assert!(stale.is_empty(), "rules for RPCs no store_*.proto declares: {stale:?}");
    }

    #[test]
    fn credentials_resolve_only_for_their_users_and_reads_are_open() {
        let path = |m: &str| format!("/{CREDENTIALS}/{m}");
        for user in [Identity::Gateway, Identity::Retrieval, Identity::Chat] {
            assert_eq!(POLICY.check(user, &path("ResolveCredentials")), Ok(()), "{user}");
        }
        for caller in [Identity::Supervisor, Identity::Store] {
            let e = POLICY.check(caller, &path("ResolveCredentials")).unwrap_err();
            assert_eq!(e.to_string(), format!("{caller} may not call /{CREDENTIALS}/ResolveCredentials"));
            assert_eq!(POLICY.check(caller, &path("ListCredentials")), Ok(()));
            assert!(POLICY.check(caller, &format!("/{REGISTRY}/CreateServer")).is_err());
        }
    }

    #[test]
    fn index_writes_are_retrievals_and_reads_are_open() {
        let path = |m: &str| format!("/{INDEX}/{m}");
        let writes = [
            "CreateKnowledgeBase",
            "DeleteKnowledgeBase",
            "UpsertDocument",
            "MarkDocumentError",
            "DeleteDocument",
            "ClearIndex",
            "ConfigureVectors",
            "PutEmbeddings",
            "SetKnowledgeBaseWritable",
        ];
        let reads = [
            "ListKnowledgeBases",
            "GetKnowledgeBase",
            "ListDocuments",
            "KeywordQuery",
            "VectorQuery",
            "LocateLines",
            "GetChunks",
            "PendingEmbeddings",
            "Stats",
            "NoteLinks",
            "TaggedDocuments",
        ];
        for m in writes {
            assert_eq!(POLICY.check(Identity::Retrieval, &path(m)), Ok(()), "{m}");
            for caller in [Identity::Gateway, Identity::Chat, Identity::Supervisor, Identity::Store] {
                let e = POLICY.check(caller, &path(m)).unwrap_err();
                assert_eq!(e.to_string(), format!("{caller} may not call /{INDEX}/{m}"));
            }
        }
        for m in reads {
            for caller in [Identity::Retrieval, Identity::Gateway, Identity::Chat, Identity::Supervisor] {
                assert_eq!(POLICY.check(caller, &path(m)), Ok(()), "{caller} {m}");
            }
        }
    }

    #[test]
    fn llm_connections_are_the_gateways_to_write_and_chat_reads_them() {
        let path = |m: &str| format!("/{LLM}/{m}");
        for m in ["CreateConnection", "UpdateConnection", "DeleteConnection", "SetInternalDefault"] {
            assert_eq!(POLICY.check(Identity::Gateway, &path(m)), Ok(()), "{m}");
            for caller in [Identity::Chat, Identity::Retrieval, Identity::Supervisor, Identity::Store] {
                let e = POLICY.check(caller, &path(m)).unwrap_err();
                assert_eq!(e.to_string(), format!("{caller} may not call /{LLM}/{m}"));
            }
        }
        for m in ["ListConnections", "GetConnection"] {
            for caller in [Identity::Gateway, Identity::Chat] {
                assert_eq!(POLICY.check(caller, &path(m)), Ok(()), "{caller} {m}");
            }
            assert!(POLICY.check(Identity::Retrieval, &path(m)).is_err(), "retrieval has no use for them");
        }
    }

    #[test]
    fn channels_configuration_is_the_gateways_and_adapter_state_is_chats() {
        let methods: Vec<String> =
            rpcs(include_str!("../../../proto/store_channels.proto")).into_iter().map(|(_, m)| m).collect();
        assert_eq!(methods.len(), 10, "{methods:?}");
        let chat_only = ["ClaimPairing", "SetCursor", "RecordEvent"];
        let reads = ["ListChannels", "GetChannel"];
        for m in &methods {
            let path = format!("/{CHANNELS}/{m}");
            let gateway = !chat_only.contains(&m.as_str());
            let chat = chat_only.contains(&m.as_str()) || reads.contains(&m.as_str());
            for (caller, allowed) in [(Identity::Gateway, gateway), (Identity::Chat, chat)] {
                match POLICY.check(caller, &path) {
                    Ok(()) => assert!(allowed, "{caller} may not call {path}"),
                    Err(e) => {
                        assert!(!allowed, "{caller} should call {path}");
                        assert_eq!(e.to_string(), format!("{caller} may not call {path}"));
                    }
                }
            }
            for caller in [Identity::Retrieval, Identity::Supervisor, Identity::Store, Identity::Callback] {
                assert!(POLICY.check(caller, &path).is_err(), "{caller} {path}");
            }
        }
    }

    /// Every `Conversations` method, from the proto.
    fn conversation_methods() -> Vec<String> {
        rpcs(include_str!("../../../proto/store_conversations.proto")).into_iter().map(|(_, m)| m).collect()
    }

    #[test]
    fn conversations_are_chats_alone() {
        let methods = conversation_methods();
        assert_eq!(methods.len(), 17, "{methods:?}");
        for m in &methods {
            let path = format!("/{CONVERSATIONS}/{m}");
            assert_eq!(POLICY.check(Identity::Chat, &path), Ok(()), "{m}");
            for caller in [Identity::Gateway, Identity::Retrieval, Identity::Supervisor, Identity::Store] {
                let e = POLICY.check(caller, &path).unwrap_err();
                assert_eq!(e.to_string(), format!("{caller} may not call {path}"));
            }
        }
    }

    /// The real store (`crate::run`) on loopback, accepting made-up gateway, retrieval and chat
    /// tokens; the tests call it as each of them and as strangers.
    struct Served {
        addr: String,
        gateway: secrecy::SecretString,
        retrieval: secrecy::SecretString,
        chat: secrecy::SecretString,
        shutdown: tokio_util::sync::CancellationToken,
        task: tokio::task::JoinHandle<anyhow::Result<()>>,
        _home: tempfile::TempDir,
    }

    async fn serve() -> Served {
        use coffer_runtime::identity::PeerDigests;
        let home = tempfile::tempdir().unwrap();
        let (gateway, retrieval) = (coffer_runtime::token::random_token(), coffer_runtime::token::random_token());
        let chat = coffer_runtime::token::random_token();
        let store_token = coffer_runtime::token::random_token();
        let peers = PeerDigests::from_tokens([
            (Identity::Gateway, &gateway),
            (Identity::Retrieval, &retrieval),
            (Identity::Chat, &chat),
        ]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let ctx = coffer_runtime::service::ServiceCtx {
            home: coffer_runtime::home::CofferHome::at(home.path().to_path_buf()),
            identity: Identity::Store,
            listener,
            internal: coffer_runtime::service::Internal::new(store_token, peers, Default::default()),
            shutdown: shutdown.clone(),
        };
        let task = tokio::spawn(crate::run(ctx));
        Served { addr, gateway, retrieval, chat, shutdown, task, _home: home }
    }

    use coffer_proto::store::{
        changes_client::ChangesClient, credentials_client::CredentialsClient, index_client::IndexClient,
        registry_client::RegistryClient, settings_client::SettingsClient,
    };

    fn channel(addr: &str, token: &secrecy::SecretString) -> coffer_runtime::grpc::AuthChannel {
        coffer_runtime::grpc::channel(addr, token).unwrap()
    }

    fn client(addr: &str, token: &secrecy::SecretString) -> CredentialsClient<coffer_runtime::grpc::AuthChannel> {
        CredentialsClient::new(channel(addr, token))
    }

    fn resolve() -> coffer_proto::store::ResolveCredentialsRequest {
        coffer_proto::store::ResolveCredentialsRequest { names: vec![] }
    }

    #[tokio::test]
    async fn the_store_refuses_a_wrong_or_missing_token_and_callers_outside_a_rule() {
        let s = serve().await;
        // Missing: a channel without the interceptor.
        let bare = tonic::transport::Endpoint::from_shared(format!("http://{}", s.addr)).unwrap().connect_lazy();
        let mut stranger = CredentialsClient::new(bare);
        let e = stranger.resolve_credentials(resolve()).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "missing or wrong internal token"));
        let e =
            client(&s.addr, &coffer_runtime::token::random_token()).resolve_credentials(resolve()).await.unwrap_err();
        assert_eq!((e.code(), e.message()), (tonic::Code::Unauthenticated, "missing or wrong internal token"));

        // Retrieval is a known service: it may read and resolve credentials (the embeddings
        // endpoint's key), but not write the gateway's domains.
        let mut retrieval = client(&s.addr, &s.retrieval);
        let values = retrieval.resolve_credentials(resolve()).await.unwrap().into_inner().values;
        assert!(values.is_empty());
        let e = SettingsClient::new(channel(&s.addr, &s.retrieval))
            .patch_settings(coffer_proto::store::PatchSettingsRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.message(), format!("retrieval may not call /{SETTINGS}/PatchSettings"));
        RegistryClient::new(channel(&s.addr, &s.retrieval))
            .list_servers(coffer_proto::store::ListServersRequest::default())
            .await
            .expect("reads are open");
        ChangesClient::new(channel(&s.addr, &s.retrieval))
            .head(coffer_proto::store::HeadRequest::default())
            .await
            .expect("reads are open");

        // The gateway owns credentials: its call reaches the method.
        let values = client(&s.addr, &s.gateway).resolve_credentials(resolve()).await.unwrap().into_inner().values;
        assert!(values.is_empty(), "nothing asked, nothing resolved");

        // The retrieval indexes: retrieval writes, the gateway may only read.
        let kb = coffer_proto::store::KnowledgeBase {
            name: "notes".into(),
            kind: coffer_proto::store::KnowledgeBaseKind::Folder.into(),
            root: "/tmp/notes".into(),
            ..Default::default()
        };
        IndexClient::new(channel(&s.addr, &s.retrieval)).create_knowledge_base(kb).await.unwrap();
        let upsert = coffer_proto::store::UpsertDocumentRequest {
            kb: "notes".into(),
            path: "a.md".into(),
            ..Default::default()
        };
        let e = IndexClient::new(channel(&s.addr, &s.gateway)).upsert_document(upsert.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert_eq!(e.message(), format!("gateway may not call /{INDEX}/UpsertDocument"));
        IndexClient::new(channel(&s.addr, &s.retrieval)).upsert_document(upsert).await.unwrap();
        let kbs = IndexClient::new(channel(&s.addr, &s.gateway))
            .list_knowledge_bases(coffer_proto::store::ListKnowledgeBasesRequest {})
            .await
            .unwrap()
            .into_inner()
            .knowledge_bases;
        assert_eq!(kbs.len(), 1);
        s.shutdown.cancel();
        s.task.await.unwrap().unwrap();
    }

    /// Over the real listener: chat stores and reads back a 1 MiB message (the store's decoding
    /// limit admits it; the client raises tonic's 4 MiB default for the reply), the gateway is
    /// refused every Conversations call.
    #[tokio::test]
    async fn chat_stores_a_one_mebibyte_message_and_the_gateway_is_refused() {
        use coffer_proto::store::conversations_client::ConversationsClient;
        use coffer_proto::store::*;
        let s = serve().await;
        let max = crate::domain::MAX_DECODING_MESSAGE_SIZE;
        let mut chat = ConversationsClient::new(channel(&s.addr, &s.chat)).max_decoding_message_size(max);
        let id = |n: u128| ulid::Ulid((1_700_000_000_000u128 << 80) | n).to_string();
        let conversation = ConversationRecord {
            id: id(1),
            agent_key: "codex".into(),
            agent_config_json: "{}".into(),
            ..Default::default()
        };
        let create = CreateConversationRequest { conversation: Some(conversation) };
        chat.create_conversation(create.clone()).await.unwrap();
        let text = "x".repeat(1024 * 1024);
        let message = MessageRecord {
            id: id(2),
            conversation_id: id(1),
            role: MessageRole::User.into(),
            status: MessageStatus::Complete.into(),
            blocks: vec![ContentBlockRecord { block: Some(content_block_record::Block::Text(text.clone())) }],
            ..Default::default()
        };
        chat.append_message(message.clone()).await.unwrap();
        let page = chat
            .list_messages(ListMessagesRequest { conversation_id: id(1), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.messages.len(), 1);
        assert_eq!(page.messages[0].blocks, message.blocks);

        let mut gateway = ConversationsClient::new(channel(&s.addr, &s.gateway));
        let e = gateway.create_conversation(create).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert_eq!(e.message(), format!("gateway may not call /{CONVERSATIONS}/CreateConversation"));
        let e = gateway.get_conversation(ConversationRef { id: id(1) }).await.unwrap_err();
        assert_eq!(e.message(), format!("gateway may not call /{CONVERSATIONS}/GetConversation"));
        let e = ConversationsClient::new(channel(&s.addr, &s.retrieval))
            .list_conversations(ListConversationsRequest::default())
            .await
            .unwrap_err();
        assert_eq!(e.message(), format!("retrieval may not call /{CONVERSATIONS}/ListConversations"));
        s.shutdown.cancel();
        s.task.await.unwrap().unwrap();
    }
}
