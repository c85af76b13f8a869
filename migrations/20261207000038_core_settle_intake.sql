-- A round of the letters' intake settled in one statement (issue 36): the settle lock, the
-- consumer's oldest rows, their letters (core.record_letters, each through its job's fence) and
-- the rows' delete, in the caller's one round trip and one commit. A round was eight round trips
-- (BEGIN, the lock, the rows read to the client, a savepoint, the call with every body sent back,
-- its release, the delete, COMMIT): at 1 ms RTT a batch's poison took longer beside its jobs than
-- the jobs' commit group, and on loopback the bodies crossed the wire twice.
--
-- What a round takes is what shared/src/dead_letter/intake.rs took: at most p_rows rows, oldest
-- first, of at most p_bytes of bodies (always the first), not set aside as refused, and of them
-- the leading run that digests over the first row's fields (one call digests over one set). A
-- row's values were bounded as it was received, as a letter bounds them; its payload is the body
-- once (0032), or the body as a JSON string where the body held a NUL (0037). A letter that
-- finds its job committed under another digest says so: p_conflict, then the row's own error cut
-- to p_own_bytes bytes at a character boundary (shared::dead_letter's conflict_error).
--
-- Each statement here takes its snapshot after the lock: the rows read are those no settler
-- before this one settled. If another settler holds the lock, the answer is one row, busy. If
-- the call fails, the statement fails with it (nothing is settled): the caller settles the rows
-- one by one instead, on the same connection (where the failed statement's lock is released
-- before anything else runs), and its later rounds pass by (p_skip) the rows it left.

-- The longest prefix of s of at most n bytes, cut at a character boundary (shared::ids::truncate).
CREATE FUNCTION core.cut_to_bytes(s text, n integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    k integer;
BEGIN
    IF octet_length(s) <= n THEN
        RETURN s;
    END IF;
    k := least(char_length(s), n);
    -- Each step drops at least a quarter of the excess in characters (a character is 1 to 4
    -- bytes); then characters come back while they fit.
    WHILE octet_length(left(s, k)) > n LOOP
        k := k - greatest(1, ceil((octet_length(left(s, k)) - n) / 4.0)::integer);
    END LOOP;
    WHILE k < char_length(s) AND octet_length(left(s, k + 1)) <= n LOOP
        k := k + 1;
    END LOOP;
    RETURN left(s, k);
END
$$;

CREATE FUNCTION core.settle_intake(
    p_consumer  text,
    p_now       timestamptz,
    p_wait      text,
    p_rows      integer,
    p_bytes     bigint,
    p_conflict  text,
    p_own_bytes integer,
    -- Rows this settler's fall back left (a claim waited out): passed by, for a later settler.
    p_skip      bigint[]
) RETURNS TABLE (seq bigint, verdict text, letter_id uuid, fresh boolean, busy boolean)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    seqs bigint[];
    fields text[];
    job_ids uuid[]; tenant_ids uuid[]; queues text[]; message_ids text[]; payloads jsonb[];
    bodies text[]; attempts integer[]; kinds text[]; errors text[]; conflict_errors text[];
    correlation_ids text[]; replay_ofs uuid[]; digests bytea[]; message_groups text[];
    traces text[];
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('core.letter_intake:' || p_consumer, 0)) THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::uuid, NULL::boolean, true;
        RETURN;
    END IF;
    SELECT array_agg(r.seq ORDER BY r.seq),
           array_agg(r.job_id ORDER BY r.seq), array_agg(r.tenant_id ORDER BY r.seq),
           array_agg(r.queue ORDER BY r.seq), array_agg(r.message_id ORDER BY r.seq),
           array_agg(CASE WHEN r.nul_replaced THEN to_jsonb(r.body) END ORDER BY r.seq),
           array_agg(r.body ORDER BY r.seq), array_agg(r.attempts ORDER BY r.seq),
           array_agg(r.error_kind ORDER BY r.seq), array_agg(r.last_error ORDER BY r.seq),
           array_agg(CASE WHEN r.job_digest IS NOT NULL
                          THEN p_conflict || '; this job''s own failure: '
                               || core.cut_to_bytes(r.last_error, p_own_bytes) END ORDER BY r.seq),
           array_agg(r.correlation_id ORDER BY r.seq), array_agg(r.replay_of ORDER BY r.seq),
           array_agg(r.job_digest ORDER BY r.seq), array_agg(r.message_group ORDER BY r.seq),
           array_agg(r.trace_parent ORDER BY r.seq)
      INTO seqs, job_ids, tenant_ids, queues, message_ids, payloads, bodies, attempts,
           kinds, errors, conflict_errors, correlation_ids, replay_ofs, digests, message_groups,
           traces
      FROM (SELECT w.*, count(*) FILTER (WHERE w.digest_fields IS DISTINCT FROM w.first_fields)
                          OVER (ORDER BY w.seq) AS others
              FROM (SELECT i.*, sum(octet_length(i.body)) OVER (ORDER BY i.seq) AS upto,
                           first_value(i.digest_fields) OVER (ORDER BY i.seq) AS first_fields
                      FROM (SELECT * FROM core.letter_intake li
                             WHERE li.consumer = p_consumer AND li.refused IS NULL
                               AND NOT (li.seq = ANY (p_skip))
                             ORDER BY li.seq LIMIT p_rows) i) w
             WHERE w.upto - octet_length(w.body) < p_bytes) r
     WHERE r.others = 0;
    IF seqs IS NULL THEN
        RETURN;
    END IF;
    -- The fields the round's rows digest over: the first row's (array_agg of arrays would
    -- stack them into one array of two dimensions).
    SELECT li.digest_fields INTO fields FROM core.letter_intake li
     WHERE li.consumer = p_consumer AND li.seq = seqs[1];
    RETURN QUERY
        SELECT seqs[s.ord], s.verdict, s.letter_id, s.fresh, false
          FROM core.record_letters(p_consumer, p_now, p_wait, fields, true, job_ids, tenant_ids,
                                   queues, message_ids, payloads, bodies, attempts, kinds, errors,
                                   conflict_errors, correlation_ids, replay_ofs, digests,
                                   message_groups, traces) AS s
         ORDER BY s.ord;
    DELETE FROM core.letter_intake li WHERE li.consumer = p_consumer AND li.seq = ANY (seqs);
END
$$;

COMMENT ON FUNCTION core.settle_intake(text, timestamptz, text, integer, bigint, text, integer, bigint[]) IS
    'One round of a consumer''s letters'' intake settled into letters, in one statement (issue 36).';
