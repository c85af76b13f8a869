-- no-transaction
-- The sweeper keeps the fence of a job whose replay is queued (recorded, not yet sent): a send
-- however late must still find it (issue 22, item 3). Its NOT EXISTS probe per expired fence
-- reads this index, as the pending-letter probe reads 0008's dead_letters_pending_job_idx.
-- Built CONCURRENTLY, alone in its file (see 0010).
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_queued_job_idx
    ON core.dead_letters (job_id, consumer) WHERE replay_outcome = 'queued';
