-- 0002: the invocation log records who called ("mcp" for an MCP client session, later
-- "agent", "channel:<name>", …). Every row logged before this was an MCP session's.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

ALTER TABLE mcp_invocations ADD COLUMN actor TEXT NOT NULL DEFAULT 'mcp';
CREATE INDEX mcp_invocations_actor ON mcp_invocations (actor, id);
