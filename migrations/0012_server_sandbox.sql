-- 0010: a stdio server runs in the vault sandbox (Landlock: it cannot read COFFER_HOME) unless
-- its registration opts out (`coffer mcp add/edit --no-sandbox`, REST `"sandbox": false`).
-- Every server registered before this is sandboxed from now on.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

ALTER TABLE mcp_servers ADD COLUMN no_sandbox INTEGER NOT NULL DEFAULT 0;
