-- no-transaction
-- Finding any letter from what a support ticket names (issue 15), newest first like every list:
-- by correlation id here, by tenant and by SQS message id in the next two (by job id, 0002's
-- (job_id, consumer) index serves). Each is built CONCURRENTLY, outside a transaction, so letter
-- writes never wait for the build on a live table, and alone in its file, since PostgreSQL runs
-- the statements of one query string in one transaction; IF NOT EXISTS, so a deploy that failed
-- half-way reruns it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_correlation_created_idx
    ON core.dead_letters (correlation_id, created_at DESC, id DESC);
