-- no-transaction
-- The letters of one job listed only where a letter has one (issue 36, "a letter costs what it
-- must"; CONCURRENTLY, alone in its file, as 0010): every query that reads this index asks for
-- one job_id (`job_id = …`), which a NULL never matches, yet a letter without one (a poison
-- message that carried none) paid for an entry. 0036 puts this index in the place of the
-- whole one.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_job_known_idx ON core.dead_letters (job_id, consumer)
    WHERE job_id IS NOT NULL;
