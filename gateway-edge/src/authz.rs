//! Who may call which RPC on the gateway's internal listener: one row per method, keyed by the
//! full gRPC path (`/<service>/<method>`), checked by the internal auth layer before the method
//! runs.
//!
//! The tool broker is for chat (its internal agent and channels) only; REST reaches the broker
//! in-process, not over this listener. A method with no row is refused, so a new RPC is closed
//! until its row is written; `every_broker_method_has_exactly_one_rule` keeps the table and
//! `proto/broker.proto` in step. Health is open to every service (the supervisor's checks).
use coffer_proto::gateway::tool_broker_server;
use coffer_runtime::authz::{Allow, Policy, Rule, Unlisted};
use coffer_runtime::identity::Identity;

const BROKER: &str = tool_broker_server::SERVICE_NAME;
/// The services that may use the broker.
const CHAT: Allow = Allow::Only(&[Identity::Chat]);

const fn rule(method: &'static str) -> Rule {
    Rule { service: BROKER, method, allow: CHAT }
}

/// The gateway's internal table; passed to the auth layer in [`crate::run`].
pub const POLICY: Policy = Policy {
    rules: &[
        rule("ListTools"),
        rule("CallTool"),
        rule("ListPrompts"),
        rule("GetPrompt"),
        rule("ListResources"),
        rule("ReadResource"),
        rule("CloseSession"),
    ],
    unlisted: Unlisted::Deny,
};

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_broker_method_has_exactly_one_rule() {
        let proto = include_str!("../../proto/broker.proto");
        let declared: BTreeSet<String> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|r| r.split('(').next().unwrap_or_default().trim().to_owned())
            .collect();
        assert!(declared.len() >= 3, "parsed {declared:?}");
        let ruled: Vec<String> = POLICY.rules.iter().map(|r| r.method.to_owned()).collect();
        let unique: BTreeSet<String> = ruled.iter().cloned().collect();
        assert_eq!(unique.len(), ruled.len(), "a method has two rules");
        assert_eq!(declared, unique, "broker.proto's RPCs and the table differ");
        assert!(POLICY.rules.iter().all(|r| r.service == "coffer.gateway.v1.ToolBroker"));
    }

    #[test]
    fn only_chat_may_use_the_broker() {
        let path = format!("/{BROKER}/CallTool");
        assert_eq!(POLICY.check(Identity::Chat, &path), Ok(()));
        for caller in [Identity::Retrieval, Identity::Store, Identity::Supervisor, Identity::Gateway] {
            let e = POLICY.check(caller, &path).unwrap_err();
            assert_eq!(e.to_string(), format!("{caller} may not call /coffer.gateway.v1.ToolBroker/CallTool"));
        }
        assert!(POLICY.check(Identity::Chat, "/coffer.gateway.v1.ToolBroker/Other").is_err(), "unlisted");
        assert_eq!(POLICY.check(Identity::Retrieval, "/grpc.health.v1.Health/Check"), Ok(()), "health is open");
    }
}
