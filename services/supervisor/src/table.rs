//! The service table: every service the supervisor runs, as one row of data each. Start order
//! follows the dependencies (a service starts once every service it depends on is healthy),
//! stop order is the reverse; on-demand rows stay stopped until the control RPC's
//! `StartService` asks for them.
//!
//! Adding a service is one row here, an [`Identity`] variant (its name, its address variable),
//! its binary, and the rules of whoever serves what it calls.
//!
//! A row says: the service's name (its `Identity`), its binary, its dependencies, its runtime
//! flavour (`MultiThread`, or `CurrentThread` for the gateway's request path), whether repeated
//! crashes may mark it `failed` (not the gateway: clients wait on it), whether it runs `Always` or
//! `OnDemand`, and whether it is the edge (it alone gets the public listener, the socket and the
//! public token). [`start_order`] refuses a table with a duplicate, an unknown dependency, a cycle
//! or two edges, and orders the rest: each service starts once everything it depends on is
//! healthy, ties in table order; shutdown stops them in the reverse order (gateway first, store
//! last). Every child gets the same layout: its internal gRPC listener on fd 3
//! (`COFFER_LISTEN_FD`), the edge also its public listener on fd 4 (`COFFER_PUBLIC_FD`) and the
//! socket on fd 5 (`COFFER_SOCKET_FD`), its flavour in `COFFER_FLAVOR`, every service's address
//! (`COFFER_STORE_ADDR`, …, `COFFER_CONTROL_ADDR`). `coffer-test-daemon` (`tests/src/bin/`) runs the
//! real supervisor over a changed table (retrieval on demand, or the scripted chat service).
use coffer_runtime::identity::Identity;
use coffer_runtime::service::Flavor;

/// When a service runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Started with the daemon, stopped with it.
    Always,
    /// Stopped until `StartService`, stopped again by `StopService` (e.g. `coffer-callback`,
    /// which runs only while a SeaTalk channel is enabled) or with the daemon.
    OnDemand,
}

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct ServiceSpec {
    /// Who it is; its name (`identity.as_str()`) is what status and the control RPC show.
    pub identity: Identity,
    /// Executable, found next to `coffer-daemon` or on `PATH`.
    pub binary: &'static str,
    /// Services that must be healthy before it starts (and that stop after it).
    pub depends_on: &'static [Identity],
    /// The runtime it runs on (passed as `COFFER_FLAVOR`).
    pub flavor: Flavor,
    /// Whether repeated crashes may mark it `failed` (never the gateway: clients wait on it).
    pub may_fail: bool,
    /// Always or on demand.
    pub start: Start,
    /// Whether it is the edge: it also receives the public listener, the edge socket and the
    /// public token.
    pub edge: bool,
}

impl ServiceSpec {
    /// The service's name (`store`, `gateway`, …).
    pub fn name(&self) -> &'static str {
        self.identity.as_str()
    }
}

/// Coffer's services.
pub const SERVICES: &[ServiceSpec] = &[
    ServiceSpec {
        identity: Identity::Store,
        binary: "coffer-store",
        depends_on: &[],
        flavor: Flavor::MultiThread,
        may_fail: true,
        start: Start::Always,
        edge: false,
    },
    ServiceSpec {
        identity: Identity::Retrieval,
        binary: "coffer-retrieval",
        depends_on: &[Identity::Store],
        flavor: Flavor::MultiThread,
        may_fail: true,
        start: Start::Always,
        edge: false,
    },
    ServiceSpec {
        identity: Identity::Chat,
        binary: "coffer-chat",
        depends_on: &[Identity::Store],
        flavor: Flavor::CurrentThread,
        may_fail: true,
        start: Start::Always,
        edge: false,
    },
    ServiceSpec {
        identity: Identity::Gateway,
        binary: "coffer-gateway",
        depends_on: &[Identity::Store],
        // Every task on one thread: a call's hops between the HTTP connection, the session and
        // the upstream's pipes never hand a task to another thread (docs/BENCHMARKS.md).
        flavor: Flavor::CurrentThread,
        may_fail: false,
        start: Start::Always,
        edge: true,
    },
    // The SeaTalk webhook listener: only while a SeaTalk channel is enabled (coffer-chat's
    // adapter coordinator starts it with the signing secrets in its env and stops it with the
    // last SeaTalk channel); it forwards verified events to chat.
    ServiceSpec {
        identity: Identity::Callback,
        binary: "coffer-callback",
        depends_on: &[Identity::Chat],
        flavor: Flavor::CurrentThread,
        may_fail: true,
        start: Start::OnDemand,
        edge: false,
    },
];

