-- The job's transaction in three round trips (issue 24): the claim opens it and the check
-- closes it, each sent in one simple query with the BEGIN or the COMMIT it goes with:
--
--   SELECT core.open_job(...); BEGIN       -- the claim, then BEGIN makes its implicit block
--                                          -- the job's transaction (the fence is in it)
--   <the consumer's work>
--   SELECT core.close_job(...); COMMIT     -- the check; COMMIT runs only when it passed
--
-- A statement that fails skips the rest of its query string (PostgreSQL's simple query
-- protocol), so these functions raise instead of answering: a job that is not to run (a
-- duplicate, another job under its id, a contended fence) fails the claim before BEGIN, which
-- leaves no transaction open (its implicit block rolls back: one round trip in all), and a
-- transaction that is not whole fails the check before COMMIT. The SQLSTATEs are the harness's
-- own (class JF), read by shared::fence.

CREATE FUNCTION core.open_job(
    p_job_id     uuid,
    p_consumer   text,
    p_tenant_id  uuid,
    p_now        timestamptz,
    p_expires_at timestamptz,
    p_wait       text,
    p_digest     bytea
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    claim constant text := core.claim_job_fence(p_job_id, p_consumer, p_tenant_id, p_now, p_expires_at, p_wait, p_digest);
BEGIN
    IF claim = 'duplicate' THEN
        RAISE EXCEPTION 'job % is already processed by %', p_job_id, p_consumer USING ERRCODE = 'JF001';
    ELSIF claim = 'conflict' THEN
        RAISE EXCEPTION 'job % was processed by % as another job (another digest)', p_job_id, p_consumer
            USING ERRCODE = 'JF002';
    END IF;
END
$$;

COMMENT ON FUNCTION core.open_job(uuid, text, uuid, timestamptz, timestamptz, text, bytea) IS
    'core.claim_job_fence that raises unless claimed: JF001 duplicate, JF002 conflict (55P03 when contended). Sent as "SELECT core.open_job(...); BEGIN".';

CREATE FUNCTION core.close_job(p_job_id uuid, p_consumer text, p_message_id text, p_now timestamptz, p_digest bytea)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT core.finish_job_of(p_job_id, p_consumer, p_message_id, p_now, p_digest) THEN
        RAISE EXCEPTION 'the fence of job % is not this transaction''s own: the work committed or rolled back the harness''s transaction itself', p_job_id
            USING ERRCODE = 'JF003';
    END IF;
END
$$;

COMMENT ON FUNCTION core.close_job(uuid, text, text, timestamptz, bytea) IS
    'core.finish_job_of that raises JF003 instead of answering false (25P02 on an aborted transaction). Sent as "SELECT core.close_job(...); COMMIT".';
