-- 0021: the keyword index stops keeping its own copy of the text. `kb_fts` becomes an
-- external-content FTS5 table over the view `kb_fts_source` (the chunk's text, its heading path
-- and its document's title), so the text is stored once, in kb_chunks and kb_documents. bm25's
-- statistics stay exact under deletes: FTS5 removes a row's tokens by reading its text back from
-- the view, so the store deletes a chunk's FTS row before it changes or deletes anything the view
-- reads (see the Index domain in coffer-store).
--
-- What FTS5 indexes is the text coffer-retrieval normalized (CJK runs as bigrams), which is not
-- always the raw text. The view gives back exactly what was indexed: `index_title`,
-- `index_headings`, `index_body` hold the normalized text only where FTS5's tokenizer makes
-- other tokens of the raw text than of the normalized one, NULL elsewhere. A chunk's title is
-- its own `index_title`, else its document's `index_title`, else the document's title.
--
-- Converting an existing index: the old table's text is copied where it differs from the raw
-- text (coffer-store then drops, once, the copies that tokenize as the raw text does:
-- `compact_index_text`), the old table dropped, the new one built from the view (`rebuild`):
-- the same tokens in the same rows, so the same scores.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

ALTER TABLE kb_documents ADD COLUMN index_title TEXT;
ALTER TABLE kb_chunks ADD COLUMN index_title TEXT;
ALTER TABLE kb_chunks ADD COLUMN index_headings TEXT;
ALTER TABLE kb_chunks ADD COLUMN index_body TEXT;

UPDATE kb_chunks
SET index_title = nullif(f.title, d.title),
    index_headings = nullif(f.headings, kb_chunks.heading_path),
    index_body = nullif(f.body, kb_chunks.text)
FROM kb_fts f, kb_documents d
WHERE f.rowid = kb_chunks.id AND d.id = kb_chunks.document;

DROP TABLE kb_fts;

-- What kb_fts indexes, by chunk id.
CREATE VIEW kb_fts_source (id, title, headings, body) AS
SELECT c.id, coalesce(c.index_title, d.index_title, d.title), coalesce(c.index_headings, c.heading_path),
       coalesce(c.index_body, c.text)
FROM kb_chunks c JOIN kb_documents d ON d.id = c.document;

CREATE VIRTUAL TABLE kb_fts USING fts5 (
    title, headings, body,
    content = 'kb_fts_source', content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
);
INSERT INTO kb_fts (kb_fts) VALUES ('rebuild');
-- Column weights of `rank`, as 0004 set them.
INSERT INTO kb_fts (kb_fts, rank) VALUES ('rank', 'bm25(2.0, 1.5, 1.0)');
