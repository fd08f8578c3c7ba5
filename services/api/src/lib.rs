//! The REST contract of the daemon's `/v1` routes: every request and response body as a Rust
//! type (serde for the wire, [`schemars::JsonSchema`] for its description), shared by the edge's
//! handlers (`gateway-edge/src/rest/`), the `coffer` CLI and the tests. The OpenAPI document
//! (`GET /v1/openapi.json`) and `docs/REST.md` are generated from these types and the edge's
//! route table (`gateway-edge/src/rest/openapi.rs`), so a body and its description cannot drift:
//! a field renamed in a type is renamed in the document, and `docs/REST.md` is checked to be
//! current by a test.
//!
//! Why `schemars` (1.x) and not `utoipa`: schemars emits JSON Schema 2020-12, which is exactly
//! OpenAPI 3.1's schema dialect, so its output goes into `components/schemas` unchanged
//! ([`schema::Components`]); it reads serde's attributes (`rename_all`, `default`,
//! `deny_unknown_fields`, `flatten`, tagged enums), so the schema follows what serde accepts; and
//! the same derive can later give the built-in MCP tools' `inputSchema` (MCP asks for JSON
//! Schema, not OpenAPI). utoipa would also own the route table through its path macros; ours is
//! a plain table the edge keeps beside its router (a test compares the two), which costs no
//! macro and reads in one place. schemars' dependencies (`dyn-clone`, `ref-cast`, and a derive on
//! the `syn` the build already has) are small.
//!
//! Request bodies are parsed by one function, [`body::parse`]: unknown fields are refused with
//! their path (`agent_config.session_id`), a value of the wrong type is named with the type it
//! needs and the type it got. Request types therefore say `#[serde(deny_unknown_fields)]`.
//!
//! One module per route group; a group's module holds the bodies of its routes, named as the
//! document names them (`Credential`, `CredentialPut`, …).
pub mod agent_sessions;
pub mod body;
pub mod channels;
pub mod chat;
pub mod console;
pub mod credentials;
pub mod daemon;
pub mod events;
pub mod knowledge;
pub mod llm;
pub mod logs;
pub mod maintenance;
pub mod profiles;
pub mod registry;
pub mod schema;
pub mod servers;
pub mod settings;
pub mod skills;
pub mod sync;
pub mod tools;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A list answer: `{"items":[…],"next_cursor":…}`. `next_cursor` is passed back as `cursor`
/// for the next page; null on the last (every list that is not paged answers one page).
///
/// Described inline where it is used (`{items: [Credential], next_cursor: …}`), not by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(inline)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass back as `cursor` for the next page; null on the last.
    pub next_cursor: Option<String>,
}

impl<T> Page<T> {
    /// The only page of a list that is not paged.
    pub fn all(items: Vec<T>) -> Self {
        Self { items, next_cursor: None }
    }
}
