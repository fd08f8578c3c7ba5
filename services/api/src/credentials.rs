//! Bodies of `/v1/credentials…`. A value is write-only: no response type has one, and the
//! request type that carries one has no `Debug`.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Longest credential value (bytes), as the store enforces.
pub const MAX_VALUE_BYTES: usize = 65_536;

/// A credential's metadata; never its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Credential {
    pub name: String,
    /// 1 on creation, bumped by every set.
    pub version: i64,
    #[schemars(extend("format" = "date-time"))]
    pub created_at: String,
    #[schemars(extend("format" = "date-time"))]
    pub updated_at: String,
}

/// `PUT /v1/credentials/{name}`: the value to store.
// No `Debug`: it holds a value.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialPut {
    /// 1-65536 bytes; never echoed, logged or quoted in an error.
    #[schemars(length(min = 1), extend("writeOnly" = true))]
    pub value: String,
}

/// The answer of `PUT /v1/credentials/{name}`: 201 when created, 200 when replaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialSet {
    pub name: String,
    pub version: i64,
    #[schemars(extend("format" = "date-time"))]
    pub updated_at: String,
}
