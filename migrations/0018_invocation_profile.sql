-- 0018: the profile of the MCP session that made an invocation (issue 36 §1: a session's
-- profile is recorded on its invocations, with the client's name). Written by the gateway from
-- the session's profile ('default' when the client named none); '' for in-house callers (the
-- broker: REST, channels) and for rows written before. Not a foreign key: the log outlives a
-- removed profile. Append-only: never edit a migration that has shipped.

ALTER TABLE mcp_invocations ADD COLUMN profile TEXT NOT NULL DEFAULT '';
CREATE INDEX mcp_invocations_profile ON mcp_invocations (profile, id) WHERE profile <> '';
