//! The outcome of one recorded invocation (`mcp_invocations.outcome`), and its wire names as the
//! REST API shows and filters them.

/// How an invocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The upstream answered with a result.
    Ok,
    /// The upstream answered with a JSON-RPC error.
    UpstreamError,
    /// Policy refused it (`TOOL_DISABLED`); no upstream was contacted.
    Disabled,
    /// The upstream did not answer within the call timeout.
    Timeout,
    /// The upstream could not be started or died.
    Unreachable,
    /// The request was malformed or named nothing known.
    Invalid,
    /// The client cancelled it.
    Cancelled,
}

impl Outcome {
    /// Every outcome, in the order the docs list them.
    pub const ALL: &'static [Outcome] = &[
        Outcome::Ok,
        Outcome::UpstreamError,
        Outcome::Disabled,
        Outcome::Timeout,
        Outcome::Unreachable,
        Outcome::Invalid,
        Outcome::Cancelled,
    ];

    /// Every wire name, in the order of [`Outcome::ALL`].
    pub const NAMES: &'static [&'static str] =
        &["ok", "upstream_error", "disabled", "timeout", "unreachable", "invalid", "cancelled"];

    /// The wire name (`upstream_error`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Disabled => "disabled",
            Outcome::Timeout => "timeout",
            Outcome::Unreachable => "unreachable",
            Outcome::Invalid => "invalid",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// The outcome a wire name names; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Outcome> {
        Outcome::ALL.iter().copied().find(|o| o.as_str() == name)
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_order() {
        assert_eq!(Outcome::ALL.len(), Outcome::NAMES.len());
        for (o, name) in Outcome::ALL.iter().zip(Outcome::NAMES) {
            assert_eq!(o.as_str(), *name);
            assert_eq!(Outcome::from_name(name), Some(*o));
        }
        assert_eq!(Outcome::from_name("great"), None);
    }
}
