-- Letters are locked in one order platform-wide, newest first (created_at DESC, id DESC): the
-- order a bulk operation's chunk locks its page in (shared/src/dead_letter/bulk.rs), now also
-- the order a commit closes its jobs' pending letters in (issue 36).
--
-- core.close_letters (0040) locked the letters it closes in the order its UPDATE found them:
-- on a real table a bitmap scan of the primary key, the table's physical order, which is
-- oldest first (letters are written as failures arrive). A discard or replay chunk over the
-- same letters locks newest first. So a commit of two jobs with pending letters (a commit group,
-- or one job with two letters) and a chunk over both each took one and waited for the other:
-- "deadlock detected", the commit group rolled back to run its jobs one by one or the chunk's
-- round failed into a backoff, and commits waiting behind either ran out of lock_timeout
-- (outside attack, tests/tests/letter_lock_order_attacks.rs:
-- a_commit_group_and_a_discard_chunk_over_two_letters_both_commit every time, and three races).
--
-- The letters are now locked first, newest first, by a locking read, then closed by the same
-- statement; a letter a review closed meanwhile is re-read under its lock and left as the review
-- left it. The statement trigger still takes their groups' locks in group id order, after all
-- the rows' locks, as a chunk's does. (core.finish_job and core.finish_jobs, 0008 and 0013, are
-- the releases before 0021's; they are left as they landed.)
CREATE OR REPLACE FUNCTION core.close_letters(p_letters uuid[], p_now timestamptz, p_reason text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE 'WITH locked AS (
                 SELECT id FROM core.dead_letters
                  WHERE id = ANY ($1) AND status = ''pending_review''
                  ORDER BY created_at DESC, id DESC
                    FOR UPDATE)
             UPDATE core.dead_letters d
                SET status = ''discarded'', discard_reason = $2, reviewed_by = ''harness'',
                    reviewed_at = $3
               FROM locked
              WHERE d.id = locked.id AND d.status = ''pending_review'''
      USING p_letters, p_reason, p_now;
END
$$;
