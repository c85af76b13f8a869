-- Bulk operations on letters, worked server-side (issue 36): an operator asks once for a group,
-- or any filter the list takes, to be replayed or discarded with a reason, and a worker works
-- the pending letters it selects in chunks, each chunk's reviews and the operation's progress in
-- one transaction, so a worker killed at any point leaves every letter reviewed once or not at
-- all, and the next worker goes on from the committed position. Additive.

CREATE TABLE core.dead_letter_operations (
    id               uuid        PRIMARY KEY,
    action           text        NOT NULL CHECK (action IN ('replay', 'discard')),
    -- The letters it works: the list's filter as the API took it (pending letters only).
    selection        jsonb       NOT NULL,
    reason           text        NOT NULL CHECK (btrim(reason) <> ''),
    requested_by     text        NOT NULL CHECK (btrim(requested_by) <> ''),
    created_at       timestamptz NOT NULL,
    -- Letters written before this are in it: a letter written later is not (it waits for review).
    through          timestamptz NOT NULL,
    -- Pending letters it selected when it was asked for.
    planned          bigint      NOT NULL CHECK (planned >= 0),
    status           text        NOT NULL DEFAULT 'running'
                                 CHECK (status IN ('running', 'done', 'cancelled')),
    cancelled_by     text,
    cancel_reason    text,
    finished_at      timestamptz,
    -- Where the walk stands, newest first: letters after this position are worked.
    after_created_at timestamptz,
    after_id         uuid,
    -- What it did so far.
    replayed         bigint      NOT NULL DEFAULT 0,
    sent             bigint      NOT NULL DEFAULT 0,
    already_processed bigint     NOT NULL DEFAULT 0,
    discarded        bigint      NOT NULL DEFAULT 0,
    -- Letters left pending: not replayable (unsettled, a poison without a job id, another job
    -- under its id) or not sendable (SQS would refuse the body).
    skipped_not_replayable bigint NOT NULL DEFAULT 0,
    skipped_not_sendable   bigint NOT NULL DEFAULT 0,
    -- The worker's lease, and its failures.
    claimed_until    timestamptz,
    next_attempt_at  timestamptz NOT NULL DEFAULT '-infinity',
    failures         integer     NOT NULL DEFAULT 0,
    last_error       text,
    updated_at       timestamptz NOT NULL,
    CONSTRAINT dead_letter_operations_finished CHECK ((status = 'running') = (finished_at IS NULL)),
    CONSTRAINT dead_letter_operations_cancel_explained CHECK (
        (status = 'cancelled') = (cancelled_by IS NOT NULL) AND (cancelled_by IS NULL) = (cancel_reason IS NULL)),
    CONSTRAINT dead_letter_operations_position CHECK ((after_created_at IS NULL) = (after_id IS NULL))
);
-- The worker's scan: running operations.
CREATE INDEX dead_letter_operations_running_idx ON core.dead_letter_operations (next_attempt_at)
    WHERE status = 'running';
-- The operators' list, newest first.
CREATE INDEX dead_letter_operations_created_idx ON core.dead_letter_operations (created_at DESC, id DESC);
COMMENT ON TABLE core.dead_letter_operations IS
    'A bulk replay or discard of the pending letters a filter selects, worked server-side in chunks.';

-- The audit: which operation reviewed a letter (its reviewed_by is the operator who asked).
ALTER TABLE core.dead_letters
    ADD COLUMN operation_id uuid REFERENCES core.dead_letter_operations (id);
ALTER TABLE core.dead_letters
    ADD CONSTRAINT dead_letters_operation_only_when_reviewed CHECK (operation_id IS NULL OR status <> 'pending_review');

-- The append-only guard again (0022's): the operation is a review column.
CREATE OR REPLACE FUNCTION core.dead_letters_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    review_columns constant text[] := ARRAY['status', 'discard_reason', 'reviewed_by', 'reviewed_at',
                                            'replay_outcome', 'replay_message_id', 'replay_sent_at',
                                            'replay_reason', 'replay_body', 'replay_digest',
                                            'operation_id'];
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
