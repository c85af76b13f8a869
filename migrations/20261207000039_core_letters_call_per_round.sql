-- core.record_letters (0029) made cheaper per letter and per call (issue 36: a storm's letters
-- at the rate of the jobs they replace). 0029 is left as it landed; its function is replaced
-- here, with its signature, its answers and its locks in the same order.
--
-- Measured on 0029 (a settle round of 500 poison letters of one group, 2,500 letters, PostgreSQL
-- alone, track_functions = all): 140 us a letter, of which core.masked_error 26 us (the same
-- error masked once per letter) and core.claim_job_fence 19 us (a function call, two
-- set_config calls and an insert per letter).
--
-- 1. A call's error fingerprints are computed once per run of letters with the same kind and
--    error (core.error_fingerprint is immutable: the same text gives the same print), not once
--    a letter: a storm's letters share one error.
-- 2. A call's fences are claimed in one statement, in job id order as before, when none of them
--    waits: a fence that another transaction holds uncommitted (a copy of the job in flight)
--    makes the statement give up at once (lock_timeout 1 ms, in a subtransaction), and the call
--    claims them one by one as before, every claim within one p_wait in all. A job's claim
--    answers for its every letter in the call; a job whose fence was committed is answered by
--    core.same_job against each letter's own digest, as core.claim_job_fence answered it.
-- 3. A call's messages are probed for their letters in one statement, each probe still a
--    lookup on the one-per-message key (a lateral LIMIT 1, which is never hashed), not one
--    statement per message; a message's later copy is found by a window, not by a scan of the
--    messages seen so far.
-- 4. Which letters the insert wrote is one hash join of the ids it returned, not a scan of them
--    for each letter in each of three places.
-- 5. core.masked_error (0009) is one SQL expression, the same six replacements in the same
--    order: 113 -> 50 us for a 110-character error. A partner outage's errors differ letter by
--    letter (an order id, a request id), so each is masked: that was most of such a letter's
--    cost. Only the function's language changes: the masks are 0009's, byte for byte
--    (the_masked_error_in_one_expression_masks_as_0009_did).
-- 6. A call of one letter claims its fence as before, without the subtransaction (the settle's
--    one-by-one fall back calls it once per row, each already in a savepoint of its own).

