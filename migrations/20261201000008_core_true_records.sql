-- True records (issue 13): a dead letter exists only for a job whose effect did not commit,
-- attempts count executions of the work, and a replay is recorded as it happened.
-- Additive only: an old function version keeps working while this rolls out.

-- 1. The execution ledger. A job's executions are counted by the harness, not by SQS receives:
-- a repeat delivery marks its start here (autocommit, before the work's transaction), so a crash
-- is charged to the job that was running, and a hand-back charges nothing. A first delivery
-- writes nothing here unless it fails, so a job that succeeds the first time writes only its
-- fence. The row goes when the job commits (in the work's transaction) or is dead-lettered.
CREATE TABLE core.job_executions (
    job_id          uuid        NOT NULL,
    consumer        text        NOT NULL,
    executions      integer     NOT NULL CHECK (executions >= 0),
    -- The last transient failure the harness saw end; NULL after a start mark until it ends (a
    -- crash leaves it NULL, so a job over its budget is `crashed` unless its last run failed).
    last_error      text,
    updated_at      timestamptz NOT NULL,
    PRIMARY KEY (job_id, consumer)
);
-- The scheduled sweep removes ledger rows nobody finished (their job's messages expired).
CREATE INDEX job_executions_updated_idx ON core.job_executions (updated_at);

-- 2. Replays recorded as they happened. A replay commits `replayed` before anything is sent
-- (outcome `queued`), then records the message SQS accepted (`sent`); a job whose fence exists
-- is not sent at all (`already_processed`). The scheduled run sends what stayed `queued`.
ALTER TABLE core.dead_letters
    ADD COLUMN replay_outcome    text CHECK (replay_outcome IN ('queued', 'sent', 'already_processed')),
    ADD COLUMN replay_message_id text,
    ADD COLUMN replay_sent_at    timestamptz;
-- Letters replayed before this migration keep a NULL outcome (it was not recorded then).
ALTER TABLE core.dead_letters
    ADD CONSTRAINT dead_letters_outcome_only_when_replayed CHECK (replay_outcome IS NULL OR status = 'replayed'),
    ADD CONSTRAINT dead_letters_sent_has_message CHECK (
        replay_outcome <> 'sent' OR (replay_message_id IS NOT NULL AND replay_sent_at IS NOT NULL)),
    ADD CONSTRAINT dead_letters_message_only_when_sent CHECK (replay_message_id IS NULL OR replay_outcome = 'sent');
-- A reason an operator can read: not only blanks or invisible characters (U+200B and kin).
-- NOT VALID: enforced on every new discard without re-checking what older versions accepted.
ALTER TABLE core.dead_letters
    ADD CONSTRAINT dead_letters_reason_visible CHECK (
        discard_reason IS NULL
        OR discard_reason ~ '[^[:space:]\u00a0\u00ad\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u3000\ufeff]')
    NOT VALID;

-- A crashed letter from the backstop may honestly say that no execution ran (the database was
-- unreachable for every delivery); every other kind ran at least once (poison counts as one).
ALTER TABLE core.dead_letters DROP CONSTRAINT dead_letters_attempts_check;
ALTER TABLE core.dead_letters
    ADD CONSTRAINT dead_letters_attempts_check CHECK (attempts >= 1 OR (error_kind = 'crashed' AND attempts = 0));

-- Replays still to send, oldest first.
CREATE INDEX dead_letters_replay_queued_idx ON core.dead_letters (reviewed_at) WHERE replay_outcome = 'queued';
-- The sweeper keeps the fence of any job with a letter pending review; the harness closes such
-- letters when the job commits through another copy.
CREATE INDEX dead_letters_pending_job_idx ON core.dead_letters (job_id, consumer) WHERE status = 'pending_review';

-- The append-only guard, now with the replay's second step: `queued -> sent`, setting only the
-- message id and the time it was sent.
CREATE OR REPLACE FUNCTION core.dead_letters_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    review_columns constant text[] := ARRAY['status', 'discard_reason', 'reviewed_by', 'reviewed_at',
                                            'replay_outcome', 'replay_message_id', 'replay_sent_at'];
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

-- 3. The last statement of every job's transaction, before COMMIT. PostgreSQL answers COMMIT
-- on an aborted transaction with a silent ROLLBACK, so a handler that swallowed an SQL error
-- would look committed. This call fails on an aborted transaction (25P02), and returns false
-- when the fence is not this transaction's own (the handler committed or rolled back itself).
-- When it holds, it also ends the job's bookkeeping in the same transaction: the execution
-- ledger row goes, and a letter still pending for the job (written when another copy failed)
-- is closed, since the job's effect now commits.
CREATE FUNCTION core.finish_job(p_job_id uuid, p_consumer text, p_message_id text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
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
     WHERE job_id = p_job_id AND consumer = p_consumer AND status = 'pending_review';
    RETURN true;
END
$$;

COMMENT ON FUNCTION core.finish_job(uuid, text, text, timestamptz) IS
    'Run last in a job''s transaction: false unless the fence is this transaction''s own; clears the job''s execution ledger and closes letters pending for it.';