/// A table that cannot be run.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("service {0} appears twice in the service table")]
    Duplicate(Identity),
    #[error("service {service} depends on {dependency}, which is not in the service table")]
    UnknownDependency { service: Identity, dependency: Identity },
    #[error("the service table's dependencies form a cycle through {0}")]
    Cycle(Identity),
    #[error("the supervisor is not a service and cannot be in the service table")]
    Supervisor,
    #[error("more than one service is the edge: {0} and {1}")]
    TwoEdges(Identity, Identity),
}

/// Indices of `table` in start order: every service after the services it depends on, ties in
/// table order (so the order is deterministic). Stop order is this reversed.
///
/// # Errors
/// [`TableError`] for a duplicate row, a dependency on a service not in the table, a cycle,
/// a row for the supervisor, or two edges.
pub fn start_order(table: &[ServiceSpec]) -> Result<Vec<usize>, TableError> {
    let index = |id: Identity| table.iter().position(|s| s.identity == id);
    let mut edge: Option<Identity> = None;
    for (i, s) in table.iter().enumerate() {
        if s.identity == Identity::Supervisor {
            return Err(TableError::Supervisor);
        }
        if index(s.identity) != Some(i) {
            return Err(TableError::Duplicate(s.identity));
        }
        if s.edge {
            if let Some(e) = edge {
                return Err(TableError::TwoEdges(e, s.identity));
            }
            edge = Some(s.identity);
        }
        if let Some(&d) = s.depends_on.iter().find(|d| index(**d).is_none()) {
            return Err(TableError::UnknownDependency { service: s.identity, dependency: d });
        }
    }
    // Kahn's algorithm, always taking the first ready row in table order.
    let mut placed = vec![false; table.len()];
    let mut order = Vec::with_capacity(table.len());
    while order.len() < table.len() {
        let next = (0..table.len())
            .find(|&i| !placed[i] && table[i].depends_on.iter().all(|d| index(*d).is_some_and(|j| placed[j])));
        match next {
            Some(i) => {
                placed[i] = true;
                order.push(i);
            }
            None => {
                let stuck = (0..table.len()).find(|&i| !placed[i]).expect("an unplaced row");
                return Err(TableError::Cycle(table[stuck].identity));
            }
        }
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(identity: Identity, depends_on: &'static [Identity]) -> ServiceSpec {
        ServiceSpec { identity, depends_on, ..SERVICES[0] }
    }

    #[test]
    fn coffer_starts_the_store_first_and_stops_the_gateway_first() {
        let order: Vec<_> = start_order(SERVICES).unwrap().into_iter().map(|i| SERVICES[i].name()).collect();
        assert_eq!(order, ["store", "retrieval", "chat", "gateway", "callback"]);
        let on_demand: Vec<_> = SERVICES.iter().filter(|s| s.start == Start::OnDemand).map(ServiceSpec::name).collect();
        assert_eq!(on_demand, ["callback"], "only the SeaTalk webhook listener runs on demand");
        let callback = SERVICES.iter().find(|s| s.identity == Identity::Callback).unwrap();
        assert_eq!((callback.binary, callback.depends_on), ("coffer-callback", &[Identity::Chat][..]));
        assert_eq!(SERVICES.iter().filter(|s| s.edge).map(ServiceSpec::name).collect::<Vec<_>>(), ["gateway"]);
    }

    #[test]
    fn dependencies_order_the_start_whatever_the_row_order() {
        use Identity::*;
        let table = [row(Gateway, &[Chat, Store]), row(Chat, &[Store]), row(Store, &[]), row(Retrieval, &[])];
        let order: Vec<_> = start_order(&table).unwrap().into_iter().map(|i| table[i].identity).collect();
        assert_eq!(order, [Store, Chat, Gateway, Retrieval]);
    }

    #[test]
    fn tables_that_cannot_run_are_refused_by_name() {
        use Identity::*;
        assert_eq!(start_order(&[row(Store, &[]), row(Store, &[])]), Err(TableError::Duplicate(Store)));
        assert_eq!(
            start_order(&[row(Chat, &[Retrieval])]),
            Err(TableError::UnknownDependency { service: Chat, dependency: Retrieval })
        );
        assert_eq!(start_order(&[row(Chat, &[Retrieval]), row(Retrieval, &[Chat])]), Err(TableError::Cycle(Chat)));
        assert_eq!(start_order(&[row(Supervisor, &[])]), Err(TableError::Supervisor));
        let edge = |i| ServiceSpec { edge: true, ..row(i, &[]) };
        assert_eq!(start_order(&[edge(Chat), edge(Gateway)]), Err(TableError::TwoEdges(Chat, Gateway)));
    }
}
