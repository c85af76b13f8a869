-- The baseline: the plainest batched DELETE of every expired fence, run inside the server
-- (no client round trips), committing every batch of 5,000 like the sweeper does.
DO $$
DECLARE deleted bigint;
BEGIN
    LOOP
        DELETE FROM core.processed_jobs
        WHERE ctid IN (SELECT ctid FROM core.processed_jobs WHERE expires_at < now() LIMIT 5000);
        GET DIAGNOSTICS deleted = ROW_COUNT;
        COMMIT;
        EXIT WHEN deleted < 5000;
    END LOOP;
END
$$;
