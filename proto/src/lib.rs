//! Generated types and tonic clients/servers for Coffer's internal gRPC contracts.
//!
//! Every internal contract lives in `proto/*.proto`; this is the only place code is generated.
#![allow(clippy::all, missing_docs)]

/// `coffer.control.v1`: the supervisor's control RPC (status, stop, restart a service).
pub mod control {
    tonic::include_proto!("coffer.control.v1");

    // `env` may carry secrets (coffer-callback's signing secrets): names only.
    impl std::fmt::Debug for StartServiceRequest {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let mut names: Vec<&String> = self.env.keys().collect();
            names.sort();
            f.debug_struct("StartServiceRequest").field("name", &self.name).field("env", &names).finish()
        }
    }
}

/// `coffer.chat.v1`: conversations, turns and their events, served by `coffer-chat`
/// ([`chat_client::ChatClient`], [`chat_server::Chat`]); the status mapping is documented in
/// `proto/chat.proto`.
pub mod chat {
    tonic::include_proto!("coffer.chat.v1");
}

/// `coffer.channel.v1`: coffer-chat's channel adapters — SeaTalk events forwarded by
/// `coffer-callback`, and the adapters' live state for the gateway
/// ([`channel_adapters_client::ChannelAdaptersClient`], [`channel_adapters_server::ChannelAdapters`]);
/// the status mapping is documented in `proto/channel.proto`.
pub mod channel {
    tonic::include_proto!("coffer.channel.v1");
}

/// `coffer.gateway.v1`: the gateway's tool broker for Coffer's own services
/// ([`tool_broker_client::ToolBrokerClient`], [`tool_broker_server::ToolBroker`]); the status
/// mapping of its errors is documented in `proto/broker.proto`.
pub mod gateway {
    tonic::include_proto!("coffer.gateway.v1");
}

/// `coffer.llm.v1`: probing LLM connections and the internal agent behind `coffer__ask`, served
/// by `coffer-chat` next to Chat ([`llm_client::LlmClient`], [`llm_server::Llm`]); the status
/// mapping is documented in `proto/llm.proto`.
pub mod llm {
    tonic::include_proto!("coffer.llm.v1");
}

/// `coffer.retrieval.v1`: knowledge bases, memory and skills, served by `coffer-retrieval`
/// ([`retrieval_client::RetrievalClient`], [`retrieval_server::Retrieval`]); the status mapping
/// is documented in `proto/retrieval.proto`.
pub mod retrieval {
    tonic::include_proto!("coffer.retrieval.v1");
}

/// `coffer.sync.v1`: sync across machines on git, served by `coffer-retrieval` to the gateway
/// ([`sync_client::SyncClient`], [`sync_server::Sync`]); the status mapping is documented in
/// `proto/sync.proto`.
pub mod sync {
    tonic::include_proto!("coffer.sync.v1");
}

/// `coffer.store.v1`: typed access to `coffer.db` through the store, one gRPC service per
/// domain, all served by `coffer-store`: [`registry_client::RegistryClient`],
/// [`credentials_client::CredentialsClient`], [`settings_client::SettingsClient`],
/// [`audit_client::AuditClient`], [`invocations_client::InvocationsClient`],
/// [`changes_client::ChangesClient`], [`maintenance_client::MaintenanceClient`], [`index_client::IndexClient`],
/// [`conversations_client::ConversationsClient`], [`llm_connections_client::LlmConnectionsClient`],
/// [`channels_client::ChannelsClient`], [`profiles_client::ProfilesClient`] (and their
/// `*_server` counterparts).
///
/// Enums travel as proto enums; REST bodies and the database spell them as lowercase words
/// ("stdio", "upstream_error", …). Each enum's `as_str` and `parse` below are that spelling,
/// in one place, for the store's SQL and the edge's JSON alike (`parse` never yields
/// `Unspecified`; its `as_str` is `""`).
pub mod store {
    tonic::include_proto!("coffer.store.v1");

    /// Largest request the store's Index service decodes (bytes): one `UpsertDocument` carries
    /// a whole document's chunks with their text and normalized index text, about twice the
    /// file. A caller checks a request's encoded length against it before sending.
    pub const INDEX_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

