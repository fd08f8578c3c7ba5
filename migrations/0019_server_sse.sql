-- 0022: a server may be registered with the legacy HTTP+SSE transport (MCP 2024-11-05):
-- `transport` 'sse' (`coffer mcp add NAME --url URL --transport sse`, REST `"transport": "sse"`).
-- SQLite cannot change a CHECK constraint in place, so the table is rebuilt with the same
-- columns and rows; nothing references it by foreign key.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE mcp_servers_new (
    name         TEXT PRIMARY KEY,
    transport    TEXT NOT NULL CHECK (transport IN ('stdio', 'http', 'sse')),
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
    updated_at   TEXT NOT NULL,
    no_sandbox   INTEGER NOT NULL DEFAULT 0
) STRICT;

INSERT INTO mcp_servers_new (name, transport, command, args_json, env_json, cwd, url, headers_json, enabled,
                             timeout_ms, version, created_at, updated_at, no_sandbox)
    SELECT name, transport, command, args_json, env_json, cwd, url, headers_json, enabled,
           timeout_ms, version, created_at, updated_at, no_sandbox
    FROM mcp_servers;

DROP TABLE mcp_servers;
ALTER TABLE mcp_servers_new RENAME TO mcp_servers;
