//! Authorization of internal RPCs: a declarative table of which identities may call which gRPC
//! method, checked by [`crate::grpc::InternalAuthLayer`] once the caller is authenticated.
//!
//! Each server passes its [`Policy`]: the store's is `coffer_store::authz::POLICY`, the
//! supervisor's control RPC has its own; services without domain RPCs yet use
//! [`Policy::ANY_SERVICE`]. The standard health service is always open to every authenticated
//! caller (the supervisor's health checks).
use crate::identity::Identity;

/// The service name of the standard gRPC health check, allowed to every authenticated caller.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// Who may call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allow {
    /// Every authenticated identity.
    AnyService,
    /// Only these identities.
    Only(&'static [Identity]),
}

impl Allow {
    fn permits(self, caller: Identity) -> bool {
        match self {
            Self::AnyService => true,
            Self::Only(ids) => ids.contains(&caller),
        }
    }
}

/// One row: method `method` of gRPC service `service` (fully qualified, e.g.
/// `coffer.store.v1.Store`), i.e. the path `/<service>/<method>`.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub service: &'static str,
    pub method: &'static str,
    pub allow: Allow,
}

/// What a method no rule names gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unlisted {
    /// Every authenticated identity may call it (servers with no table yet).
    AllowAny,
    /// Refused with `PERMISSION_DENIED` saying no rule names it (servers with a table: a new
    /// RPC is closed until someone writes its row).
    Deny,
}

/// A server's authorization table.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub rules: &'static [Rule],
    pub unlisted: Unlisted,
}

/// Why an authenticated caller was refused; becomes `PERMISSION_DENIED` with this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A rule names the method and not the caller.
    #[error("{caller} may not call {path}")]
    NotAllowed { caller: Identity, path: String },
    /// No rule names the method and the policy denies unlisted methods.
    #[error("{caller} may not call {path}: no authorization rule names it")]
    Unlisted { caller: Identity, path: String },
}

impl Policy {
    /// Every authenticated identity may call every method.
    pub const ANY_SERVICE: Policy = Policy { rules: &[], unlisted: Unlisted::AllowAny };

    /// Whether `caller` may call `path` (`/<service>/<method>`).
    ///
    /// # Errors
    /// [`Refusal`] naming the caller and the method.
    pub fn check(&self, caller: Identity, path: &str) -> Result<(), Refusal> {
        let (service, method) = split_path(path);
        if service == HEALTH_SERVICE {
            return Ok(());
        }
        match self.rules.iter().find(|r| r.service == service && r.method == method) {
            Some(rule) if rule.allow.permits(caller) => Ok(()),
            Some(_) => Err(Refusal::NotAllowed { caller, path: path.to_owned() }),
            None if self.unlisted == Unlisted::AllowAny => Ok(()),
            None => Err(Refusal::Unlisted { caller, path: path.to_owned() }),
        }
    }
}

/// `/<service>/<method>` → (`service`, `method`); a path of another shape gives an empty
/// method (no rule matches it).
fn split_path(path: &str) -> (&str, &str) {
    let p = path.strip_prefix('/').unwrap_or(path);
    p.split_once('/').unwrap_or((p, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: Policy = Policy {
        rules: &[
            Rule { service: "t.v1.S", method: "Read", allow: Allow::AnyService },
            Rule { service: "t.v1.S", method: "Write", allow: Allow::Only(&[Identity::Gateway]) },
        ],
        unlisted: Unlisted::Deny,
    };

    #[test]
    fn rules_name_the_caller_and_the_method() {
        assert_eq!(POLICY.check(Identity::Retrieval, "/t.v1.S/Read"), Ok(()));
        assert_eq!(POLICY.check(Identity::Gateway, "/t.v1.S/Write"), Ok(()));
        let e = POLICY.check(Identity::Retrieval, "/t.v1.S/Write").unwrap_err();
        assert_eq!(e.to_string(), "retrieval may not call /t.v1.S/Write");
        let e = POLICY.check(Identity::Gateway, "/t.v1.S/Other").unwrap_err();
        assert_eq!(e.to_string(), "gateway may not call /t.v1.S/Other: no authorization rule names it");
        assert!(POLICY.check(Identity::Gateway, "/t.v1.Other/Write").is_err(), "the service is part of the key");
        assert!(POLICY.check(Identity::Gateway, "garbage").is_err());
        assert_eq!(POLICY.check(Identity::Supervisor, "/grpc.health.v1.Health/Check"), Ok(()));
        assert_eq!(Policy::ANY_SERVICE.check(Identity::Chat, "/t.v1.S/Write"), Ok(()));
    }
}
