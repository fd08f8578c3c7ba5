-- 0009: the invocation log records which MCP client made each call: the `clientInfo` name and
-- version the downstream client gave (in `initialize`, or in a modern request's `_meta`).
-- Empty for a call whose client named none, for broker sessions (chat's agent, REST, channels:
-- their actor says who called) and for every row logged before this.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

ALTER TABLE mcp_invocations ADD COLUMN client_name TEXT NOT NULL DEFAULT '';
ALTER TABLE mcp_invocations ADD COLUMN client_version TEXT NOT NULL DEFAULT '';
CREATE INDEX mcp_invocations_client ON mcp_invocations (client_name, id);
