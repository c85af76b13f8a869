-- Every message becomes a true record (issue 22). Additive: an older function version keeps
-- writing letters as before (without a body, which its replays do not need).
--
-- The body exactly as received, beside its JSON: `payload` is jsonb, which cannot hold every
-- body a producer can send (a number outside numeric's range, NUL), normalizes spacing, key
-- order and numbers, and keeps only the last of two equal keys. A replay sends `body`, so what
-- runs again is byte for byte what was received; `payload` stays what operators read and
-- search. Letters are rare: the extra copy costs one TOASTed text per failure.
ALTER TABLE core.dead_letters ADD COLUMN body text;

COMMENT ON COLUMN core.dead_letters.body IS
    'The message body exactly as received (NULL for letters written before 0014); what a replay sends.';

-- A copy that arrives too late to settle through its fence (older, by its own send time, than
-- the fence's TTL less its margin) is recorded as `unsettled`: whether its job committed cannot
-- be known, so no replay may treat it as "never committed". (The kinds' CHECK is rewritten
-- below, with `conflict`: a superset of the old one, so every row already passes it.)

-- A reused job id is a record, not a silence: the fence keeps a digest of what made up the job
-- (SHA-256 of its tenant, type and payload, or of the payload fields its consumer names), and a
-- copy whose digest differs is another job, which becomes a `conflict` letter instead of being
-- acked as a duplicate. 32 bytes (33 with its length) per fence; NULL for fences written
-- before this migration or by an older version, which compare equal to any copy.
ALTER TABLE core.processed_jobs ADD COLUMN payload_digest bytea;

ALTER TABLE core.dead_letters DROP CONSTRAINT dead_letters_error_kind_check;
ALTER TABLE core.dead_letters ADD CONSTRAINT dead_letters_error_kind_check
    CHECK (error_kind IN ('poison', 'permanent', 'exhausted', 'crashed', 'unsettled', 'conflict'));

-- A letter keeps the digest of the job it stands for (NULL where it was not known: a letter
-- written by an older version, by the DLQ ingester, or for a body that is no envelope). When
-- another copy of its job id commits, the letter is closed only if that copy was the same job
-- (core.finish_job_of below); a letter of another job under the id stays pending, and no replay
-- will call it processed.
ALTER TABLE core.dead_letters ADD COLUMN job_digest bytea;

-- core.claim_fence (0007) with the job's digest: 'claimed' when this transaction inserted the
-- fence, 'duplicate' when the job was processed with the same digest (or one unknown),
-- 'conflict' when it was processed with another. Still one round trip: the digest is read only
-- when the insert found the fence. The old function stays for an older version.
CREATE FUNCTION core.claim_job_fence(
    p_job_id     uuid,
    p_consumer   text,
    p_tenant_id  uuid,
    p_now        timestamptz,
    p_expires_at timestamptz,
    p_wait       text,
    p_digest     bytea
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    previous constant text := current_setting('lock_timeout');
    committed bytea;
BEGIN
    PERFORM set_config('lock_timeout', p_wait, true);
    INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at, payload_digest)
    VALUES (p_job_id, p_consumer, p_tenant_id, p_now, p_expires_at, p_digest)
    ON CONFLICT (job_id, consumer) DO NOTHING;
    IF FOUND THEN
        PERFORM set_config('lock_timeout', previous, true);
        RETURN 'claimed';
    END IF;
    PERFORM set_config('lock_timeout', previous, true);
    SELECT payload_digest INTO committed FROM core.processed_jobs
     WHERE job_id = p_job_id AND consumer = p_consumer;
    RETURN CASE WHEN p_digest IS NOT NULL AND committed IS NOT NULL AND committed <> p_digest
                THEN 'conflict' ELSE 'duplicate' END;
END
$$;

COMMENT ON FUNCTION core.claim_job_fence(uuid, text, uuid, timestamptz, timestamptz, text, bytea) IS
    'Inserts the fence of (job, consumer) with its digest, waiting at most p_wait; claimed, duplicate or conflict.';

-- core.claim_fences (0013) with each job's digest kept in its fence.
CREATE FUNCTION core.claim_job_fences(
    p_job_ids    uuid[],
    p_consumer   text,
    p_tenant_ids uuid[],
    p_now        timestamptz,
    p_expires_at timestamptz,
    p_wait       text,
    p_digests    bytea[]
) RETURNS SETOF uuid
LANGUAGE plpgsql AS $$
DECLARE
    previous constant text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', p_wait, true);
    RETURN QUERY
        INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at, payload_digest)
        SELECT j.job_id, p_consumer, j.tenant_id, p_now, p_expires_at, j.digest
        FROM unnest(p_job_ids, p_tenant_ids, p_digests) AS j (job_id, tenant_id, digest)
        ORDER BY j.job_id
        ON CONFLICT (job_id, consumer) DO NOTHING
        RETURNING processed_jobs.job_id;
    PERFORM set_config('lock_timeout', previous, true);
END
$$;

COMMENT ON FUNCTION core.claim_job_fences(uuid[], text, uuid[], timestamptz, timestamptz, text, bytea[]) IS
    'Inserts the fences of a batch with their digests in job id order, waiting at most p_wait; returns the jobs inserted.';

-- core.finish_job (0008) and core.finish_jobs (0013) with the committing jobs' digests: letters
-- pending for a job are closed only when they stand for the same job (an equal digest, or none
-- known); the letter of another job under a reused id stays pending (it never ran). Their letter
-- close waits at most 2 s on a letter row another session holds (see 0015). The old functions
-- stay for an older version.
CREATE FUNCTION core.finish_job_of(p_job_id uuid, p_consumer text, p_message_id text, p_now timestamptz, p_digest bytea)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM core.processed_jobs
                   WHERE job_id = p_job_id AND consumer = p_consumer
                     AND xmin::text::bigint = (txid_current() % 4294967296)) THEN
        RETURN false;
    END IF;
    DELETE FROM core.job_executions WHERE job_id = p_job_id AND consumer = p_consumer;
    UPDATE core.dead_letters
       SET status = 'discarded',
           discard_reason = format('the job committed through another delivery (message %s) after this letter was written; nothing to replay', p_message_id),
           reviewed_by = 'harness',
           reviewed_at = p_now
     WHERE job_id = p_job_id AND consumer = p_consumer AND status = 'pending_review'
       AND (job_digest IS NULL OR p_digest IS NULL OR job_digest = p_digest);
    RETURN true;
END
$$;

COMMENT ON FUNCTION core.finish_job_of(uuid, text, text, timestamptz, bytea) IS
    'core.finish_job, closing only the pending letters of the same job (equal digest, or none known).';

CREATE FUNCTION core.finish_jobs_of(p_job_ids uuid[], p_consumer text, p_now timestamptz, p_digests bytea[])
RETURNS integer
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
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
    UPDATE core.dead_letters AS l
       SET status = 'discarded',
           discard_reason = 'the job committed through another delivery (in a batch) after this letter was written; nothing to replay',
           reviewed_by = 'harness',
           reviewed_at = p_now
      FROM unnest(p_job_ids, p_digests) AS j (job_id, digest)
     WHERE l.job_id = j.job_id AND l.consumer = p_consumer AND l.status = 'pending_review'
       AND (l.job_digest IS NULL OR j.digest IS NULL OR l.job_digest = j.digest);
    RETURN owned;
END
$$;

COMMENT ON FUNCTION core.finish_jobs_of(uuid[], text, timestamptz, bytea[]) IS
    'core.finish_jobs, closing only the pending letters of the same jobs (equal digest, or none known).';
