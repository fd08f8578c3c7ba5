-- 0008: channels (domain `channels`, proto/store_channels.proto): the IM chats the owner drives
-- conversations from, and the little state their adapters keep across restarts. No secret is
-- here: the `*_ref` columns name rows of `credentials`; of a pairing code only its SHA-256.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE channels (
    name                TEXT PRIMARY KEY,
    kind                TEXT NOT NULL CHECK (kind IN ('telegram', 'seatalk')),
    enabled             INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    bot_token_ref       TEXT NOT NULL DEFAULT '',
    app_id_ref          TEXT NOT NULL DEFAULT '',
    app_secret_ref      TEXT NOT NULL DEFAULT '',
    signing_secret_ref  TEXT NOT NULL DEFAULT '',
    api_base_url        TEXT NOT NULL DEFAULT '',
    default_agent       TEXT NOT NULL DEFAULT '',
    agent_config_json   TEXT NOT NULL DEFAULT '',
    -- The owner after pairing (empty = unpaired: every chat is refused).
    owner_id            TEXT NOT NULL DEFAULT '',
    owner_display       TEXT NOT NULL DEFAULT '',
    paired_at           TEXT NOT NULL DEFAULT '',
    -- The pending (or last) pairing code: its SHA-256 (NULL = none), when it expires (Unix ms),
    -- the wrong tries so far, and whether it was used.
    pairing_sha256      BLOB CHECK (pairing_sha256 IS NULL OR length(pairing_sha256) = 32),
    pairing_expires_ms  INTEGER NOT NULL DEFAULT 0,
    pairing_wrong_tries INTEGER NOT NULL DEFAULT 0,
    pairing_used        INTEGER NOT NULL DEFAULT 0 CHECK (pairing_used IN (0, 1)),
    -- Telegram's getUpdates offset (the next update_id to fetch); moves forward only.
    cursor              INTEGER NOT NULL DEFAULT 0,
    version             INTEGER NOT NULL DEFAULT 1,
    created_at          TEXT NOT NULL,
    updated_at          TEXT NOT NULL
) STRICT;

-- Events already seen (SeaTalk's event_id), for de-duplicating redeliveries; the newest 10,000
-- per channel are kept (the rowid orders them).
CREATE TABLE channel_events (
    channel  TEXT NOT NULL REFERENCES channels (name) ON DELETE CASCADE,
    event_id TEXT NOT NULL,
    at       TEXT NOT NULL,
    PRIMARY KEY (channel, event_id)
) STRICT;
-- (channel, rowid): the pruning's newest-first walk.
CREATE INDEX channel_events_order ON channel_events (channel);
