-- Claiming a fence in one round trip. The claim must wait at most a bounded time for a
-- concurrent copy of the same job (which holds the row's lock until it commits or rolls back),
-- while the consumer's work after it waits as long as it needs. Done from the client that took
-- three statements (set lock_timeout, insert, restore); here it is one call, so the harness's
-- transaction is BEGIN, claim, work, COMMIT: the same round trips as the bare SQL.
--
-- Returns true when this transaction inserted the fence (do the work), false when the job was
-- already processed (a duplicate). A wait longer than p_wait raises lock_not_available (55P03),
-- and the caller's transaction is then aborted as with any error; the local setting goes with it.
CREATE FUNCTION core.claim_fence(
    p_job_id     uuid,
    p_consumer   text,
    p_tenant_id  uuid,
    p_now        timestamptz,
    p_expires_at timestamptz,
    p_wait       text
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    previous constant text := current_setting('lock_timeout');
    inserted boolean;
BEGIN
    PERFORM set_config('lock_timeout', p_wait, true);
    INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
    VALUES (p_job_id, p_consumer, p_tenant_id, p_now, p_expires_at)
    ON CONFLICT (job_id, consumer) DO NOTHING;
    inserted := FOUND;
    PERFORM set_config('lock_timeout', previous, true);
    RETURN inserted;
END
$$;

COMMENT ON FUNCTION core.claim_fence(uuid, text, uuid, timestamptz, timestamptz, text) IS
    'Inserts the fence of (job, consumer) waiting at most p_wait for a concurrent copy; true if inserted.';