CREATE OR REPLACE FUNCTION core.masked_error(last_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
           regexp_replace(left(last_error, 500),
        -- Quoted values: 'acct-17', "acct-17", `x`.
        '''[^'']*''|"[^"]*"|`[^`]*`', '<q>', 'g'),
        -- UUIDs, and long tokens with digits in them (request ids, hashes).
        '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
        '\m(?=[a-z_]*[0-9])[0-9a-z_]{12,}\M', '<id>', 'gi'),
        -- Statuses and codes keep their number, marked so that the last step leaves it:
        -- "status 503", "HTTP 429", "answered 401", "code 40001", "SQLSTATE 23505".
        '\m(status|http|code|sqlstate|errno|answered|returned|responded)\M([^0-9a-z]{0,3})([0-9][0-9a-z]{2,4})\M',
        '\1\2#\3', 'gi'),
        -- An HTTP status before its reason phrase: "503 Service Unavailable".
        '\m([1-5][0-9][0-9])(\s+[A-Z][a-z]+)', '#\1\2', 'g'),
        -- Any other number, with its unit if it has one: "31 s", "31s", "2.5ms", "1,000", "3 KB".
        '(^|[^#0-9a-z_])[0-9]+([.,][0-9]+)*(\s?(ns|us|ms|s|sec|secs|seconds?|m|min|mins|minutes?|h|hrs?|hours?|d|days?|b|kb|mb|gb|bytes?|x))?\M',
        '\1<n>', 'gi')
$$;

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
    wants boolean[];
    inserted uuid[];
    news boolean[];
    claim text;
    fast boolean := NOT p_settle;
    previous_wait constant text := current_setting('lock_timeout');
    last_kind text;
    last_error text;
    last_print text;
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
    -- In one statement when no fence waits (this function's 2.); one by one when one does.
    IF p_settle AND n > 1 THEN
        BEGIN
            PERFORM set_config('lock_timeout', '1ms', true);
            WITH wanted AS (
                SELECT DISTINCT ON (j.job_id) j.job_id, j.i
                  FROM unnest(p_job_ids) WITH ORDINALITY AS j (job_id, i)
                 WHERE j.job_id IS NOT NULL
                 ORDER BY j.job_id, j.i
            ), made AS (
                INSERT INTO core.processed_jobs AS f (job_id, consumer, tenant_id, processed_at,
                                                      expires_at, payload_digest)
                SELECT w.job_id, p_consumer, coalesce(p_tenant_ids[w.i], nil), p_now,
                       p_now + interval '60 seconds', p_digests[w.i]
                  FROM wanted w
                 ORDER BY w.job_id
                ON CONFLICT (job_id, consumer) DO NOTHING
                RETURNING f.job_id
            )
            SELECT coalesce(array_agg(made.job_id), '{}') INTO claimed FROM made;
            PERFORM set_config('lock_timeout', previous_wait, true);
            fast := true;
        EXCEPTION WHEN lock_not_available THEN
            -- The subtransaction's claims are gone with it; its lock_timeout too.
            claimed := '{}';
        END;
    END IF;
    IF fast THEN
        SELECT array_agg(CASE
                   WHEN NOT p_settle OR j.job_id IS NULL OR j.job_id = ANY (claimed) THEN 'recorded'
                   WHEN core.same_job(j.job_id, p_consumer, p_digests[j.i],
                                      (SELECT f.payload_digest FROM core.processed_jobs f
                                        WHERE f.job_id = j.job_id AND f.consumer = p_consumer))
                       THEN 'already_processed'
                   ELSE 'conflict' END ORDER BY j.i)
          INTO verdicts
          FROM unnest(p_job_ids) WITH ORDINALITY AS j (job_id, i);
        FOR i IN 1..n LOOP
            IF verdicts[i] = 'conflict' THEN
                kinds[i] := 'conflict';
                errors[i] := p_conflict_errors[i];
            END IF;
        END LOOP;
    ELSE
        -- (A call that settles, of one letter or with a fence that waits.)
        FOR i IN
            SELECT j.i FROM unnest(p_job_ids) WITH ORDINALITY AS j (job_id, i)
             ORDER BY j.job_id NULLS FIRST, j.i
        LOOP
            IF p_job_ids[i] IS NULL OR p_job_ids[i] = ANY (claimed) THEN
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
    END IF;

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
    -- (The probes are one statement's, each a nested loop's LIMIT 1: a lateral subquery with a
    -- limit is never hashed.)
    SELECT array_agg(x.first AND p.found IS NULL ORDER BY x.o) INTO wants
      FROM (SELECT u.o, u.m,
                   coalesce(u.o = min(u.o) FILTER (WHERE verdicts[u.o] <> 'already_processed')
                                  OVER (PARTITION BY u.m), false) AS first
              FROM unnest(p_message_ids) WITH ORDINALITY AS u (m, o)) AS x
      LEFT JOIN LATERAL (SELECT 1 AS found FROM core.dead_letters d
                          WHERE x.first AND d.consumer = p_consumer AND d.message_id = x.m
                          LIMIT 1) AS p ON true;
    FOR i IN 1..n LOOP
        IF wants[i] THEN
            ids[i] := gen_random_uuid();
            IF last_print IS NULL OR kinds[i] IS DISTINCT FROM last_kind
               OR errors[i] IS DISTINCT FROM last_error THEN
                last_kind := kinds[i];
                last_error := errors[i];
                last_print := core.error_fingerprint(last_kind, last_error);
            END IF;
            prints[i] := last_print;
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
    -- Which letters were written now: one hash of the written ids, not a scan of them per letter.
    SELECT array_agg(w.id IS NOT NULL ORDER BY o) INTO news
      FROM generate_subscripts(ids, 1) AS o
      LEFT JOIN unnest(inserted) AS w (id) ON w.id = ids[o];
    PERFORM set_config('core.letters_grouped', '', true);

    -- 5. Each group counts its new letters once, in one of its tally stripes (0023).
    FOR g IN
        SELECT groups[o] AS group_id, count(*) AS letters,
               (array_agg(errors[o] ORDER BY o DESC))[1] AS error
          FROM generate_subscripts(p_message_ids, 1) AS o
         WHERE news[o]
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
                             WHERE news[o] AND kinds[o] <> 'poison'
                               AND p_job_ids[o] = ANY (claimed));
    END IF;

    -- 7. The answers: a letter written now, or the one its message had.
    FOR i IN 1..n LOOP
        ord := i;
        verdict := verdicts[i];
        fresh := news[i];
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

