-- 0005: the chat service's conversations (domain `conversations`, written and read only by
-- coffer-chat through the store's Conversations service, proto/store_conversations.proto):
-- conversations, their messages, the persisted pending queue and each conversation's event
-- sequence high-water mark. Times are Unix milliseconds; ids are caller-chosen ULIDs.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

-- `pk` is an explicit rowid alias so that the title index (rowid = pk) survives a VACUUM, which
-- may renumber an implicit rowid. `pending_paused` and `event_seq` belong to the conversation's
-- row: one of each per conversation, deleted with it.
CREATE TABLE conversations (
    pk                INTEGER PRIMARY KEY,
    id                TEXT NOT NULL UNIQUE,
    agent_key         TEXT NOT NULL,
    title             TEXT NOT NULL DEFAULT '',
    title_fold        TEXT NOT NULL DEFAULT '',
    agent_config_json TEXT NOT NULL DEFAULT '{}',
    channel_name      TEXT NOT NULL DEFAULT '',
    peer_chat_id      TEXT NOT NULL DEFAULT '',
    created_ms        INTEGER NOT NULL,
    updated_ms        INTEGER NOT NULL,
    last_message_ms   INTEGER NOT NULL DEFAULT 0,
    archived_ms       INTEGER NOT NULL DEFAULT 0,
    version           INTEGER NOT NULL DEFAULT 1,
    message_count     INTEGER NOT NULL DEFAULT 0,
    pending_paused    INTEGER NOT NULL DEFAULT 0,
    event_seq         INTEGER NOT NULL DEFAULT 0
) STRICT;
-- ListConversations: newest activity first, (updated_ms, id) being the cursor.
CREATE INDEX conversations_recent ON conversations (updated_ms DESC, id DESC);
-- The conversation bound to a channel's chat.
CREATE INDEX conversations_channel ON conversations (channel_name, peer_chat_id, updated_ms DESC)
    WHERE channel_name <> '';
-- Retention: active conversations by last activity, archived ones by archiving time.
CREATE INDEX conversations_active_idle ON conversations (MAX(last_message_ms, created_ms))
    WHERE archived_ms = 0;
CREATE INDEX conversations_archived ON conversations (archived_ms) WHERE archived_ms <> 0;

-- Title search (case-insensitive substring): `title_fold` is the title lowercased by the store
-- (Unicode rules, which SQLite's lower() lacks), indexed by trigrams (rowid = conversations.pk,
-- kept in step by the triggers below); a needle of three characters or more is a phrase query
-- on it, a shorter one a scan of `title_fold`: the same substring semantics either way.
CREATE VIRTUAL TABLE conversation_titles USING fts5 (title_fold, tokenize = 'trigram case_sensitive 1');
CREATE TRIGGER conversations_title_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO conversation_titles (rowid, title_fold) VALUES (new.pk, new.title_fold);
END;
CREATE TRIGGER conversations_title_update AFTER UPDATE OF title_fold ON conversations BEGIN
    DELETE FROM conversation_titles WHERE rowid = old.pk;
    INSERT INTO conversation_titles (rowid, title_fold) VALUES (new.pk, new.title_fold);
END;
CREATE TRIGGER conversations_title_delete AFTER DELETE ON conversations BEGIN
    DELETE FROM conversation_titles WHERE rowid = old.pk;
END;

-- Messages in append order (`pk`). A message's content blocks are one JSON array: they are
-- always written and read whole with their message (a turn's assistant message is replaced
-- whole by UpdateMessage), no query looks inside one, and the array keeps their order without a
-- position column.
CREATE TABLE messages (
    pk                 INTEGER PRIMARY KEY,
    id                 TEXT NOT NULL UNIQUE,
    conversation_id    TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role               TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    status             TEXT NOT NULL CHECK (status IN ('complete', 'streaming', 'interrupted', 'failed')),
    blocks_json        TEXT NOT NULL DEFAULT '[]',
    input_tokens       INTEGER NOT NULL DEFAULT 0,
    output_tokens      INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    model              TEXT NOT NULL DEFAULT '',
    error              TEXT NOT NULL DEFAULT '',
    source             TEXT NOT NULL DEFAULT '',
    created_ms         INTEGER NOT NULL,
    updated_ms         INTEGER NOT NULL
) STRICT;
CREATE INDEX messages_conversation ON messages (conversation_id, pk);
CREATE INDEX messages_streaming ON messages (pk) WHERE status = 'streaming';

-- The pending queue of a conversation, in order (its paused flag is on the conversation).
CREATE TABLE pending_items (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position        INTEGER NOT NULL,
    id              TEXT NOT NULL,
    text            TEXT NOT NULL,
    created_ms      INTEGER NOT NULL,
    source          TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (conversation_id, position)
) STRICT, WITHOUT ROWID;
