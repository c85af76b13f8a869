-- One commit per SQS batch (issue 17): the fences of a batch's new jobs claimed in one statement,
-- and the batch's transaction checked whole in one statement before its one COMMIT. Additive:
-- the per-job functions of 0007 and 0008 stay, and an old function version keeps using them.

-- Claims the fences of (p_job_ids[i], p_consumer) for p_tenant_ids[i] in the caller's
-- transaction, in job id order, so that two batches sharing jobs wait on each other in the same
-- order and never deadlock. Returns the jobs whose fence this transaction inserted (do their
-- work); a job missing from the result was already processed (a duplicate). A wait longer than
-- p_wait raises lock_not_available (55P03), as core.claim_fence does, and the transaction is then
-- aborted: the caller falls back to one job at a time.
CREATE FUNCTION core.claim_fences(
    p_job_ids    uuid[],
    p_consumer   text,
    p_tenant_ids uuid[],
    p_now        timestamptz,
    p_expires_at timestamptz,
    p_wait       text
) RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    previous constant text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', p_wait, true);
    RETURN QUERY
        INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
        SELECT j.job_id, p_consumer, j.tenant_id, p_now, p_expires_at
        FROM unnest(p_job_ids, p_tenant_ids) AS j (job_id, tenant_id)
        ORDER BY j.job_id
        ON CONFLICT (job_id, consumer) DO NOTHING
        RETURNING processed_jobs.job_id;
    PERFORM set_config('lock_timeout', previous, true);
END
$$;

COMMENT ON FUNCTION core.claim_fences(uuid[], text, uuid[], timestamptz, timestamptz, text) IS
    'Inserts the fences of a batch in job id order, waiting at most p_wait for a concurrent copy; returns the jobs inserted.';

-- core.finish_job for a batch: the last statement of the batch's transaction before its COMMIT.
-- It raises unless every fence of p_job_ids is this transaction's own and the transaction is
-- alive (on an aborted one it fails with 25P02), and the harness then rolls back instead of
-- committing. When it holds, it ends the jobs' bookkeeping in the same transaction: their ledger
-- rows go, and letters still pending for them are closed (their effect now commits).
CREATE FUNCTION core.finish_jobs(p_job_ids uuid[], p_consumer text, p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    owned integer;
BEGIN
    SELECT count(*) INTO owned FROM core.processed_jobs
     WHERE job_id = ANY (p_job_ids) AND consumer = p_consumer
       AND xmin::text::bigint = (txid_current() % 4294967296);
    IF owned <> cardinality(p_job_ids) THEN
        RAISE EXCEPTION 'the batch''s transaction is not whole: % of its % fences are its own (its work committed or rolled back the transaction itself)',
            owned, cardinality(p_job_ids)
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    DELETE FROM core.job_executions WHERE job_id = ANY (p_job_ids) AND consumer = p_consumer;
    -- job_id = ANY, the leading column of the pending-letter index: one probe per job, whatever
    -- the number of letters pending for the consumer.
    UPDATE core.dead_letters
       SET status = 'discarded',
           discard_reason = 'the job committed through another delivery (in a batch) after this letter was written; nothing to replay',
           reviewed_by = 'harness',
           reviewed_at = p_now
     WHERE job_id = ANY (p_job_ids) AND consumer = p_consumer AND status = 'pending_review';
    RETURN owned;
END
$$;

COMMENT ON FUNCTION core.finish_jobs(uuid[], text, timestamptz) IS
    'Run last in a batch''s transaction, with its COMMIT: raises unless every fence is this transaction''s own; clears their ledger and closes letters pending for them.';
