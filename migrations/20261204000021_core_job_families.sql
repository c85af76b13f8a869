-- One identity per job, and a job's edits as one family (issue 34). Additive: an older
-- function version keeps writing letters without the new columns, and its commits close the
-- letters they closed before.
--
-- 1. A commit group never holds two claims of one job: core.claim_job_fences refuses an input
-- that names a job twice (JF004) instead of letting ON CONFLICT DO NOTHING drop the second
-- claim silently, which had the caller mark both records of the job processed. The harness
-- never sends one; a caller that does falls back to one job at a time.
CREATE OR REPLACE FUNCTION core.claim_job_fences(
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
    IF (SELECT count(DISTINCT j) FROM unnest(p_job_ids) AS j) <> cardinality(p_job_ids) THEN
        RAISE EXCEPTION 'a commit group names a job twice: each job is claimed by one record'
            USING ERRCODE = 'JF004';
    END IF;
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

-- 2. A job's edits are one family. A letter keeps the payload fields its digest covers
-- (`digest_fields`, NULL for the whole payload), so the API, which does not link the
-- consumer, digests an operator's edit exactly as the harness will digest the edited body when
-- it arrives; the edit's digest is kept with the review (`replay_digest`). Each edited letter
-- is then an edge job_digest -- replay_digest between two bodies of one job, and a job's family
-- is every digest its edges connect, in either direction, a chain of any length.
ALTER TABLE core.dead_letters ADD COLUMN digest_fields text[];
ALTER TABLE core.dead_letters ADD COLUMN replay_digest bytea;

COMMENT ON COLUMN core.dead_letters.digest_fields IS
    'The payload fields job_digest covers, as the consumer named them (NULL: the whole payload).';
COMMENT ON COLUMN core.dead_letters.replay_digest IS
    'The digest of replay_body, as job_digest is taken: the edit and the body it replaced are one job. Written with the review.';

ALTER TABLE core.dead_letters ADD CONSTRAINT dead_letters_replay_digest_of_an_edit
    CHECK (replay_digest IS NULL OR replay_body IS NOT NULL) NOT VALID;
ALTER TABLE core.dead_letters VALIDATE CONSTRAINT dead_letters_replay_digest_of_an_edit;

-- The digests of (p_job_id, p_consumer)'s family that p_digest belongs to, p_digest first.
-- Edited letters are few, and found on dead_letters_edited_job_idx (0019): a job never edited
-- costs one probe of an index that holds only edited letters.
CREATE FUNCTION core.job_family(p_job_id uuid, p_consumer text, p_digest bytea)
RETURNS SETOF bytea
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE edge AS (
        SELECT job_digest AS a, replay_digest AS b FROM core.dead_letters
         WHERE job_id = p_job_id AND consumer = p_consumer AND replay_body IS NOT NULL
           AND job_digest IS NOT NULL AND replay_digest IS NOT NULL
    ), family (digest) AS (
        SELECT p_digest WHERE p_digest IS NOT NULL
        UNION
        SELECT CASE WHEN e.a = f.digest THEN e.b ELSE e.a END
          FROM family f JOIN edge e ON e.a = f.digest OR e.b = f.digest
    )
    SELECT digest FROM family
$$;

COMMENT ON FUNCTION core.job_family(uuid, text, bytea) IS
    'The digests one job has had through its edits (connected by edited letters), p_digest included.';

-- Whether two digests of one job id stand for the same job: equal, or one family. NULL (a
-- digest unknown) is the same job, as the fence has always compared it.
CREATE FUNCTION core.same_job(p_job_id uuid, p_consumer text, p_a bytea, p_b bytea)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_a IS NULL OR p_b IS NULL OR p_a = p_b
        OR p_b IN (SELECT core.job_family(p_job_id, p_consumer, p_a))
$$;

COMMENT ON FUNCTION core.same_job(uuid, text, bytea, bytea) IS
    'Whether digests p_a and p_b of one job id are one job: equal, unknown, or of one family of edits.';

-- 3. A commit closes every pending letter of its job whose body is of the family (0014 closed
-- only an equal digest, so a sibling of an edited letter stayed pending, and its replay was
-- told the job never ran).
CREATE OR REPLACE FUNCTION core.finish_job_of(p_job_id uuid, p_consumer text, p_message_id text, p_now timestamptz, p_digest bytea)
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
       AND core.same_job(p_job_id, p_consumer, p_digest, job_digest);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION core.finish_jobs_of(p_job_ids uuid[], p_consumer text, p_now timestamptz, p_digests bytea[])
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
       AND core.same_job(j.job_id, p_consumer, j.digest, l.job_digest);
    RETURN owned;
END
$$;

-- 4. The append-only guard allows replay_digest with the review: 0022 writes it again.

-- 5. The claim's verdict on a fence already there: 'duplicate' for the same job, as
-- core.same_job says it (its family of edits included: a late copy of a body an operator
-- edited away from, however many edits back, is the job's duplicate), 'conflict' only for
-- another job under the id.
CREATE OR REPLACE FUNCTION core.claim_job_fence(
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
    RETURN CASE WHEN core.same_job(p_job_id, p_consumer, p_digest, committed)
                THEN 'duplicate' ELSE 'conflict' END;
END
$$;
