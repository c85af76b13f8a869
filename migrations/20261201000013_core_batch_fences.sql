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

-- core.finish_job for a batch: run last in the batch's transaction. Returns how many of the
-- fences of p_job_ids are this transaction's own; it fails (25P02) on an aborted transaction.
-- When all of them are, it ends the jobs' bookkeeping in the same transaction (their ledger rows
-- go, letters still pending for them are closed: their effect now commits).
CREATE FUNCTION core.finish_jobs(p_job_ids uuid[], p_consumer text, p_message_ids text[], p_now timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    owned integer;
BEGIN
    SELECT count(*) INTO owned FROM core.processed_jobs
     WHERE consumer = p_consumer AND job_id = ANY (p_job_ids)
       AND xmin::text::bigint = (txid_current() % 4294967296);
    IF owned <> cardinality(p_job_ids) THEN
        RETURN owned;
    END IF;
    DELETE FROM core.job_executions WHERE consumer = p_consumer AND job_id = ANY (p_job_ids);
    UPDATE core.dead_letters d
       SET status = 'discarded',
           discard_reason = format('the job committed through another delivery (message %s) after this letter was written; nothing to replay', m.message_id),
           reviewed_by = 'harness',
           reviewed_at = p_now
      FROM unnest(p_job_ids, p_message_ids) AS m (job_id, message_id)
     WHERE d.job_id = m.job_id AND d.consumer = p_consumer AND d.status = 'pending_review';
    RETURN owned;
END
$$;

COMMENT ON FUNCTION core.finish_jobs(uuid[], text, text[], timestamptz) IS
    'Run last in a batch''s transaction: how many of its fences are this transaction''s own; when all are, clears their ledger and closes letters pending for them.';
