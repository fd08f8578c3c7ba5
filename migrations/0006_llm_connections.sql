-- 0006: LLM connections (domain `llm`, proto/store_llm.proto): where and how Coffer reaches a
-- model provider. The secret is never here: `credential_ref` names a row of `credentials`.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE llm_connections (
    name             TEXT PRIMARY KEY,
    wire             TEXT NOT NULL CHECK (wire IN ('anthropic', 'openai-responses', 'openai-chat', 'ollama')),
    base_url         TEXT NOT NULL DEFAULT '',
    credential_ref   TEXT NOT NULL DEFAULT '',
    model            TEXT NOT NULL,
    fast_model       TEXT NOT NULL DEFAULT '',
    internal_default INTEGER NOT NULL DEFAULT 0 CHECK (internal_default IN (0, 1)),
    version          INTEGER NOT NULL DEFAULT 1,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL
) STRICT;

-- At most one internal default: a second row with the flag set fails the insert or update.
CREATE UNIQUE INDEX llm_connections_one_default ON llm_connections (internal_default) WHERE internal_default = 1;
