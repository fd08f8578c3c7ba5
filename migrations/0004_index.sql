-- 0004: the derived retrieval indexes (domain `index`, written only by coffer-retrieval through
-- the store's Index service): knowledge bases' definitions, documents, chunks, the FTS5 keyword
-- index and the vector metadata. Everything but kb_knowledge_bases can be deleted and rebuilt
-- from the markdown files. The sqlite-vec `vec0` table `kb_vectors` is created by
-- ConfigureVectors, when the dimension is known (a model or dimension change recreates it).
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE kb_knowledge_bases (
    name         TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('folder', 'memory')),
    root         TEXT NOT NULL,
    include_json TEXT NOT NULL DEFAULT '[]',
    exclude_json TEXT NOT NULL DEFAULT '[]',
    created_ms   INTEGER NOT NULL
) STRICT;

-- One row per file of a KB that the index knows (indexed, or carrying an error).
CREATE TABLE kb_documents (
    id          INTEGER PRIMARY KEY,
    kb          TEXT NOT NULL REFERENCES kb_knowledge_bases (name) ON DELETE CASCADE,
    path        TEXT NOT NULL,
    mtime_ms    INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    hash        TEXT NOT NULL DEFAULT '',
    title       TEXT NOT NULL DEFAULT '',
    tags_json   TEXT NOT NULL DEFAULT '[]',
    error       TEXT NOT NULL DEFAULT '',
    indexed_ms  INTEGER NOT NULL,
    chunk_count INTEGER NOT NULL DEFAULT 0,
    UNIQUE (kb, path)
) STRICT;
CREATE INDEX kb_documents_mtime ON kb_documents (mtime_ms);
CREATE INDEX kb_documents_error ON kb_documents (kb) WHERE error <> '';

-- A document's tags, one row each, for the "has every tag" filter.
CREATE TABLE kb_document_tags (
    document INTEGER NOT NULL REFERENCES kb_documents (id) ON DELETE CASCADE,
    tag      TEXT NOT NULL,
    PRIMARY KEY (document, tag)
) STRICT, WITHOUT ROWID;
CREATE INDEX kb_document_tags_tag ON kb_document_tags (tag);

-- Chunks of a document. AUTOINCREMENT: an id is never reused, so that a vector computed for a
-- chunk that has since been deleted can never land on another chunk. The id is the rowid of
-- the chunk's kb_fts row and the chunk_id of its kb_vectors row. `index_hash` is the hash of
-- what kb_fts holds for it (title, headings, body), so a kept chunk's FTS row is rewritten only
-- when that changed (a new document title). `embedded` = it has a vector of the configured model.
CREATE TABLE kb_chunks (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    document     INTEGER NOT NULL REFERENCES kb_documents (id) ON DELETE CASCADE,
    ordinal      INTEGER NOT NULL,
    heading_path TEXT NOT NULL DEFAULT '[]',
    line_start   INTEGER NOT NULL,
    line_end     INTEGER NOT NULL,
    hash         TEXT NOT NULL,
    index_hash   TEXT NOT NULL,
    text         TEXT NOT NULL,
    embedded     INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX kb_chunks_document ON kb_chunks (document, line_start);
CREATE INDEX kb_chunks_pending ON kb_chunks (id) WHERE embedded = 0;

-- The keyword index over the text coffer-retrieval normalized (CJK runs as bigrams), rowid =
-- kb_chunks.id. It keeps its own copy of that text: a contentless table (`content = ''`,
-- `contentless_delete = 1`) leaves a deleted row's statistics in bm25's document count and
-- average length, so scores drift with every edit and a clean rebuild would rank differently.
CREATE VIRTUAL TABLE kb_fts USING fts5 (
    title, headings, body,
    tokenize = 'porter unicode61 remove_diacritics 2'
);
-- Column weights of `rank`: title 2, headings 1.5, body 1 (a note's title is often its first
-- heading too, so it counts in both; heavier weights ranked worse on Cranfield).
INSERT INTO kb_fts (kb_fts, rank) VALUES ('rank', 'bm25(2.0, 1.5, 1.0)');

-- The embedding model and dimension kb_vectors holds vectors of (at most one row).
CREATE TABLE kb_vector_config (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    model     TEXT NOT NULL,
    dimension INTEGER NOT NULL CHECK (dimension > 0)
) STRICT;
