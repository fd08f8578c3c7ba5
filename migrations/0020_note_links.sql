-- 0020: notes as a person keeps them. Each indexed document's `[[wikilinks]]` (`kb_links`, one
-- row per link in document order) and the names other notes' links may resolve to
-- (`kb_note_names`: its file name without `.md`, its front matter aliases and its path without
-- `.md`, lower-cased). Both are derived, written by UpsertDocument in the same transaction as the
-- document's chunks, and go with the document (ON DELETE CASCADE). A KB may be marked writable
-- (`coffer kb add … --writable`): coffer__write_note then writes into the user's folder too.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE kb_links (
    document   INTEGER NOT NULL REFERENCES kb_documents (id) ON DELETE CASCADE,
    ordinal    INTEGER NOT NULL,            -- position in the document, 0-based
    target     TEXT NOT NULL,               -- as written: `Note`, `folder/Note`
    target_key TEXT NOT NULL,               -- lower-cased, without `.md`: what resolution compares
    fragment   TEXT NOT NULL DEFAULT '',    -- after `#`: a heading or `^block`
    alias      TEXT NOT NULL DEFAULT '',    -- after `|`
    embed      INTEGER NOT NULL DEFAULT 0,  -- `![[…]]`
    line       INTEGER NOT NULL,            -- 1-based line in the source file
    PRIMARY KEY (document, ordinal)
) WITHOUT ROWID;
CREATE INDEX kb_links_target ON kb_links (target_key);

CREATE TABLE kb_note_names (
    document INTEGER NOT NULL REFERENCES kb_documents (id) ON DELETE CASCADE,
    kind     INTEGER NOT NULL CHECK (kind IN (0, 1, 2)),  -- 0 file name, 1 alias, 2 path
    key      TEXT NOT NULL,
    PRIMARY KEY (document, kind, key)
) WITHOUT ROWID;
CREATE INDEX kb_note_names_key ON kb_note_names (key, kind);

ALTER TABLE kb_knowledge_bases ADD COLUMN writable INTEGER NOT NULL DEFAULT 0;
