-- no-transaction
-- The letters of one correlation listed only where a letter has one (issue 36, "a letter costs what it
-- must"; CONCURRENTLY, alone in its file, as 0010): every query that reads this index asks for
-- one correlation_id (`correlation_id = …`), which a NULL never matches, yet a letter without one (a poison
-- message that carried none) paid for an entry. 0036 puts this index in the place of the
-- whole one.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_correlation_known_idx ON core.dead_letters (correlation_id, created_at DESC, id DESC)
    WHERE correlation_id IS NOT NULL;
