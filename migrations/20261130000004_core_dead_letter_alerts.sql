-- Alert state for dead letters (spec: Behaviour 4; DESIGN: alerts).
-- Every dead letter is counted, in its own insert's transaction, into exactly one alert group:
-- (queue, error kind, error fingerprint, one-hour window). A group pages BetterStack once;
-- later letters of the group only raise its count. The trigger makes coverage independent of
-- which code wrote the letter. Unsent groups (BetterStack down, a crash after the commit) are
-- retried by the scheduled function.
CREATE TABLE core.dead_letter_alerts (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL,
    error_kind       text        NOT NULL,
    -- md5 of the last error with ids and numbers masked: "timeout after 31 s for job <uuid>"
    -- and "timeout after 29 s for job <other uuid>" are one group.
    fingerprint      text        NOT NULL,
    window_start     timestamptz NOT NULL,
    letter_count     bigint      NOT NULL DEFAULT 0 CHECK (letter_count >= 0),
    first_letter_id  uuid        NOT NULL REFERENCES core.dead_letters (id),
    sample_job_id    uuid,
    sample_correlation_id text,
    first_error      text        NOT NULL,
    last_error       text        NOT NULL,
    first_letter_at  timestamptz NOT NULL,
    last_letter_at   timestamptz NOT NULL,
    -- Delivery to BetterStack.
    incident_id      text,
    notified_at      timestamptz,
    notified_count   bigint,
    claimed_until    timestamptz,
    -- '-infinity' for a new group: due at once, whatever the sender's clock says.
    next_attempt_at  timestamptz NOT NULL,
    send_attempts    integer     NOT NULL DEFAULT 0,
    last_send_error  text,
    CONSTRAINT dead_letter_alerts_one_group_per_window UNIQUE (queue, error_kind, fingerprint, window_start),
    CONSTRAINT dead_letter_alerts_sent_together CHECK ((incident_id IS NULL) = (notified_at IS NULL))
);

-- The sender's scan: groups not yet sent.
CREATE INDEX dead_letter_alerts_unsent_idx ON core.dead_letter_alerts (next_attempt_at) WHERE notified_at IS NULL;

CREATE FUNCTION core.dead_letter_fingerprint(error_kind text, last_error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT left(md5(error_kind || ':' || regexp_replace(
        regexp_replace(left(last_error, 500),
            '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
        '[0-9]+', '<n>', 'g')), 16)
$$;

CREATE FUNCTION core.dead_letters_count_into_alert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO core.dead_letter_alerts AS a (queue, error_kind, fingerprint, window_start, letter_count,
        first_letter_id, sample_job_id, sample_correlation_id, first_error, last_error,
        first_letter_at, last_letter_at, next_attempt_at)
    VALUES (NEW.queue, NEW.error_kind, core.dead_letter_fingerprint(NEW.error_kind, NEW.last_error),
        date_bin('1 hour', NEW.created_at, TIMESTAMPTZ '2000-01-01 00:00:00+00'), 1,
        NEW.id, NEW.job_id, NEW.correlation_id, NEW.last_error, NEW.last_error,
        NEW.created_at, NEW.created_at, '-infinity')
    ON CONFLICT ON CONSTRAINT dead_letter_alerts_one_group_per_window DO UPDATE
        SET letter_count   = a.letter_count + 1,
            last_error     = EXCLUDED.last_error,
            last_letter_at = greatest(a.last_letter_at, EXCLUDED.last_letter_at);
    RETURN NULL;
END
$$;

CREATE TRIGGER dead_letters_alert
    AFTER INSERT ON core.dead_letters
    FOR EACH ROW EXECUTE FUNCTION core.dead_letters_count_into_alert();
