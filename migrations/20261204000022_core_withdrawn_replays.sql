-- Nothing stays stuck (issue 34, item 5). A replay recorded as queued that no send can deliver
-- (a queue deleted, a message SQS refuses) was queued for ever: a corrected edit and a discard
-- both answered 409, and the scheduled run retried the send on every run. An operator can now
-- withdraw a queued replay: its letter keeps `replayed` (the spec's review states stay) with
-- the outcome `withdrawn`, who, when and why, and the job goes back to review as a new pending
-- letter linked to it (`replay_of`), the body as received, so the table stays append-only and
-- the job keeps exactly one pending letter. Additive: an older version never sees the outcome
-- (it lists the letter as replayed and never sends it).

ALTER TABLE core.dead_letters DROP CONSTRAINT dead_letters_replay_outcome_check;
ALTER TABLE core.dead_letters ADD CONSTRAINT dead_letters_replay_outcome_check
    CHECK (replay_outcome IN ('queued', 'sent', 'already_processed', 'withdrawn'));

ALTER TABLE core.dead_letters
    ADD COLUMN replay_withdrawn_by text,
    ADD COLUMN replay_withdrawn_at timestamptz,
    ADD COLUMN replay_withdraw_reason text;

ALTER TABLE core.dead_letters ADD CONSTRAINT dead_letters_withdrawn_is_explained CHECK (
    (replay_outcome = 'withdrawn') = (replay_withdrawn_by IS NOT NULL)
    AND (replay_withdrawn_by IS NULL) = (replay_withdrawn_at IS NULL)
    AND (replay_withdrawn_by IS NULL) = (replay_withdraw_reason IS NULL)
    AND (replay_withdraw_reason IS NULL OR btrim(replay_withdraw_reason) <> '')
) NOT VALID;
ALTER TABLE core.dead_letters VALIDATE CONSTRAINT dead_letters_withdrawn_is_explained;

COMMENT ON COLUMN core.dead_letters.replay_withdraw_reason IS
    'Why an operator withdrew this queued replay (its job went back to review as the letter whose replay_of is this one).';

-- The append-only guard again (0019's): the edit's digest (0021) a review column, and besides a
-- review and a queued replay being sent, a queued replay may be withdrawn, changing only its
-- outcome and the withdrawal's columns.
CREATE OR REPLACE FUNCTION core.dead_letters_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    review_columns constant text[] := ARRAY['status', 'discard_reason', 'reviewed_by', 'reviewed_at',
                                            'replay_outcome', 'replay_message_id', 'replay_sent_at',
                                            'replay_reason', 'replay_body', 'replay_digest'];
    sent_columns constant text[] := ARRAY['replay_outcome', 'replay_message_id', 'replay_sent_at'];
    withdrawn_columns constant text[] := ARRAY['replay_outcome', 'replay_withdrawn_by',
                                               'replay_withdrawn_at', 'replay_withdraw_reason'];
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'core.dead_letters is append-only: % is not allowed', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF OLD.status = 'replayed' AND NEW.status = 'replayed'
       AND OLD.replay_outcome = 'queued' AND NEW.replay_outcome IN ('sent', 'withdrawn') THEN
        IF (to_jsonb(NEW) - CASE WHEN NEW.replay_outcome = 'sent' THEN sent_columns ELSE withdrawn_columns END)
           IS DISTINCT FROM
           (to_jsonb(OLD) - CASE WHEN NEW.replay_outcome = 'sent' THEN sent_columns ELSE withdrawn_columns END) THEN
            RAISE EXCEPTION 'core.dead_letters: recording a % replay changes only its columns', NEW.replay_outcome
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.status = OLD.status THEN
        RAISE EXCEPTION 'core.dead_letters is append-only: a row changes only by its review (pending_review -> replayed | discarded), a queued replay being sent, or one being withdrawn'
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

-- Withdraws letter p_letter's queued replay and puts its job back to review, settled through
-- the job's fence as every letter is: a placeholder claim waits for a copy still inside its
-- transaction (and holds off one that would commit meanwhile), and a committed fence of the same
-- job (core.same_job: its family of edits included) means the job is done, so no letter is
-- written (the replay reached the queue after all, or a copy committed). One transaction: the
-- withdrawal and the new pending letter exist together or not at all. Answers the outcome:
-- 'withdrawn' with the new letter's id, 'already_processed', or 'not_queued' (no queued replay:
-- none, sent, or already withdrawn; a concurrent withdrawal or send won).
CREATE FUNCTION core.withdraw_replay(p_letter uuid, p_actor text, p_reason text, p_now timestamptz)
RETURNS TABLE (outcome text, pending_letter uuid)
LANGUAGE plpgsql SET lock_timeout = '2s' AS $$
DECLARE
    old core.dead_letters;
    committed bytea;
    placeholder boolean := false;
    new_id uuid;
BEGIN
    UPDATE core.dead_letters
       SET replay_outcome = 'withdrawn', replay_withdrawn_by = p_actor,
           replay_withdrawn_at = p_now, replay_withdraw_reason = p_reason
     WHERE id = p_letter AND replay_outcome = 'queued'
    RETURNING * INTO old;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_queued'::text, NULL::uuid;
        RETURN;
    END IF;
    IF old.job_id IS NOT NULL THEN
        INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
        VALUES (old.job_id, old.consumer, coalesce(old.tenant_id, '00000000-0000-0000-0000-000000000000'),
                p_now, p_now + interval '1 minute')
        ON CONFLICT (job_id, consumer) DO NOTHING;
        placeholder := FOUND;
        IF NOT placeholder THEN
            SELECT payload_digest INTO committed FROM core.processed_jobs
             WHERE job_id = old.job_id AND consumer = old.consumer;
            IF core.same_job(old.job_id, old.consumer, old.job_digest, committed) THEN
                RETURN QUERY SELECT 'already_processed'::text, NULL::uuid;
                RETURN;
            END IF;
        END IF;
    END IF;
    INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload, body,
                                   attempts, error_kind, last_error, correlation_id, replay_of,
                                   created_at, job_digest, message_group, digest_fields)
    VALUES (old.job_id, old.tenant_id, old.consumer, old.queue,
            -- One letter per (consumer, message): the withdrawal's own name for it.
            'withdrawn:' || old.id, old.payload, old.body, old.attempts, old.error_kind,
            left(format('replay withdrawn by %s (%s); the letter it came from said: %s',
                        p_actor, p_reason, old.last_error), 4000),
            old.correlation_id, old.id, p_now, old.job_digest, old.message_group, old.digest_fields)
    RETURNING id INTO new_id;
    IF placeholder THEN
        DELETE FROM core.processed_jobs WHERE job_id = old.job_id AND consumer = old.consumer;
    END IF;
    RETURN QUERY SELECT 'withdrawn'::text, new_id;
END
$$;

COMMENT ON FUNCTION core.withdraw_replay(uuid, text, text, timestamptz) IS
    'Withdraws a queued replay (outcome withdrawn, with who, when, why) and, unless the job committed, writes it back to review as a new pending letter linked to it.';
