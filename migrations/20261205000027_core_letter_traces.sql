-- A letter keeps the trace context of the message it was written from (issue 37): W3C's
-- traceparent, from the message's `traceparent` attribute or SQS's AWSTraceHeader. Its replay
-- sends it on as the `traceparent` attribute, so the replayed job's span links to the trace of
-- the request that produced the job, and an operator goes from a letter to that request.
-- Additive: function versions before it write none.

ALTER TABLE core.dead_letters ADD COLUMN trace_parent text;

-- Checked for new letters only: existing ones have none (NOT VALID skips the scan of a table
-- that may hold millions of letters).
ALTER TABLE core.dead_letters ADD CONSTRAINT dead_letters_trace_parent_w3c
    CHECK (trace_parent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;

COMMENT ON COLUMN core.dead_letters.trace_parent IS
    'The W3C trace context of the message it was written from (NULL: none carried); what its replay sends as the traceparent attribute.';

-- A letter written back to review by a withdrawn replay (core.withdraw_replay) is a copy of the
-- letter it came from: it keeps that letter's trace, as every other column.
CREATE FUNCTION core.dead_letters_keep_trace() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    SELECT d.trace_parent INTO NEW.trace_parent FROM core.dead_letters d WHERE d.id = NEW.replay_of;
    RETURN NEW;
END
$$;

CREATE TRIGGER dead_letters_keep_trace
    BEFORE INSERT ON core.dead_letters
    FOR EACH ROW
    WHEN (NEW.trace_parent IS NULL AND NEW.message_id LIKE 'withdrawn:%' AND NEW.replay_of IS NOT NULL)
    EXECUTE FUNCTION core.dead_letters_keep_trace();
