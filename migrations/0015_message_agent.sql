-- 0015: the agent that answered an assistant message and the LLM connection it was bound to for
-- that turn (issue 35 §4: a message shows who answered). '' for user messages; the connection is
-- '' for the agent's own login. Answers stored before this are given their conversation's agent
-- (a conversation's agent never changes); their connection stays unknown ('').
-- Append-only: never edit a migration that has shipped; add a new numbered file.

ALTER TABLE messages ADD COLUMN agent_key TEXT NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN connection TEXT NOT NULL DEFAULT '';
UPDATE messages SET agent_key = (SELECT c.agent_key FROM conversations c WHERE c.id = messages.conversation_id)
    WHERE role = 'assistant';