    /// `as_str`/`parse` between an enum and its REST/database word.
    macro_rules! words {
        ($ty:ident { $($variant:ident => $word:literal),+ $(,)? }) => {
            impl $ty {
                /// The REST/database word (`""` for `Unspecified`).
                pub const fn as_str(self) -> &'static str {
                    match self {
                        $ty::Unspecified => "",
                        $($ty::$variant => $word,)+
                    }
                }
                /// The value a REST/database word names; `None` for any other string.
                pub fn parse(word: &str) -> Option<Self> {
                    match word {
                        $($word => Some($ty::$variant),)+
                        _ => None,
                    }
                }
                /// Every value but `Unspecified`, in declaration order.
                pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            }
        };
    }

    words!(Transport { Stdio => "stdio", Http => "http", Sse => "sse" });
    words!(CapabilityKind { Tool => "tool", Prompt => "prompt", Resource => "resource" });
    words!(AuditOutcome { Ok => "ok", Error => "error" });
    words!(InvocationMethod {
        ToolsCall => "tools/call",
        ResourcesRead => "resources/read",
        PromptsGet => "prompts/get",
    });
    words!(InvocationOutcome {
        Ok => "ok",
        UpstreamError => "upstream_error",
        Disabled => "disabled",
        Timeout => "timeout",
        Unreachable => "unreachable",
        Invalid => "invalid",
        Cancelled => "cancelled",
    });
    words!(ChangeEntity {
        Server => "server",
        Preference => "preference",
        Setting => "settings",
        Credential => "credential",
        LlmConnection => "llm_connection",
        Channel => "channel",
        Profile => "profile",
    });
    words!(ChannelKind { Telegram => "telegram", Seatalk => "seatalk" });
    words!(ChangeOp { Create => "create", Update => "update", Delete => "delete", Set => "set" });
    words!(KnowledgeBaseKind { Folder => "folder", Memory => "memory" });
    words!(LlmWire {
        Anthropic => "anthropic",
        OpenaiResponses => "openai-responses",
        OpenaiChat => "openai-chat",
        Ollama => "ollama",
    });
    words!(MatchMode { All => "all", Any => "any" });
    words!(MessageRole { User => "user", Assistant => "assistant" });
    words!(MessageStatus {
        Complete => "complete",
        Streaming => "streaming",
        Interrupted => "interrupted",
        Failed => "failed",
    });

    // Hand-written Debug for the messages that carry credential values (their generated one is
    // skipped in build.rs): names only, never a value.
    impl std::fmt::Debug for SetCredentialRequest {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SetCredentialRequest")
                .field("name", &self.name)
                .field("value", &"[REDACTED]")
                .field("actor", &self.actor)
                .field("create_only", &self.create_only)
                .finish()
        }
    }

    impl std::fmt::Debug for ResolveCredentialsReply {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            let mut names: Vec<&String> = self.values.keys().collect();
            names.sort();
            f.debug_struct("ResolveCredentialsReply").field("names", &names).finish_non_exhaustive()
        }
    }
}

/// Metadata key carrying how the request that caused an internal call was authenticated.
pub use coffer_types::header::AUTH as AUTH_HEADER;
/// Metadata key carrying the per-run internal token on every internal gRPC call.
pub use coffer_types::header::INTERNAL_TOKEN as INTERNAL_TOKEN_HEADER;
/// Metadata key carrying the trace id of the request that caused an internal call.
pub use coffer_types::header::TRACE as TRACE_HEADER;

#[cfg(test)]
mod tests {
    use super::store::*;

    #[test]
    fn enum_words_round_trip_and_unspecified_has_none() {
        fn check<T: Copy + PartialEq + std::fmt::Debug>(
            all: &[T],
            as_str: fn(T) -> &'static str,
            parse: fn(&str) -> Option<T>,
        ) {
            for &v in all {
                assert!(!as_str(v).is_empty(), "{v:?}");
                assert_eq!(parse(as_str(v)), Some(v));
            }
            assert_eq!(parse(""), None);
        }
        check(Transport::ALL, Transport::as_str, Transport::parse);
        check(CapabilityKind::ALL, CapabilityKind::as_str, CapabilityKind::parse);
        check(AuditOutcome::ALL, AuditOutcome::as_str, AuditOutcome::parse);
        check(InvocationMethod::ALL, InvocationMethod::as_str, InvocationMethod::parse);
        check(InvocationOutcome::ALL, InvocationOutcome::as_str, InvocationOutcome::parse);
        check(ChangeEntity::ALL, ChangeEntity::as_str, ChangeEntity::parse);
        check(ChangeOp::ALL, ChangeOp::as_str, ChangeOp::parse);
        assert_eq!(Transport::Unspecified.as_str(), "");
        assert_eq!(Transport::parse("TRANSPORT_STDIO"), None);
        // The words the REST API has always used.
        assert_eq!(
            InvocationOutcome::ALL.iter().map(|o| o.as_str()).collect::<Vec<_>>(),
            ["ok", "upstream_error", "disabled", "timeout", "unreachable", "invalid", "cancelled"]
        );
        assert_eq!(ChangeEntity::Setting.as_str(), "settings");
    }
}
