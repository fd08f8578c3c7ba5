//! Bodies of `POST /v1/backup` and `POST /v1/maintenance/prune`.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `POST /v1/backup`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "BackupRequest")]
pub struct BackupRequest {
    /// Absolute path of a directory that does not exist yet or is empty; not inside a copied
    /// folder.
    pub path: String,
}

/// One file of a backup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BackupFile {
    /// Relative, `/`-separated.
    pub path: String,
    pub bytes: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// `manifest.json` of a backup directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BackupManifest {
    /// Always 1.
    pub format_version: u32,
    pub coffer_version: String,
    #[schemars(extend("format" = "date-time"))]
    pub created_at: String,
    /// Migrations applied to the database.
    pub schema_version: i64,
    pub files: Vec<BackupFile>,
}

/// The answer of `POST /v1/backup` (201).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Backup {
    /// The backup directory (absolute).
    pub path: String,
    pub manifest: BackupManifest,
    /// True: the backup can decrypt its credentials; keep it private.
    pub secret_key_included: bool,
    /// Entries not copied (symlinks, special files).
    pub skipped: Vec<String>,
}

/// Rows a retention pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PrunedRows {
    pub invocations: u64,
    pub audit: u64,
}

/// The answer of `POST /v1/maintenance/prune`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Pruned {
    pub deleted: PrunedRows,
}

/// `GET /v1/openapi.json`: the OpenAPI 3.1 document of the edge (`openapi`, `info`, `paths`,
/// `components`, …), generated from the edge's route table and these types.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct OpenApiDocument(pub serde_json::Map<String, serde_json::Value>);
