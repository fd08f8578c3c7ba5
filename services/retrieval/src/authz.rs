//! Who may call which Retrieval RPC: one row per method of `coffer.retrieval.v1.Retrieval`,
//! checked by the internal auth layer before the method runs.
//!
//! Retrieval serves the gateway (its `coffer__*` built-in tools, REST and the CLI) and chat (its
//! internal agent, later). A method with no row is refused, so a new RPC is closed until its row
//! is written; `every_retrieval_method_has_exactly_one_rule` keeps the table and
//! `proto/retrieval.proto` in step. Health is open to every service (the supervisor's checks).
use coffer_proto::retrieval::retrieval_server;
use coffer_runtime::authz::{Allow, Policy, Rule, Unlisted};
use coffer_runtime::identity::Identity;

const RETRIEVAL: &str = retrieval_server::SERVICE_NAME;
const SYNC: &str = coffer_proto::sync::sync_server::SERVICE_NAME;
/// `coffer sync` is the owner's, through the edge (REST, the CLI, the console) only.
const SYNC_CALLERS: Allow = Allow::Only(&[Identity::Gateway]);

const fn sync_rule(method: &'static str) -> Rule {
    Rule { service: SYNC, method, allow: SYNC_CALLERS }
}
/// The services that use retrieval.
const CALLERS: Allow = Allow::Only(&[Identity::Gateway, Identity::Chat]);

const fn rule(method: &'static str) -> Rule {
    Rule { service: RETRIEVAL, method, allow: CALLERS }
}

/// Retrieval's table; passed to the auth layer in [`crate::run`].
pub const POLICY: Policy = Policy {
    rules: &[
        rule("AddKnowledgeBase"),
        rule("ListKnowledgeBases"),
        rule("GetKnowledgeBase"),
        rule("RemoveKnowledgeBase"),
        rule("Reindex"),
        rule("Status"),
        rule("Search"),
        rule("Remember"),
        rule("Recall"),
        rule("ListFacts"),
        rule("GetFact"),
        rule("Forget"),
        rule("ListSkills"),
        rule("LoadSkill"),
        rule("Embed"),
        rule("ReadNote"),
        rule("WriteNote"),
        rule("SetWritable"),
        sync_rule("Init"),
        sync_rule("Sync"),
        sync_rule("Status"),
    ],
    unlisted: Unlisted::Deny,
};

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_retrieval_method_has_exactly_one_rule() {
        let proto = include_str!("../../../proto/retrieval.proto");
        let declared: BTreeSet<String> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|r| r.split('(').next().unwrap_or_default().trim().to_owned())
            .collect();
        assert!(declared.len() >= 14, "parsed {declared:?}");
        let ruled: Vec<(String, String)> =
            POLICY.rules.iter().map(|r| (r.service.to_owned(), r.method.to_owned())).collect();
        let unique: BTreeSet<(String, String)> = ruled.iter().cloned().collect();
        assert_eq!(unique.len(), ruled.len(), "a method has two rules");
        let retrieval: BTreeSet<String> =
            POLICY.rules.iter().filter(|r| r.service == RETRIEVAL).map(|r| r.method.to_owned()).collect();
        assert_eq!(declared, retrieval, "retrieval.proto's RPCs and the table differ");
        let sync_proto = include_str!("../../../proto/sync.proto");
        let sync_declared: BTreeSet<String> = sync_proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|r| r.split('(').next().unwrap_or_default().trim().to_owned())
            .collect();
        let sync_ruled: BTreeSet<String> =
            POLICY.rules.iter().filter(|r| r.service == SYNC).map(|r| r.method.to_owned()).collect();
        assert_eq!(sync_declared, sync_ruled, "sync.proto's RPCs and the table differ");
        assert_eq!(retrieval.len() + sync_ruled.len(), ruled.len(), "a rule names another service");
    }

    #[test]
    fn gateway_and_chat_may_call_and_nobody_else() {
        let path = format!("/{RETRIEVAL}/Search");
        for caller in [Identity::Gateway, Identity::Chat] {
            assert_eq!(POLICY.check(caller, &path), Ok(()));
        }
        for caller in [Identity::Store, Identity::Supervisor, Identity::Retrieval] {
            let e = POLICY.check(caller, &path).unwrap_err();
            assert_eq!(e.to_string(), format!("{caller} may not call /coffer.retrieval.v1.Retrieval/Search"));
        }
        assert!(POLICY.check(Identity::Gateway, "/coffer.retrieval.v1.Retrieval/Other").is_err(), "unlisted");
        assert_eq!(POLICY.check(Identity::Store, "/grpc.health.v1.Health/Check"), Ok(()), "health is open");
    }

    #[test]
    fn only_the_gateway_may_sync() {
        let path = format!("/{SYNC}/Sync");
        assert_eq!(POLICY.check(Identity::Gateway, &path), Ok(()));
        for caller in [Identity::Chat, Identity::Store, Identity::Supervisor, Identity::Retrieval] {
            assert!(POLICY.check(caller, &path).is_err(), "{caller}");
        }
    }
}
