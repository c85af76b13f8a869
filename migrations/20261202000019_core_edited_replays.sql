-- Edit and replay (issue 25): an operator corrects a letter's body (a field a producer's release
-- misnamed) and replays it under the same job_id, so the fence still allows one effect. The
-- letter keeps what it received (`payload`, `body`: append-only, as ever); the body the replay
-- sent is `replay_body`, written with the review (who: `reviewed_by`; why: `replay_reason`,
-- required for an edit), so the record shows exactly what ran. Additive: a version that does
-- not know the column reads and replays letters as before.
ALTER TABLE core.dead_letters ADD COLUMN replay_body text;

COMMENT ON COLUMN core.dead_letters.replay_body IS
    'The edited envelope an edited replay sent instead of the body received (NULL: a replay sends body as received). Written with the review; never changed after.';

-- An edit is a replay, with its reason: never on a pending or discarded letter, never unexplained.
ALTER TABLE core.dead_letters ADD CONSTRAINT dead_letters_edit_is_an_explained_replay CHECK (
    replay_body IS NULL
    OR (status = 'replayed' AND replay_reason IS NOT NULL AND btrim(replay_reason) <> '')
) NOT VALID;
ALTER TABLE core.dead_letters VALIDATE CONSTRAINT dead_letters_edit_is_an_explained_replay;

-- The harness asks, for a copy of a committed job whose body differs from the fence's: is it the
-- body an operator edited away from? Edited letters are few; the index holds only them.
CREATE INDEX dead_letters_edited_job_idx ON core.dead_letters (job_id, consumer)
    WHERE replay_body IS NOT NULL;

-- The append-only guard again (0009's), the edited body a review column: set with the review,
-- and kept by the queued -> sent step like every other column.
CREATE OR REPLACE FUNCTION core.dead_letters_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    review_columns constant text[] := ARRAY['status', 'discard_reason', 'reviewed_by', 'reviewed_at',
                                            'replay_outcome', 'replay_message_id', 'replay_sent_at',
                                            'replay_reason', 'replay_body'];
    sent_columns constant text[] := ARRAY['replay_outcome', 'replay_message_id', 'replay_sent_at'];
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'core.dead_letters is append-only: % is not allowed', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.status = 'replayed' AND NEW.status = 'replayed'
       AND OLD.replay_outcome = 'queued' AND NEW.replay_outcome = 'sent' THEN
        IF (to_jsonb(NEW) - sent_columns) IS DISTINCT FROM (to_jsonb(OLD) - sent_columns) THEN
            RAISE EXCEPTION 'core.dead_letters: recording a sent replay changes only %', sent_columns
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.status = OLD.status THEN
        RAISE EXCEPTION 'core.dead_letters is append-only: a row changes only by its review (pending_review -> replayed | discarded) or a queued replay being sent'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.status <> 'pending_review' OR NEW.status NOT IN ('replayed', 'discarded') THEN
        RAISE EXCEPTION 'core.dead_letters: status may only move pending_review -> replayed | discarded (was %, asked %)',
            OLD.status, NEW.status
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF (to_jsonb(NEW) - review_columns) IS DISTINCT FROM (to_jsonb(OLD) - review_columns) THEN
        RAISE EXCEPTION 'core.dead_letters: only the review columns (%) may change', review_columns
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
