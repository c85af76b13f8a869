-- A commit closes its jobs' pending letters by a probe per job, whatever the table was like
-- when the statement was planned (issue 36: a storm beside valid jobs).
--
-- core.finish_jobs_of (0021), run by every commit group, closed them with one UPDATE joined to
-- the batch's job ids. Its plan is generic, made once per connection: made while
-- core.dead_letters was empty or small (a new deployment, a quiet consumer before a storm, a
-- table just vacuumed empty), it scanned every pending letter (the partial index of pending
-- letters, in full) and hashed the batch's jobs against them. The connection keeps that plan
-- until the table's statistics change: through a storm's first minutes (until autovacuum
-- analyzes the table), each valid batch beside the storm read every letter the storm had
-- written so far (bench-storm, one record in ten poison: the statement read 2,000-3,000 letters
-- a batch by the end of a 6 s run).
--
-- core.pending_letters_of_jobs finds each job's pending letters through the job index only: its
-- probe names no status (so no partial index of another query can stand in for it) and sits
-- behind OFFSET 0 in a lateral subquery (a nested loop, whatever the estimates). A commit whose
-- jobs have no letter (nearly all of them) runs no UPDATE, nor the statement trigger of one.
-- The letters found are closed by one UPDATE, as 0021 closed them: its statement trigger takes
-- their groups' locks in group id order (an UPDATE per letter took them in letter order, and two
-- commits whose letters crossed two groups deadlocked: an outside attack,
-- commits_whose_letters_share_groups_in_crossed_order_both_commit). It is planned as it runs
-- (EXECUTE, only when there is a letter to close), so it finds them by id however the table has
-- grown; the status is checked again on each row it locks (a letter a review closed meanwhile
-- stays as the review left it).
-- core.finish_job_of (0021) finds its letters the same way: its UPDATE named
-- status = 'pending_review' beside the job, so the same full scan was a plan it could be given.
-- (A PL/pgSQL function called by both cost a job's commit 0.17 ms more: each finisher reads
-- the letters itself.)
CREATE FUNCTION core.pending_letters_of_jobs(p_job_ids uuid[], p_consumer text, p_digests bytea[])
RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT x.id
      FROM unnest(p_job_ids, p_digests) AS j (job_id, digest)
      CROSS JOIN LATERAL (SELECT y.id, y.status, y.job_digest FROM core.dead_letters y
                           WHERE y.job_id = j.job_id AND y.consumer = p_consumer
                          OFFSET 0) AS x
     WHERE x.status = 'pending_review'
       AND core.same_job(j.job_id, p_consumer, j.digest, x.job_digest)
$$;

COMMENT ON FUNCTION core.pending_letters_of_jobs(uuid[], text, bytea[]) IS
    'The pending letters of jobs (of their family: core.same_job), probing the job index per job.';

-- The letters of jobs that committed, closed in one statement planned as it runs.
CREATE FUNCTION core.close_letters(p_letters uuid[], p_now timestamptz, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE 'UPDATE core.dead_letters
                SET status = ''discarded'', discard_reason = $2, reviewed_by = ''harness'',
                    reviewed_at = $3
              WHERE id = ANY ($1) AND status = ''pending_review'''
      USING p_letters, p_reason, p_now;
END
$$;

CREATE OR REPLACE FUNCTION core.finish_job_of(p_job_id uuid, p_consumer text, p_message_id text, p_now timestamptz, p_digest bytea)
RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    letters uuid[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM core.processed_jobs
                   WHERE job_id = p_job_id AND consumer = p_consumer
                     AND xmin::text::bigint = (txid_current() % 4294967296)) THEN
        RETURN false;
    END IF;
    DELETE FROM core.job_executions WHERE job_id = p_job_id AND consumer = p_consumer;
    SELECT array_agg(p.id) INTO letters
      FROM core.pending_letters_of_jobs(ARRAY[p_job_id], p_consumer, ARRAY[p_digest]) AS p (id);
    IF letters IS NOT NULL THEN
        PERFORM core.close_letters(letters, p_now,
            format('the job committed through another delivery (message %s) after this letter was written; nothing to replay', p_message_id));
    END IF;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION core.finish_jobs_of(p_job_ids uuid[], p_consumer text, p_now timestamptz, p_digests bytea[])
RETURNS integer
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    owned integer;
    letters uuid[];
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
    SELECT array_agg(p.id) INTO letters
      FROM core.pending_letters_of_jobs(p_job_ids, p_consumer, p_digests) AS p (id);
    IF letters IS NOT NULL THEN
        PERFORM core.close_letters(letters, p_now,
            'the job committed through another delivery (in a batch) after this letter was written; nothing to replay');
    END IF;
    RETURN owned;
END
$$;
