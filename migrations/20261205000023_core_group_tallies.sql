-- Letters of one failure group are written side by side (issue 36). Until now every letter
-- upserted its group's row (letter_count + 1, pending_count + 1, last_error, last_letter_at) and
-- held that row's lock until commit, so a storm in one group was written one letter at a time,
-- platform-wide (pgbench, c = 16: 0.07 x the fence rate).
--
-- Now a letter only *finds* its open group (FOR KEY SHARE: joiners never wait on each other) and
-- counts itself in one of the group's tally stripes, the first one no other transaction holds
-- (SKIP LOCKED), or a stripe of its own. A group has as many stripes as letters were ever written
-- into it at once; its counts are the sum of its stripes, exact when read
-- (`core.dead_letter_groups_counted`). Resolution stays in the review's transaction: reviews of
-- one group take turns (an advisory lock, never taken by a letter), and the review that sees no
-- pending letter left locks the group row, which waits for the letters joining it right then
-- and turns away the ones that come after (they open a new group).
--
-- Contract, not additive: the group's four per-letter columns move to the stripes. Letters are
-- written by the trigger below whatever the function version; a function version from before
-- this migration fails its group reads until it is replaced (the migration runs before the
-- functions are updated, in the same deploy).

-- 1. The stripes.
CREATE SEQUENCE core.dead_letter_group_stripes;
CREATE TABLE core.dead_letter_group_tallies (
    group_id       bigint      NOT NULL REFERENCES core.dead_letter_groups (id),
    -- A new stripe's number is new (a sequence), so making one never waits on another's.
    stripe         bigint      NOT NULL,
    letters        bigint      NOT NULL DEFAULT 0,
    -- A stripe's pending count may go below zero (a review counted in another stripe than its
    -- letter); the group's sum never does.
    pending        bigint      NOT NULL DEFAULT 0,
    -- The stripe's latest letter, and its error.
    last_letter_at timestamptz,
    last_error     text,
    PRIMARY KEY (group_id, stripe)
);
COMMENT ON TABLE core.dead_letter_group_tallies IS
    'A failure group''s counts in stripes written side by side; the group''s counts are their sums (core.dead_letter_groups_counted).';

INSERT INTO core.dead_letter_group_tallies (group_id, stripe, letters, pending, last_letter_at, last_error)
SELECT id, 0, letter_count, pending_count, last_letter_at, last_error FROM core.dead_letter_groups;

-- 2. The group row keeps what does not change per letter. Whether its incident lags the group
-- (`needs_delivery`) now depends on the count in the stripes, so it moves to the view below; the
-- row keeps whether its incident is live at all (none yet for an open group, or not resolved),
-- the sender's scan.
ALTER TABLE core.dead_letter_groups DROP COLUMN needs_delivery;
ALTER TABLE core.dead_letter_groups
    DROP COLUMN letter_count,
    DROP COLUMN pending_count,
    DROP COLUMN last_letter_at,
    DROP COLUMN last_error;
ALTER TABLE core.dead_letter_groups ADD COLUMN incident_live boolean GENERATED ALWAYS AS (
    (incident_id IS NULL AND resolved_at IS NULL)
    OR (incident_id IS NOT NULL AND incident_resolved_at IS NULL)) STORED;
CREATE INDEX dead_letter_groups_delivery_idx ON core.dead_letter_groups (next_delivery_at) WHERE incident_live;

-- 3. A group with its counts, as every read takes it.
CREATE VIEW core.dead_letter_groups_counted AS
SELECT g.*, t.letter_count, t.pending_count, t.last_letter_at, t.last_error,
       -- The incident lags the group: none yet for an open group, a count it does not show yet,
       -- or a resolution it has not had.
       (g.incident_id IS NULL AND g.resolved_at IS NULL)
       OR (g.incident_id IS NOT NULL AND g.incident_resolved_at IS NULL
           AND (g.resolved_at IS NOT NULL OR t.letter_count IS DISTINCT FROM g.incident_count)) AS needs_delivery
FROM core.dead_letter_groups g
CROSS JOIN LATERAL (
    SELECT coalesce(sum(s.letters), 0)::bigint AS letter_count,
           coalesce(sum(s.pending), 0)::bigint AS pending_count,
           coalesce(max(s.last_letter_at), g.first_letter_at) AS last_letter_at,
           coalesce((array_agg(s.last_error ORDER BY s.last_letter_at DESC NULLS LAST))[1], g.sample_error) AS last_error
    FROM core.dead_letter_group_tallies s WHERE s.group_id = g.id) t;

