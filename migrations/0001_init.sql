-- 0001: registry, preferences, logs, settings, credentials, change stream.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE mcp_servers (
    name         TEXT PRIMARY KEY,
    transport    TEXT NOT NULL CHECK (transport IN ('stdio', 'http')),
    command      TEXT NOT NULL DEFAULT '',
    args_json    TEXT NOT NULL DEFAULT '[]',
    env_json     TEXT NOT NULL DEFAULT '{}',
    cwd          TEXT NOT NULL DEFAULT '',
    url          TEXT NOT NULL DEFAULT '',
    headers_json TEXT NOT NULL DEFAULT '{}',
    enabled      INTEGER NOT NULL DEFAULT 1,
    timeout_ms   INTEGER NOT NULL DEFAULT 0,
    version      INTEGER NOT NULL DEFAULT 1,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
) STRICT;

-- The user's enable/disable flags, keyed by (server, kind, original name). Capability names
-- and schemas themselves are never persisted.
CREATE TABLE capability_prefs (
    server     TEXT NOT NULL,
    kind       TEXT NOT NULL CHECK (kind IN ('tool', 'prompt', 'resource')),
    name       TEXT NOT NULL,
    enabled    INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (server, kind, name)
) STRICT;

CREATE TABLE audit_log (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       TEXT NOT NULL,
    actor    TEXT NOT NULL,
    action   TEXT NOT NULL,
    target   TEXT NOT NULL,
    outcome  TEXT NOT NULL,
    trace_id TEXT NOT NULL DEFAULT '',
    detail   TEXT NOT NULL DEFAULT '{}'
) STRICT;
CREATE INDEX audit_log_at ON audit_log (at);

-- Never arguments, never results.
CREATE TABLE mcp_invocations (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          TEXT NOT NULL,
    target      TEXT NOT NULL,
    method      TEXT NOT NULL,
    server      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    duration_ms INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    trace_id    TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX mcp_invocations_at ON mcp_invocations (at);
CREATE INDEX mcp_invocations_server ON mcp_invocations (server, id);

CREATE TABLE settings (
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_at TEXT NOT NULL
) STRICT;

-- Values are AEAD ciphertext under secret.key (never plaintext).
CREATE TABLE credentials (
    name       TEXT PRIMARY KEY,
    nonce      BLOB NOT NULL,
    ciphertext BLOB NOT NULL,
    version    INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
) STRICT;

-- Change stream: one row per committed mutation, strictly increasing seq.
CREATE TABLE changes (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    entity TEXT NOT NULL,
    key    TEXT NOT NULL,
    op     TEXT NOT NULL,
    at     TEXT NOT NULL
) STRICT;
