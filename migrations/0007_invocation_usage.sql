-- 0007: an invocation of a built-in tool that runs the internal agent (`coffer__ask`) records
-- what its run used: the LLM connection and model, the input and output tokens summed over the
-- run's model requests, and how many requests it made. NULL for every other invocation (and for
-- every row logged before this).
-- Append-only: never edit a migration that has shipped; add a new numbered file.

ALTER TABLE mcp_invocations ADD COLUMN usage_connection TEXT;
ALTER TABLE mcp_invocations ADD COLUMN usage_model TEXT;
ALTER TABLE mcp_invocations ADD COLUMN usage_input_tokens INTEGER;
ALTER TABLE mcp_invocations ADD COLUMN usage_output_tokens INTEGER;
ALTER TABLE mcp_invocations ADD COLUMN usage_iterations INTEGER;
