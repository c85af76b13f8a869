-- no-transaction
-- The letter of one SQS message, whatever its consumer (see 0010 for why CONCURRENTLY, alone in
-- its file).
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_message_idx ON core.dead_letters (message_id);
