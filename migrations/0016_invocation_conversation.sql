-- 0015: the conversation whose agent turn made an invocation (issue 35 §4: Activity names the
-- conversation of an agent's call). Written by the gateway from `X-Coffer-Conversation`, which
-- a managed agent's shim sends (believed from the agent token only); '' for every other caller
-- and for rows written before. Not a foreign key: the log outlives a deleted conversation (its
-- title is then unknown). Append-only: never edit a migration that has shipped.

ALTER TABLE mcp_invocations ADD COLUMN conversation_id TEXT NOT NULL DEFAULT '';
CREATE INDEX mcp_invocations_conversation ON mcp_invocations (conversation_id, id) WHERE conversation_id <> '';
