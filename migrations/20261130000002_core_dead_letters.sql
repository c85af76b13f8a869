-- Failures with their full payload (spec: Data, Behaviour 4, 5, 8).
-- Append-only: rows are never deleted, and the only update is the review transition
-- pending_review -> replayed | discarded. The database enforces this, not just the API.
CREATE TABLE core.dead_letters (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- NULL only for a poison message whose body carried no readable job_id.
    job_id         uuid,
    tenant_id      uuid,
    consumer       text        NOT NULL CHECK (btrim(consumer) <> ''),
    queue          text        NOT NULL CHECK (btrim(queue) <> ''),
    -- The SQS message id: a redelivery of the same message never writes a second letter.
    message_id     text        NOT NULL CHECK (btrim(message_id) <> ''),
    -- The message body as received (the whole envelope), so replay can republish it unchanged.
    -- A body that is not JSON is stored as a JSON string.
    payload        jsonb       NOT NULL,
    attempts       integer     NOT NULL CHECK (attempts >= 1),
    error_kind     text        NOT NULL CHECK (error_kind IN ('poison', 'permanent', 'exhausted', 'crashed')),
    last_error     text        NOT NULL,
    correlation_id text,
    -- The letter whose replay produced this one, when a replayed job failed again.
    replay_of      uuid        REFERENCES core.dead_letters (id),
    status         text        NOT NULL DEFAULT 'pending_review'
                               CHECK (status IN ('pending_review', 'replayed', 'discarded')),
    discard_reason text,
    reviewed_by    text,
    reviewed_at    timestamptz,
    created_at     timestamptz NOT NULL,
    CONSTRAINT dead_letters_identified CHECK (job_id IS NOT NULL OR error_kind = 'poison'),
    CONSTRAINT dead_letters_discard_needs_reason CHECK (
        status <> 'discarded' OR (discard_reason IS NOT NULL AND btrim(discard_reason) <> '')),
    CONSTRAINT dead_letters_reason_only_when_discarded CHECK (
        status = 'discarded' OR discard_reason IS NULL),
    CONSTRAINT dead_letters_reviewer_iff_reviewed CHECK (
        (status = 'pending_review') = (reviewed_by IS NULL AND reviewed_at IS NULL)
        AND (reviewed_by IS NULL) = (reviewed_at IS NULL)),
    CONSTRAINT dead_letters_one_per_message UNIQUE (consumer, message_id)
);

-- Listing: newest first, keyset on (created_at, id), optionally by status and queue.
CREATE INDEX dead_letters_created_idx        ON core.dead_letters (created_at DESC, id DESC);
CREATE INDEX dead_letters_status_created_idx ON core.dead_letters (status, created_at DESC, id DESC);
CREATE INDEX dead_letters_queue_created_idx  ON core.dead_letters (queue, status, created_at DESC, id DESC);
-- Escalation scans only what is still waiting for review.
CREATE INDEX dead_letters_pending_idx        ON core.dead_letters (created_at) WHERE status = 'pending_review';
-- Replay and support look letters up by job.
CREATE INDEX dead_letters_job_idx            ON core.dead_letters (job_id, consumer);

CREATE FUNCTION core.dead_letters_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    review_columns constant text[] := ARRAY['status', 'discard_reason', 'reviewed_by', 'reviewed_at'];
BEGIN
    IF TG_OP = 'DELETE' OR TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'core.dead_letters is append-only: % is not allowed', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF NEW.status = OLD.status THEN
        RAISE EXCEPTION 'core.dead_letters is append-only: a row changes only by its review (pending_review -> replayed | discarded)'
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

CREATE TRIGGER dead_letters_append_only
    BEFORE UPDATE OR DELETE ON core.dead_letters
    FOR EACH ROW EXECUTE FUNCTION core.dead_letters_guard();

CREATE TRIGGER dead_letters_no_truncate
    BEFORE TRUNCATE ON core.dead_letters
    FOR EACH STATEMENT EXECUTE FUNCTION core.dead_letters_guard();

COMMENT ON TABLE core.dead_letters IS
    'Every failure with its payload. Append-only except pending_review -> replayed | discarded.';
