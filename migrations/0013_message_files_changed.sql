-- 0013: what an assistant message's turn changed in the conversation's working directory
-- (issue 34 §4): JSON as coffer-chat's `changes::FilesChanged`, '' when not recorded.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

ALTER TABLE messages ADD COLUMN files_changed_json TEXT NOT NULL DEFAULT '';
