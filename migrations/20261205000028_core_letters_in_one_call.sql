-- A batch's letters in one round trip (issue 36). Batch mode wrote a batch's poison in one
-- transaction, but a statement at a time: per letter a placeholder claim, the insert (whose
-- trigger found the group and counted the letter), the claim's removal.
--
-- Now one call writes a batch's letters (batch mode's poison), each settled as before: its job's fence claimed
-- in job id order (letters without one first, so two calls that share jobs claim them in one
-- order and never deadlock) as a placeholder (core.claim_job_fence: waiting at most p_wait for a
-- copy inside its transaction, a verdict on a fence already there); the letter, or the one its
-- message already has; the claim's removal, and the job's execution ledger with it when this new
-- letter ends the job's budget. With p_settle false, or without a job id, a letter is written
-- without a claim. A call's letters join their failure groups once per group, not once per
-- letter: the group found (or opened) once and counted once, by the call rather than by the
-- insert trigger, which now joins only letters written without a group (written by anything
-- else). One statement: called alone it is its own transaction, and anything that fails rolls
-- every letter of the call back (the client then writes each alone, as received where
-- PostgreSQL refused its content). A letter alone is still written by the statements: one call
-- for one letter cost the server 1.5 x as much (pgbench, c = 40: 1,180 against 1,770 a second),
-- ten letters in one call a fifth as much per letter.
--
-- Additive: function versions before it keep writing letters their way (the trigger groups
-- them), which settles the same.

CREATE FUNCTION core.record_letters(
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
    written integer[];
    inserted uuid[];
    claim text;
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
        claim := core.claim_job_fence(p_job_ids[i], p_consumer, coalesce(p_tenant_ids[i], nil),
                                      p_now, p_now + interval '60 seconds', p_wait, p_digests[i]);
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
    -- under a lock per message, as the insert trigger finds it (0009).
    PERFORM pg_advisory_xact_lock(hashtextextended('core.dead_letters:' || p_consumer || ':' || m, 0))
       FROM (SELECT DISTINCT u.m FROM unnest(p_message_ids) WITH ORDINALITY AS u (m, o)
              WHERE verdicts[u.o] <> 'already_processed' ORDER BY u.m) AS s;
    SELECT coalesce(array_agg(u.o::integer), '{}') INTO written
      FROM unnest(p_message_ids) WITH ORDINALITY AS u (m, o)
     WHERE verdicts[u.o] <> 'already_processed'
       AND EXISTS (SELECT 1 FROM core.dead_letters d WHERE d.consumer = p_consumer AND d.message_id = u.m);
    FOR i IN 1..n LOOP
        IF verdicts[i] <> 'already_processed' AND NOT i = ANY (written) THEN
            ids[i] := gen_random_uuid();
            prints[i] := core.error_fingerprint(kinds[i], errors[i]);
        END IF;
    END LOOP;

    -- 3. Each failure group once per call, not once per letter: the open group of each
    -- (queue, kind, fingerprint) is found FOR KEY SHARE (as the insert trigger finds it, 0023:
    -- the review resolving it waits for this call), or opened with the first of its letters as
    -- its sample; in one order, so two calls opening groups never deadlock.
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

    -- 4. The letters, in one statement, each with its group (so the insert trigger leaves them
    -- be); replay_of comes from a message attribute any producer can set: it links only to a
    -- letter of the same job, so a stray id can never make a letter unwritable.
    WITH made AS (
        INSERT INTO core.dead_letters AS d (id, job_id, tenant_id, consumer, queue, message_id, payload,
            body, attempts, error_kind, last_error, correlation_id, replay_of, created_at,
            job_digest, message_group, digest_fields, trace_parent, group_id)
        SELECT ids[o], p_job_ids[o], p_tenant_ids[o], p_consumer, p_queues[o], p_message_ids[o],
               p_payloads[o], p_bodies[o], p_attempts[o], kinds[o], errors[o], p_correlation_ids[o],
               (SELECT r.id FROM core.dead_letters r
                 WHERE r.id = p_replay_ofs[o] AND r.job_id IS NOT DISTINCT FROM p_job_ids[o]),
               p_now, p_digests[o], p_message_groups[o],
               CASE WHEN p_digests[o] IS NOT NULL THEN p_digest_fields END, p_traces[o], groups[o]
          FROM generate_subscripts(p_message_ids, 1) AS o
         WHERE ids[o] IS NOT NULL
         ORDER BY o
        ON CONFLICT ON CONSTRAINT dead_letters_one_per_message DO NOTHING
        RETURNING d.id
    )
    SELECT coalesce(array_agg(made.id), '{}') INTO inserted FROM made;

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

COMMENT ON FUNCTION core.record_letters(text, timestamptz, text, text[], boolean, uuid[], uuid[],
    text[], text[], jsonb[], text[], integer[], text[], text[], text[], text[], uuid[], bytea[],
    text[], text[]) IS
    'Writes letters, each settled through its job''s fence unless told not to, in one call: (ord, recorded|conflict|already_processed, letter, new).';

-- The insert trigger (0009, 0023) joins and counts a letter written by anything else (the
-- withdrawn replay's copy, versions before this one); a letter written above has its group.
DROP TRIGGER dead_letters_group ON core.dead_letters;
CREATE TRIGGER dead_letters_group
    BEFORE INSERT ON core.dead_letters
    FOR EACH ROW
    WHEN (NEW.group_id IS NULL)
    EXECUTE FUNCTION core.dead_letters_join_group();
