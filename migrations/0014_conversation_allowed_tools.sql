-- 0014: the tools allowed "always" in a conversation (an approval answered `allow_always`,
-- issue 34 §1), so a restart of the chat service keeps them. Written by coffer-chat through the
-- store's Conversations service; they go with their conversation (ON DELETE CASCADE) and the
-- chat service clears them when the conversation's permission mode changes.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE conversation_allowed_tools (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    tool            TEXT NOT NULL,
    decided_by      TEXT NOT NULL DEFAULT '',
    actor           TEXT NOT NULL DEFAULT '',
    allowed_ms      INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, tool)
) STRICT, WITHOUT ROWID;
