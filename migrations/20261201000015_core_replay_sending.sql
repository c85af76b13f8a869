-- A queued replay is sent or seen (issue 22, item 3), and the scheduled run's other holes of
-- item 7: incidents resolved by hand, and letters closed by a committing job without a bound
-- on their lock. Additive: an older function version keeps working while this rolls out (it
-- sends queued replays oldest first as before, and each send it records ends its row here).

-- 1. The send state of each replay recorded but not yet accepted by a queue
-- (`replay_outcome = 'queued'`). Kept beside the letter, not in it: `core.dead_letters` is
-- append-only and its guard stays as it is; a send that fails again and again writes only
-- here. A row exists exactly while its letter's replay is queued (the triggers below, whichever
-- code reviews or sends): it is created with the review that queues the replay and goes with
-- the record that the queue accepted it.
CREATE TABLE core.replay_sends (
    letter_id       uuid        PRIMARY KEY REFERENCES core.dead_letters (id),
    -- The letter's queue, where the replay goes (per-queue alerts read it without a join).
    queue           text        NOT NULL,
    -- When the replay was recorded (the letter's reviewed_at).
    queued_at       timestamptz NOT NULL,
    -- The scheduled run tries it again no sooner than this (exponential backoff per row).
    next_attempt_at timestamptz NOT NULL,
    -- Sends the scheduled run tried and the queue refused, the last one's error and time.
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error      text,
    last_attempt_at timestamptz,
    CONSTRAINT replay_sends_error_when_tried CHECK ((attempts = 0) = (last_attempt_at IS NULL))
);

-- The scheduled run's scan: the replays due, the one due longest first.
CREATE INDEX replay_sends_due_idx ON core.replay_sends (next_attempt_at, letter_id);
-- What waits, and what waits past the bound, by queue.
CREATE INDEX replay_sends_queued_idx ON core.replay_sends (queued_at);

COMMENT ON TABLE core.replay_sends IS
    'One row per replay recorded but not yet accepted by its queue: its backoff, attempts and last error.';

CREATE FUNCTION core.dead_letters_track_replay_send() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.replay_outcome = 'queued' THEN
        -- Due at once: the scheduled run leaves a replay younger than its grace minute to the
        -- request that recorded it.
        INSERT INTO core.replay_sends (letter_id, queue, queued_at, next_attempt_at)
        VALUES (NEW.id, NEW.queue, NEW.reviewed_at, NEW.reviewed_at)
        ON CONFLICT (letter_id) DO NOTHING;
    ELSE
        DELETE FROM core.replay_sends WHERE letter_id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER dead_letters_replay_send
    AFTER UPDATE OF replay_outcome ON core.dead_letters
    FOR EACH ROW
    WHEN (OLD.replay_outcome IS DISTINCT FROM NEW.replay_outcome
          AND (NEW.replay_outcome = 'queued' OR OLD.replay_outcome = 'queued'))
    EXECUTE FUNCTION core.dead_letters_track_replay_send();

-- The replays already queued.
INSERT INTO core.replay_sends (letter_id, queue, queued_at, next_attempt_at)
SELECT id, queue, reviewed_at, reviewed_at FROM core.dead_letters WHERE replay_outcome = 'queued'
ON CONFLICT (letter_id) DO NOTHING;

-- 2. One incident per queue while replays to it stay unsent past the bound
-- (REPLAY_UNSENT_ALERT_SECONDS): opened once, resolved when none is left past it. A row is
-- claimed (committed) before its page is sent and recorded after, as escalations are, so
-- nothing is locked while BetterStack answers.
CREATE TABLE core.replay_send_incidents (
    queue         text        PRIMARY KEY,
    incident_id   text,
    opened_at     timestamptz,
    -- When it was last read back from BetterStack: one a person resolved there while replays
    -- are still unsent is raised again as a new incident, which names this one.
    checked_at    timestamptz,
    previous_incident_id text,
    resolved_at   timestamptz,
    claimed_until timestamptz,
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    CONSTRAINT replay_send_incidents_opened CHECK ((incident_id IS NULL) = (opened_at IS NULL)),
    CONSTRAINT replay_send_incidents_resolved CHECK (resolved_at IS NULL OR incident_id IS NOT NULL)
);

COMMENT ON TABLE core.replay_send_incidents IS
    'The BetterStack incident of a queue whose replays stay unsent past the bound, while it lasts.';

-- 3. An open group's incident is read back from BetterStack now and then: one resolved there
-- by hand while the group's letters are still pending is raised again as a new incident (the
-- group then has no incident, so the next delivery opens one). The one resolved by hand is kept.
ALTER TABLE core.dead_letter_groups
    ADD COLUMN incident_checked_at   timestamptz,
    ADD COLUMN previous_incident_id  text,
    ADD COLUMN incidents_raised_again integer NOT NULL DEFAULT 0;

-- 4. A job that commits closes the letters still pending for it, in its own transaction
-- (0008's core.finish_job, 0013's core.finish_jobs). Such a letter held locked by another
-- session (a review in flight, an operator's open transaction) used to stall the job, and in
-- batch mode the whole batch, for as long as the lock was held. Now the close waits at most
-- 2 s: then the job's transaction fails whole (lock_not_available, 55P03), nothing of it
-- commits, and the job is retried; a batch falls back to one job at a time, so only the job
-- whose letter is held waits. A job never commits with its letter left pending: the letter
-- stays a true record. The setting holds for the function's call only (restored on return).
-- A later CREATE OR REPLACE of either function must keep it.
ALTER FUNCTION core.finish_job(uuid, text, text, timestamptz) SET lock_timeout = '2s';
ALTER FUNCTION core.finish_jobs(uuid[], text, timestamptz) SET lock_timeout = '2s';
