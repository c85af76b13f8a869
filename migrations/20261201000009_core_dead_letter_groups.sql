-- Failure groups (issue 15): every dead letter belongs to one group, the unit an operator triages
-- and an incident stands for. A group is one failure of one consumer on one queue (same error
-- kind, same error once the values that vary per job are masked) for as long as it lasts: it is
-- open while any of its letters is pending review, and resolved when the last one is reviewed.
-- A later letter of the same failure opens a new group (a new incident).
-- Additive: an old function version keeps working while this rolls out (it writes letters as
-- before; the triggers below group them; its own alert table simply stops filling).

-- 1. The fingerprint. Values that vary per job are masked (quoted values, ids, numbers) so one
-- failure is one group; statuses and codes are kept ("answered 503" and "answered 429" are two
-- failures, "E1001" and "E1002" too). The masked text is kept on the group as its pattern.
CREATE FUNCTION core.masked_error(last_error text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    s text := left(last_error, 500);
BEGIN
    -- Quoted values: 'acct-17', "acct-17", `x`.
    s := regexp_replace(s, '''[^'']*''|"[^"]*"|`[^`]*`', '<q>', 'g');
    -- UUIDs, and long tokens with digits in them (request ids, hashes).
    s := regexp_replace(s, '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi');
    s := regexp_replace(s, '\m(?=[a-z_]*[0-9])[0-9a-z_]{12,}\M', '<id>', 'gi');
    -- Statuses and codes keep their number, marked so that the last step leaves it:
    -- "status 503", "HTTP 429", "answered 401", "code 40001", "SQLSTATE 23505".
    s := regexp_replace(s,
        '\m(status|http|code|sqlstate|errno|answered|returned|responded)\M([^0-9a-z]{0,3})([0-9][0-9a-z]{2,4})\M',
        '\1\2#\3', 'gi');
    -- An HTTP status before its reason phrase: "503 Service Unavailable".
    s := regexp_replace(s, '\m([1-5][0-9][0-9])(\s+[A-Z][a-z]+)', '#\1\2', 'g');
    -- Any other number, with its unit if it has one: "31 s", "31s", "2.5ms", "1,000", "3 KB".
    s := regexp_replace(s,
        '(^|[^#0-9a-z_])[0-9]+([.,][0-9]+)*(\s?(ns|us|ms|s|sec|secs|seconds?|m|min|mins|minutes?|h|hrs?|hours?|d|days?|b|kb|mb|gb|bytes?|x))?\M',
        '\1<n>', 'gi');
    RETURN s;
END
$$;

CREATE FUNCTION core.error_fingerprint(error_kind text, last_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(md5(error_kind || ':' || core.masked_error(last_error)), 16)
$$;

-- 2. The groups, with the state of the incident each stands for.
CREATE TABLE core.dead_letter_groups (
    id                    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer              text        NOT NULL,
    queue                 text        NOT NULL,
    error_kind            text        NOT NULL,
    fingerprint           text        NOT NULL,
    -- The error with its varying values masked: what the group's letters have in common.
    pattern               text        NOT NULL,
    -- The first letter's error and the latest one, whole.
    sample_error          text        NOT NULL,
    last_error            text        NOT NULL,
    sample_letter_id      uuid        NOT NULL,
    sample_job_id         uuid,
    sample_correlation_id text,
    letter_count          bigint      NOT NULL CHECK (letter_count >= 1),
    pending_count         bigint      NOT NULL CHECK (pending_count >= 0 AND pending_count <= letter_count),
    first_letter_at       timestamptz NOT NULL,
    last_letter_at        timestamptz NOT NULL,
    -- When its last pending letter was reviewed.
    resolved_at           timestamptz,
    -- The BetterStack incident: opened for the group, updated with its count, resolved with it.
    incident_id           text,
    incident_opened_at    timestamptz,
    incident_count        bigint,
    incident_updated_at   timestamptz,
    incident_resolved_at  timestamptz,
    -- Delivery of the incident's next step: due at next_delivery_at, leased by one sender.
    next_delivery_at      timestamptz NOT NULL DEFAULT '-infinity',
    claimed_until         timestamptz,
    delivery_failures     integer     NOT NULL DEFAULT 0,
    last_delivery_error   text,
    -- Whether the incident lags the group: none yet for an open group, a count it does not show
    -- yet, or a resolution it has not had.
    needs_delivery        boolean     GENERATED ALWAYS AS (
        (incident_id IS NULL AND resolved_at IS NULL)
        OR (incident_id IS NOT NULL AND incident_resolved_at IS NULL
            AND (resolved_at IS NOT NULL OR letter_count IS DISTINCT FROM incident_count))) STORED,
    CONSTRAINT dead_letter_groups_open_iff_pending CHECK ((resolved_at IS NULL) = (pending_count > 0)),
    CONSTRAINT dead_letter_groups_incident_opened CHECK ((incident_id IS NULL) = (incident_opened_at IS NULL)),
    CONSTRAINT dead_letter_groups_incident_resolved CHECK (incident_resolved_at IS NULL OR incident_id IS NOT NULL)
);

-- One open group per failure; a resolved one is history.
CREATE UNIQUE INDEX dead_letter_groups_open_idx
    ON core.dead_letter_groups (consumer, queue, error_kind, fingerprint) WHERE resolved_at IS NULL;
-- The operators' list: latest first.
CREATE INDEX dead_letter_groups_last_idx ON core.dead_letter_groups (last_letter_at DESC, id DESC);
-- The sender's scan: incidents that lag their group.
CREATE INDEX dead_letter_groups_delivery_idx ON core.dead_letter_groups (next_delivery_at) WHERE needs_delivery;

COMMENT ON TABLE core.dead_letter_groups IS
    'One failure (consumer, queue, kind, masked error) while any of its letters is pending review; each stands for one incident.';

-- 3. Letters point at their group; a replay may say why it was made.
ALTER TABLE core.dead_letters
    ADD COLUMN group_id bigint REFERENCES core.dead_letter_groups (id),
    ADD COLUMN replay_reason text;
ALTER TABLE core.dead_letters
    ADD CONSTRAINT dead_letters_replay_reason_only_when_replayed CHECK (replay_reason IS NULL OR status = 'replayed');

-- The letters already written, grouped the same way (the append-only guard is off for this one
-- statement of the migration; it is back on below, in the same transaction).
INSERT INTO core.dead_letter_groups (consumer, queue, error_kind, fingerprint, pattern, sample_error,
    last_error, sample_letter_id, sample_job_id, sample_correlation_id, letter_count, pending_count,
    first_letter_at, last_letter_at, resolved_at)
SELECT consumer, queue, error_kind, fingerprint,
       core.masked_error((array_agg(last_error ORDER BY created_at, id))[1]),
       (array_agg(last_error ORDER BY created_at, id))[1],
       (array_agg(last_error ORDER BY created_at DESC, id DESC))[1],
       (array_agg(id ORDER BY created_at, id))[1],
       (array_agg(job_id ORDER BY created_at, id))[1],
       (array_agg(correlation_id ORDER BY created_at, id))[1],
       count(*), count(*) FILTER (WHERE status = 'pending_review'),
       min(created_at), max(created_at),
       CASE WHEN count(*) FILTER (WHERE status = 'pending_review') = 0
            THEN max(coalesce(reviewed_at, created_at)) END
FROM (SELECT d.*, core.error_fingerprint(error_kind, last_error) AS fingerprint FROM core.dead_letters d) AS l
GROUP BY consumer, queue, error_kind, fingerprint;

ALTER TABLE core.dead_letters DISABLE TRIGGER dead_letters_append_only;
UPDATE core.dead_letters d SET group_id = g.id
FROM core.dead_letter_groups g
WHERE g.consumer = d.consumer AND g.queue = d.queue AND g.error_kind = d.error_kind
  AND g.fingerprint = core.error_fingerprint(d.error_kind, d.last_error);
ALTER TABLE core.dead_letters ENABLE TRIGGER dead_letters_append_only;

-- Letters by group, newest first (all of them, and those still pending: a bulk replay's set).
CREATE INDEX dead_letters_group_created_idx ON core.dead_letters (group_id, created_at DESC, id DESC);
CREATE INDEX dead_letters_group_pending_idx ON core.dead_letters (group_id, created_at DESC, id DESC)
    WHERE status = 'pending_review';

-- 4. Every new letter joins its group in its own insert's transaction, whichever code wrote it.
-- BEFORE INSERT, so the row carries its group; it runs before the insert's ON CONFLICT, so it
-- skips a message that already has its letter itself (serialized per message by a lock), and a
-- redelivery never counts twice.
CREATE FUNCTION core.dead_letters_join_group() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    pending constant boolean := NEW.status = 'pending_review';
    joined bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('core.dead_letters:' || NEW.consumer || ':' || NEW.message_id, 0));
    IF EXISTS (SELECT 1 FROM core.dead_letters WHERE consumer = NEW.consumer AND message_id = NEW.message_id) THEN
        RETURN NULL;
    END IF;
    INSERT INTO core.dead_letter_groups AS g (consumer, queue, error_kind, fingerprint, pattern,
        sample_error, last_error, sample_letter_id, sample_job_id, sample_correlation_id,
        letter_count, pending_count, first_letter_at, last_letter_at, resolved_at)
    VALUES (NEW.consumer, NEW.queue, NEW.error_kind, core.error_fingerprint(NEW.error_kind, NEW.last_error),
        core.masked_error(NEW.last_error), NEW.last_error, NEW.last_error, NEW.id, NEW.job_id,
        NEW.correlation_id, 1, CASE WHEN pending THEN 1 ELSE 0 END, NEW.created_at, NEW.created_at,
        CASE WHEN pending THEN NULL ELSE NEW.created_at END)
    ON CONFLICT (consumer, queue, error_kind, fingerprint) WHERE resolved_at IS NULL DO UPDATE
        SET letter_count   = g.letter_count + 1,
            pending_count  = g.pending_count + CASE WHEN pending THEN 1 ELSE 0 END,
            last_error     = EXCLUDED.last_error,
            last_letter_at = greatest(g.last_letter_at, EXCLUDED.last_letter_at)
    RETURNING id INTO joined;
    NEW.group_id := joined;
    RETURN NEW;
END
$$;

CREATE TRIGGER dead_letters_group
    BEFORE INSERT ON core.dead_letters
    FOR EACH ROW EXECUTE FUNCTION core.dead_letters_join_group();

-- A letter leaving pending_review leaves its group's pending count; the last one resolves it
-- (and makes its incident's resolution due at once).
CREATE FUNCTION core.dead_letters_leave_pending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE core.dead_letter_groups
       SET pending_count    = pending_count - 1,
           resolved_at      = CASE WHEN pending_count = 1 THEN NEW.reviewed_at END,
           next_delivery_at = CASE WHEN pending_count = 1 THEN '-infinity' ELSE next_delivery_at END
     WHERE id = NEW.group_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER dead_letters_reviewed
    AFTER UPDATE OF status ON core.dead_letters
    FOR EACH ROW
    WHEN (OLD.status = 'pending_review' AND NEW.status <> 'pending_review' AND NEW.group_id IS NOT NULL)
    EXECUTE FUNCTION core.dead_letters_leave_pending();

-- The hour-window alert groups of 0004 are replaced: no new letter is counted there any more.
-- The table stays until no function version reads it.
DROP TRIGGER dead_letters_alert ON core.dead_letters;

-- 5. The append-only guard again, now also keeping a letter's group and letting a replay carry
-- its reason.
CREATE OR REPLACE FUNCTION core.dead_letters_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    review_columns constant text[] := ARRAY['status', 'discard_reason', 'reviewed_by', 'reviewed_at',
                                            'replay_outcome', 'replay_message_id', 'replay_sent_at',
                                            'replay_reason'];
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

-- 6. Escalation per group and step (replacing 0005's per letter): step k is reached when the
-- group's oldest pending letter is k x N days old, and pages once. A row is claimed (committed)
-- before its page is sent and marked after, so no lock is held while BetterStack answers and a
-- review never waits for an escalation.
CREATE TABLE core.dead_letter_group_escalations (
    group_id      bigint      NOT NULL REFERENCES core.dead_letter_groups (id),
    step          integer     NOT NULL CHECK (step >= 1),
    claimed_until timestamptz,
    paged_at      timestamptz,
    incident_id   text,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    PRIMARY KEY (group_id, step),
    CONSTRAINT dead_letter_group_escalations_paged CHECK ((paged_at IS NULL) = (incident_id IS NULL))
);
