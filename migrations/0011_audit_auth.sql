-- 0011: the audit log records how each request was authenticated, found server-side: `token`,
-- `session:<12 hex digits of the SHA-256 of the web session id>`, or `internal:<service>` for
-- a service's own call. `actor` stays the label the caller gave (X-Coffer-Actor), which can no
-- longer pass for the authentication. Empty for rows written before this.
-- Append-only: never edit a migration that has shipped; add a new numbered file.

ALTER TABLE audit_log ADD COLUMN auth TEXT NOT NULL DEFAULT '';
