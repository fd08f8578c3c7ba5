-- 0003: the SHA-256 of every migration file applied to this database, so that the store
-- refuses to start when an applied migration was edited (migrations are append-only).
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE schema_migrations (
    version    INTEGER PRIMARY KEY,
    file       TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    applied_at TEXT NOT NULL
) STRICT;
