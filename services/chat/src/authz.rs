//! Who may call which Chat RPC: one row per method of `coffer.chat.v1.Chat`, checked by the
//! internal auth layer before the method runs.
//!
//! Chat serves the gateway (REST `/v1/agents`, `/v1/conversations…`, SSE, the CLI through them;
//! `coffer.llm.v1.Llm`: REST's connection probes and the `coffer__ask` built-in;
//! `coffer.channel.v1.ChannelAdapters.ListAdapters`) and coffer-callback (`DeliverSeatalkEvent`).
//! A method with no row is refused, so a new RPC is closed until its row is written;
//! `every_chat_method_has_exactly_one_rule` keeps the table and `proto/chat.proto` and
//! `proto/llm.proto` in step.
//! Health is open to every service (the supervisor's checks).
use coffer_proto::channel::channel_adapters_server;
use coffer_proto::chat::chat_server;
use coffer_proto::llm::llm_server;
use coffer_runtime::authz::{Allow, Policy, Rule, Unlisted};
use coffer_runtime::identity::Identity;

const CHAT: &str = chat_server::SERVICE_NAME;
const LLM: &str = llm_server::SERVICE_NAME;
const CHANNELS: &str = channel_adapters_server::SERVICE_NAME;
/// The services that use chat.
const CALLERS: Allow = Allow::Only(&[Identity::Gateway]);

const fn rule(method: &'static str) -> Rule {
    Rule { service: CHAT, method, allow: CALLERS }
}

const fn llm_rule(method: &'static str) -> Rule {
    Rule { service: LLM, method, allow: CALLERS }
}

/// Chat's table; passed to the auth layer in [`crate::run`].
pub const POLICY: Policy = Policy {
    rules: &[
        rule("ListAgents"),
        rule("CreateConversation"),
        rule("ListConversations"),
        rule("GetConversation"),
        rule("ListMessages"),
        rule("UpdateConversation"),
        rule("DeleteConversation"),
        rule("SendMessage"),
        rule("SetPending"),
        rule("Interrupt"),
        rule("Subscribe"),
        rule("WatchConversations"),
        rule("AnswerApproval"),
        rule("GetFileDiff"),
        rule("GetAttachment"),
        rule("ForgetAllowedTools"),
        rule("ListAgentSessions"),
        rule("ImportAgentSession"),
        rule("ListProjects"),
        llm_rule("TestConnection"),
        llm_rule("ListModels"),
        llm_rule("Ask"),
        // Channel adapters: their live state for the gateway; SeaTalk events only from
        // coffer-callback (its own identity).
        Rule { service: CHANNELS, method: "ListAdapters", allow: CALLERS },
        Rule { service: CHANNELS, method: "DeliverSeatalkEvent", allow: Allow::Only(&[Identity::Callback]) },
    ],
    unlisted: Unlisted::Deny,
};

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_chat_method_has_exactly_one_rule() {
        let rpcs = |proto: &str| -> BTreeSet<String> {
            proto
                .lines()
                .filter_map(|l| l.trim().strip_prefix("rpc "))
                .map(|r| r.split('(').next().unwrap_or_default().trim().to_owned())
                .collect()
        };
        for (service, proto, least) in [
            (CHAT, include_str!("../../../proto/chat.proto"), 11),
            (LLM, include_str!("../../../proto/llm.proto"), 3),
            (CHANNELS, include_str!("../../../proto/channel.proto"), 2),
        ] {
            let declared = rpcs(proto);
            assert!(declared.len() >= least, "parsed {declared:?}");
            let ruled: Vec<String> =
                POLICY.rules.iter().filter(|r| r.service == service).map(|r| r.method.to_owned()).collect();
            let unique: BTreeSet<String> = ruled.iter().cloned().collect();
            assert_eq!(unique.len(), ruled.len(), "a method of {service} has two rules");
            assert_eq!(declared, unique, "{service}'s RPCs and the table differ");
        }
        assert!(POLICY.rules.iter().all(|r| [CHAT, LLM, CHANNELS].contains(&r.service)));
    }

    #[test]
    fn only_the_gateway_may_call() {
        let path = format!("/{CHAT}/SendMessage");
        assert_eq!(POLICY.check(Identity::Gateway, &path), Ok(()));
        for caller in [Identity::Store, Identity::Supervisor, Identity::Retrieval, Identity::Chat] {
            let e = POLICY.check(caller, &path).unwrap_err();
            assert_eq!(e.to_string(), format!("{caller} may not call /coffer.chat.v1.Chat/SendMessage"));
        }
        assert!(POLICY.check(Identity::Gateway, "/coffer.chat.v1.Chat/Other").is_err(), "unlisted");
        assert_eq!(POLICY.check(Identity::Store, "/grpc.health.v1.Health/Check"), Ok(()), "health is open");
        for method in ["Ask", "TestConnection", "ListModels"] {
            let path = format!("/{LLM}/{method}");
            assert_eq!(POLICY.check(Identity::Gateway, &path), Ok(()));
            for caller in [Identity::Store, Identity::Retrieval, Identity::Chat, Identity::Supervisor] {
                assert!(POLICY.check(caller, &path).is_err(), "{caller} on {path}");
            }
        }
        let deliver = format!("/{CHANNELS}/DeliverSeatalkEvent");
        assert_eq!(POLICY.check(Identity::Callback, &deliver), Ok(()));
        for caller in [Identity::Gateway, Identity::Store, Identity::Chat, Identity::Supervisor] {
            assert!(POLICY.check(caller, &deliver).is_err(), "{caller} on {deliver}");
        }
        let list = format!("/{CHANNELS}/ListAdapters");
        assert_eq!(POLICY.check(Identity::Gateway, &list), Ok(()));
        assert!(POLICY.check(Identity::Callback, &list).is_err(), "the callback only delivers");
        assert!(POLICY.check(Identity::Callback, "/coffer.chat.v1.Chat/SendMessage").is_err());
    }
}
