-- 0010: wrong pairing tries are counted per sender (the chat that sent `/pair <code>`), so a
-- stranger's wrong tries never void the owner's code: after PAIRING_MAX_WRONG_TRIES wrong tries
-- a sender is refused for the rest of that code, everyone else may still claim it. Rows are
-- cleared when a new code starts, on unpairing and with their channel.
-- `channels.pairing_wrong_tries` stays the total, for the record; it no longer voids the code.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

CREATE TABLE channel_pairing_tries (
    channel     TEXT NOT NULL REFERENCES channels (name) ON DELETE CASCADE,
    sender      TEXT NOT NULL,
    wrong_tries INTEGER NOT NULL,
    PRIMARY KEY (channel, sender)
) STRICT;
