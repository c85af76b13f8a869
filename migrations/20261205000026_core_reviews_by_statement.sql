-- A review statement leaves its groups' pending counts once per group, not once per letter
-- (issue 36). A bulk chunk reviews 1,000 letters of one group in one statement; counted row by
-- row, each letter updated the group's tally stripe and summed the stripes again, so a chunk
-- piled up 1,000 row versions of one stripe that every later sum walked. Counted by statement,
-- a chunk is one stripe update and one sum per group it touches. What a review means is
-- unchanged: reviews of one group take turns, and the review that leaves none pending resolves
-- the group (see 0023). Additive in effect: the function versions before it write the same
-- statements.

CREATE FUNCTION core.dead_letters_leave_pending_by_statement() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    left_group record;
BEGIN
    -- Groups in id order, so two statements reviewing the same groups take their turns in the
    -- same order and never wait on each other in a circle.
    FOR left_group IN
        SELECT n.group_id, count(*) AS letters, max(n.reviewed_at) AS reviewed_at
          FROM reviewed_new n JOIN reviewed_old o ON o.id = n.id
         WHERE o.status = 'pending_review' AND n.status <> 'pending_review' AND n.group_id IS NOT NULL
         GROUP BY n.group_id
         ORDER BY n.group_id
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended('core.dead_letter_groups:review:' || left_group.group_id, 0));
        PERFORM core.dead_letter_group_count(left_group.group_id, 0, -left_group.letters, NULL, NULL);
        CONTINUE WHEN (SELECT sum(pending) FROM core.dead_letter_group_tallies
                        WHERE group_id = left_group.group_id) > 0;
        -- None pending that this review sees: wait for the letters joining right now, turn away
        -- the ones that come after, and count again (a new statement sees what committed).
        PERFORM 1 FROM core.dead_letter_groups WHERE id = left_group.group_id FOR UPDATE;
        IF (SELECT sum(pending) FROM core.dead_letter_group_tallies WHERE group_id = left_group.group_id) = 0 THEN
            UPDATE core.dead_letter_groups
               SET resolved_at = left_group.reviewed_at, next_delivery_at = '-infinity'
             WHERE id = left_group.group_id AND resolved_at IS NULL;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

DROP TRIGGER dead_letters_reviewed ON core.dead_letters;
DROP FUNCTION core.dead_letters_leave_pending();

-- No column list: PostgreSQL takes transition tables only on a trigger without one. An update
-- that reviews nothing joins to no row above.
CREATE TRIGGER dead_letters_reviewed
    AFTER UPDATE ON core.dead_letters
    REFERENCING OLD TABLE AS reviewed_old NEW TABLE AS reviewed_new
    FOR EACH STATEMENT EXECUTE FUNCTION core.dead_letters_leave_pending_by_statement();