-- 4. Counting a letter or a review in a stripe: the first one no other transaction holds, else
-- a new one. Never waits.
CREATE FUNCTION core.dead_letter_group_count(group_id bigint, letters bigint, pending bigint,
    letter_at timestamptz, error text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    free bigint;
BEGIN
    SELECT s.stripe INTO free FROM core.dead_letter_group_tallies s
     WHERE s.group_id = dead_letter_group_count.group_id
     ORDER BY s.stripe LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE core.dead_letter_group_tallies s
           SET letters = s.letters + dead_letter_group_count.letters,
               pending = s.pending + dead_letter_group_count.pending,
               last_error = CASE WHEN letter_at IS NOT NULL AND letter_at >= coalesce(s.last_letter_at, '-infinity')
                                 THEN error ELSE s.last_error END,
               last_letter_at = greatest(s.last_letter_at, letter_at)
         WHERE s.group_id = dead_letter_group_count.group_id AND s.stripe = free;
        RETURN;
    END IF;
    INSERT INTO core.dead_letter_group_tallies (group_id, stripe, letters, pending, last_letter_at, last_error)
    VALUES (dead_letter_group_count.group_id, nextval('core.dead_letter_group_stripes'),
            dead_letter_group_count.letters, dead_letter_group_count.pending, letter_at, error);
END
$$;

-- 5. A new letter joins its open group (or opens one) and counts itself; a redelivery of a
-- message that has its letter is skipped (serialized per message by a lock), as before.
CREATE OR REPLACE FUNCTION core.dead_letters_join_group() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    pending constant boolean := NEW.status = 'pending_review';
    print constant text := core.error_fingerprint(NEW.error_kind, NEW.last_error);
    joined bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('core.dead_letters:' || NEW.consumer || ':' || NEW.message_id, 0));
    IF EXISTS (SELECT 1 FROM core.dead_letters WHERE consumer = NEW.consumer AND message_id = NEW.message_id) THEN
        RETURN NULL;
    END IF;
    LOOP
        -- KEY SHARE: letters joining at once share it; the review resolving the group waits for
        -- them, and a letter arriving after that resolution finds no open group here.
        SELECT g.id INTO joined FROM core.dead_letter_groups g
         WHERE g.consumer = NEW.consumer AND g.queue = NEW.queue AND g.error_kind = NEW.error_kind
           AND g.fingerprint = print AND g.resolved_at IS NULL
         FOR KEY SHARE;
        EXIT WHEN FOUND;
        INSERT INTO core.dead_letter_groups AS g (consumer, queue, error_kind, fingerprint, pattern,
            sample_error, sample_letter_id, sample_job_id, sample_correlation_id, first_letter_at, resolved_at)
        VALUES (NEW.consumer, NEW.queue, NEW.error_kind, print, core.masked_error(NEW.last_error),
            NEW.last_error, NEW.id, NEW.job_id, NEW.correlation_id, NEW.created_at,
            CASE WHEN pending THEN NULL ELSE NEW.created_at END)
        ON CONFLICT (consumer, queue, error_kind, fingerprint) WHERE resolved_at IS NULL DO NOTHING
        RETURNING g.id INTO joined;
        -- Opened by another letter at the same time (or resolved at birth: a letter written
        -- already reviewed): join that one, or keep this one.
        EXIT WHEN joined IS NOT NULL;
    END LOOP;
    PERFORM core.dead_letter_group_count(joined, 1, CASE WHEN pending THEN 1 ELSE 0 END,
                                         NEW.created_at, NEW.last_error);
    NEW.group_id := joined;
    RETURN NEW;
END
$$;

-- 6. A letter leaving pending_review leaves its group's pending count; the review that leaves
-- none pending resolves the group (and makes its incident's resolution due at once).
CREATE OR REPLACE FUNCTION core.dead_letters_leave_pending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Reviews of one group take turns, so the sums below see every other review.
    PERFORM pg_advisory_xact_lock(hashtextextended('core.dead_letter_groups:review:' || NEW.group_id, 0));
    PERFORM core.dead_letter_group_count(NEW.group_id, 0, -1, NULL, NULL);
    IF (SELECT sum(pending) FROM core.dead_letter_group_tallies WHERE group_id = NEW.group_id) > 0 THEN
        RETURN NULL;
    END IF;
    -- None pending that this review sees: wait for the letters joining right now, turn away the
    -- ones that come after, and count again (a new statement sees what committed meanwhile).
    PERFORM 1 FROM core.dead_letter_groups WHERE id = NEW.group_id FOR UPDATE;
    IF (SELECT sum(pending) FROM core.dead_letter_group_tallies WHERE group_id = NEW.group_id) = 0 THEN
        UPDATE core.dead_letter_groups
           SET resolved_at = NEW.reviewed_at, next_delivery_at = '-infinity'
         WHERE id = NEW.group_id AND resolved_at IS NULL;
    END IF;
    RETURN NULL;
END
$$;
