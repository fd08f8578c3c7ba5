-- 0017: profiles (domain `profiles`, proto/store_profiles.proto): named views of the vault for a
-- kind of client (coffer_api::profiles). `spec_json` is a `ProfileSpec` as JSON text (the edge
-- validates it; the store checks it parses). `default` absent means everything in full mode.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE profiles (
    name       TEXT PRIMARY KEY,
    spec_json  TEXT NOT NULL DEFAULT '{}',
    version    INTEGER NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
) STRICT;
