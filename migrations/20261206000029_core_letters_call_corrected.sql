-- core.record_letters (0028) corrected, after an outside review and an attack on batch mode's
-- poison in one call (issue 36). 0028 is left as it landed (a migration is never changed once
-- applied: the migrate function refuses a changed checksum); its function is replaced here.
--
-- 1. A message's later copy in one call is answered by its first copy's letter: a copy opened a
--    group whose sample was never written (a group of 0 letters).
-- 2. A call locks the groups already open in id order first, the order a review statement takes
--    them in: in key order a call and a review deadlocked (40P01).
-- 3. A message's letter is found by a probe per message: one statement over the call's messages
--    was planned (generically, while the table was small) to hash all of the consumer's letters
--    on every call (perf: 43 % of PostgreSQL's time in an all-poison storm).
-- 4. replay_of links only to a letter of the same, non-null job: two letters without a job (a
--    producer's stray attribute) were linked.
-- 5. Every claim of a call waits within one p_wait in all: each waited p_wait, so ten letters
--    whose jobs were each held by a copy in flight could wait ten times the lock timeout, past
--    the invocation's budget.
--
-- 6. The insert trigger joined only letters written without a group, so any other writer that
--    supplied a group_id (a wrong one, or a group of another failure) went uncounted. Now it
--    keeps a letter's group only inside this function's insert, and joins every other letter
--    itself, whatever group_id it came with.
--
-- Additive: the signature and the answers are 0028's.

CREATE OR REPLACE FUNCTION core.record_letters(
    p_consumer        text,
    p_now             timestamptz,
    p_wait            text,
    -- The payload fields a digest covers (NULL: the whole payload), kept with letters that
    -- have a digest. One consumer writes a call's letters, so they share it.
    p_digest_fields   text[],
    -- false: write the letters without a claim (an `unsettled` copy's, whose fence cannot say).
    p_settle          boolean,
    p_job_ids         uuid[],
    p_tenant_ids      uuid[],
    p_queues          text[],
    p_message_ids     text[],
    p_payloads        jsonb[],
    p_bodies          text[],
    p_attempts        integer[],
    p_kinds           text[],
    p_errors          text[],
    -- The letter's error should its claim find another job under its id (a `conflict`).
    p_conflict_errors text[],
    p_correlation_ids text[],
    p_replay_ofs      uuid[],
    p_digests         bytea[],
    p_message_groups  text[],
    p_traces          text[]
) RETURNS TABLE (ord integer, verdict text, letter_id uuid, fresh boolean)
LANGUAGE plpgsql
-- Its statements are planned once per connection: planned anew for each call's arrays (the
-- default for a statement whose parameters' values change its estimates), they were a quarter of
-- a call's time, for the same plans.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    nil constant uuid := '00000000-0000-0000-0000-000000000000';
    n constant integer := coalesce(cardinality(p_message_ids), 0);
    verdicts text[] := array_fill(NULL::text, ARRAY[n]);
    kinds text[] := p_kinds;
    errors text[] := p_errors;
    prints text[] := array_fill(NULL::text, ARRAY[n]);
    ids uuid[] := array_fill(NULL::uuid, ARRAY[n]);
    groups bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    claimed uuid[] := '{}';
    seen text[] := '{}';
    inserted uuid[];
    claim text;
    -- Every claim of the call waits within one p_wait, not p_wait each.
    deadline constant timestamptz := clock_timestamp() + p_wait::interval;
    i integer;
    g record;
    joined bigint;
BEGIN
    IF cardinality(p_job_ids) IS DISTINCT FROM n THEN
        RAISE EXCEPTION 'core.record_letters takes one value of each column per letter';
    END IF;
    -- 1. Each job's fence, in job id order: claimed (a placeholder: it exists only inside this
    -- statement, so a copy of the job that claims meanwhile waits, then finds no fence), another
    -- job's (a conflict letter), or the job's own (committed: no letter). A job's second letter
    -- in the call is settled by its first claim, as if the first had been written alone.
    FOR i IN
        SELECT j.i FROM unnest(p_job_ids) WITH ORDINALITY AS j (job_id, i)
         ORDER BY j.job_id NULLS FIRST, j.i
    LOOP
        IF NOT p_settle OR p_job_ids[i] IS NULL OR p_job_ids[i] = ANY (claimed) THEN
            verdicts[i] := 'recorded';
            CONTINUE;
        END IF;
        -- What is left of the call's wait (at least a millisecond: a lock_timeout of 0 waits
        -- for ever).
        claim := core.claim_job_fence(p_job_ids[i], p_consumer, coalesce(p_tenant_ids[i], nil),
                                      p_now, p_now + interval '60 seconds',
                                      greatest(ceil(extract(epoch FROM deadline - clock_timestamp()) * 1000), 1)::bigint || 'ms',
                                      p_digests[i]);
        verdicts[i] := CASE claim WHEN 'claimed' THEN 'recorded' WHEN 'conflict' THEN 'conflict'
                                  ELSE 'already_processed' END;
        IF claim = 'claimed' THEN
            claimed := claimed || p_job_ids[i];
        ELSIF claim = 'conflict' THEN
            kinds[i] := 'conflict';
            errors[i] := p_conflict_errors[i];
        END IF;
    END LOOP;

    -- 2. A message that has its letter already (a redelivery after a lost ack) keeps it: found
    -- under a lock per message, as the insert trigger finds it (0009). So does a message's
    -- later copy in this call: its first copy's letter is its letter, and only a letter that
    -- is written opens or counts a group (else a group could open with a sample never written).
    -- A probe per message on the one-per-message key, not one statement over the call's
    -- messages: planned generically while the table was small (a new deployment, an emptied
    -- one), such a statement hashed the consumer's every letter on every call, whatever the
    -- table grew to.
    PERFORM pg_advisory_xact_lock(hashtextextended('core.dead_letters:' || p_consumer || ':' || m, 0))
       FROM (SELECT DISTINCT u.m FROM unnest(p_message_ids) WITH ORDINALITY AS u (m, o)
              WHERE verdicts[u.o] <> 'already_processed' ORDER BY u.m) AS s;
    FOR i IN 1..n LOOP
        CONTINUE WHEN verdicts[i] = 'already_processed' OR p_message_ids[i] = ANY (seen);
        seen := seen || p_message_ids[i];
        PERFORM 1 FROM core.dead_letters d
          WHERE d.consumer = p_consumer AND d.message_id = p_message_ids[i];
        IF NOT FOUND THEN
            ids[i] := gen_random_uuid();
            prints[i] := core.error_fingerprint(kinds[i], errors[i]);
        END IF;
    END LOOP;

    -- 3. Each failure group once per call, not once per letter: the open group of each
    -- (queue, kind, fingerprint) is found FOR KEY SHARE (as the insert trigger finds it, 0023:
    -- the review resolving it waits for this call), or opened with the first of its letters as
    -- its sample; in one order, so two calls opening groups never deadlock. The groups already
    -- open are locked first, in id order: the order a review statement (0026) and a commit
    -- closing its job's letters take them in, so a call never holds one while waiting for
    -- another a review holds (in key order it could).
    PERFORM 1 FROM core.dead_letter_groups dg
      WHERE dg.consumer = p_consumer AND dg.resolved_at IS NULL
        AND (dg.queue, dg.error_kind, dg.fingerprint) IN
            (SELECT p_queues[o], kinds[o], prints[o] FROM generate_subscripts(p_message_ids, 1) AS o
              WHERE ids[o] IS NOT NULL)
      ORDER BY dg.id
      FOR KEY SHARE OF dg;
    FOR g IN
        SELECT DISTINCT ON (p_queues[o], kinds[o], prints[o]) o
          FROM generate_subscripts(p_message_ids, 1) AS o
         WHERE ids[o] IS NOT NULL
         ORDER BY p_queues[o], kinds[o], prints[o], o
    LOOP
        i := g.o;
        LOOP
            SELECT dg.id INTO joined FROM core.dead_letter_groups dg
             WHERE dg.consumer = p_consumer AND dg.queue = p_queues[i] AND dg.error_kind = kinds[i]
               AND dg.fingerprint = prints[i] AND dg.resolved_at IS NULL
             FOR KEY SHARE;
            EXIT WHEN FOUND;
            INSERT INTO core.dead_letter_groups AS dg (consumer, queue, error_kind, fingerprint, pattern,
                sample_error, sample_letter_id, sample_job_id, sample_correlation_id, first_letter_at)
            VALUES (p_consumer, p_queues[i], kinds[i], prints[i], core.masked_error(errors[i]),
                errors[i], ids[i], p_job_ids[i], p_correlation_ids[i], p_now)
            ON CONFLICT (consumer, queue, error_kind, fingerprint) WHERE resolved_at IS NULL DO NOTHING
            RETURNING dg.id INTO joined;
            EXIT WHEN joined IS NOT NULL;
        END LOOP;
        FOR o IN 1..n LOOP
            IF ids[o] IS NOT NULL AND p_queues[o] = p_queues[i] AND kinds[o] = kinds[i]
               AND prints[o] = prints[i] THEN
                groups[o] := joined;
            END IF;
        END LOOP;
    END LOOP;

    -- 4. The letters, in one statement, each with its group, which the insert trigger keeps for
    -- this statement only (core.letters_grouped: set for it, cleared after); replay_of comes from a message attribute any producer can set: it links only to a
    -- letter of the same job (a letter without one links to none: it cannot be replayed), so a
    -- stray id can never make a letter unwritable.
    PERFORM set_config('core.letters_grouped', 'by the call', true);
    WITH made AS (
        INSERT INTO core.dead_letters AS d (id, job_id, tenant_id, consumer, queue, message_id, payload,
            body, attempts, error_kind, last_error, correlation_id, replay_of, created_at,
            job_digest, message_group, digest_fields, trace_parent, group_id)
        SELECT ids[o], p_job_ids[o], p_tenant_ids[o], p_consumer, p_queues[o], p_message_ids[o],
               p_payloads[o], p_bodies[o], p_attempts[o], kinds[o], errors[o], p_correlation_ids[o],
               (SELECT r.id FROM core.dead_letters r
                 WHERE r.id = p_replay_ofs[o] AND r.job_id = p_job_ids[o]),
               p_now, p_digests[o], p_message_groups[o],
               CASE WHEN p_digests[o] IS NOT NULL THEN p_digest_fields END, p_traces[o], groups[o]
          FROM generate_subscripts(p_message_ids, 1) AS o
         WHERE ids[o] IS NOT NULL
         ORDER BY o
        ON CONFLICT ON CONSTRAINT dead_letters_one_per_message DO NOTHING
        RETURNING d.id
    )
    SELECT coalesce(array_agg(made.id), '{}') INTO inserted FROM made;
    PERFORM set_config('core.letters_grouped', '', true);

    -- 5. Each group counts its new letters once, in one of its tally stripes (0023).
    FOR g IN
        SELECT groups[o] AS group_id, count(*) AS letters,
               (array_agg(errors[o] ORDER BY o DESC))[1] AS error
          FROM generate_subscripts(p_message_ids, 1) AS o
         WHERE ids[o] = ANY (inserted)
         GROUP BY groups[o]
         ORDER BY groups[o]
    LOOP
        PERFORM core.dead_letter_group_count(g.group_id, g.letters, g.letters, p_now, g.error);
    END LOOP;

    -- 6. The claims go; a job's execution ledger goes with its claim only when a new letter
    -- ends the job's budget: a letter of a body that ran. A poison copy never ran, and a
    -- redelivery acked by the letter it has changes nothing: either would wipe the count of a
    -- copy still between its attempts.
    IF cardinality(claimed) > 0 THEN
        DELETE FROM core.processed_jobs f WHERE f.consumer = p_consumer AND f.job_id = ANY (claimed);
        DELETE FROM core.job_executions e
         WHERE e.consumer = p_consumer
           AND e.job_id IN (SELECT p_job_ids[o] FROM generate_subscripts(p_message_ids, 1) AS o
                             WHERE ids[o] = ANY (inserted) AND kinds[o] <> 'poison'
                               AND p_job_ids[o] = ANY (claimed));
    END IF;

    -- 7. The answers: a letter written now, or the one its message had.
    FOR i IN 1..n LOOP
        ord := i;
        verdict := verdicts[i];
        fresh := ids[i] IS NOT NULL AND ids[i] = ANY (inserted);
        letter_id := NULL;
        IF fresh THEN
            letter_id := ids[i];
        ELSIF verdict <> 'already_processed' THEN
            SELECT d.id INTO STRICT letter_id FROM core.dead_letters d
             WHERE d.consumer = p_consumer AND d.message_id = p_message_ids[i];
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;

-- 6. Every letter is joined by the trigger but those this function's insert grouped.
DROP TRIGGER dead_letters_group ON core.dead_letters;
CREATE TRIGGER dead_letters_group
    BEFORE INSERT ON core.dead_letters
    FOR EACH ROW
    WHEN (NEW.group_id IS NULL
          OR current_setting('core.letters_grouped', true) IS DISTINCT FROM 'by the call')
    EXECUTE FUNCTION core.dead_letters_join_group();
