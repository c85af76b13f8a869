-- The letters' intake (issue 36): where a batch's poison is received, one narrow row per record,
-- before it is settled into core.dead_letters in bulk.
--
-- Why: a letter written where it lives costs what the job it replaces costs several times over
-- (pgbench -M prepared, c = 8, this machine, docs/performance.md): ten letters inserted into
-- core.dead_letters as one plain statement ran at 0.44 x the transactions of a valid batch's
-- commit group (ten fences, ten awards), and still 0.65 x with the foreign key and eight list
-- indexes gone; the same ten rows here ran at 2.3 x. So a storm's records are kept here, in the
-- job's own round trip, and one settler at a time per consumer moves them into letters in
-- rounds of hundreds (core.record_letters: each through its job's fence, each group joined and
-- counted once per round).
--
-- A row here is a record: durable before the message is acked, with its body as received. It
-- leaves only after its letter is committed (or its job was found committed: no letter). Both
-- steps are idempotent per message (one letter per consumer and message id), so a settler that
-- dies between them leaves the row to be settled again, finding the letter it wrote.
--
-- Values are bounded before they come here, as they are for a letter (the consumer's Bounded);
-- the payload is not kept: the settler reads it from the body, as a letter's writer does.

CREATE TABLE core.letter_intake (
    seq            bigint GENERATED ALWAYS AS IDENTITY,
    consumer       text        NOT NULL,
    received_at    timestamptz NOT NULL,
    job_id         uuid,
    tenant_id      uuid,
    queue          text        NOT NULL,
    message_id     text        NOT NULL,
    body           text        NOT NULL,
    attempts       integer     NOT NULL,
    error_kind     text        NOT NULL,
    last_error     text        NOT NULL,
    correlation_id text,
    replay_of      uuid,
    job_digest     bytea,
    digest_fields  text[],
    message_group  text,
    trace_parent   text,
    -- A settler takes a consumer's oldest rows; nothing else reads this table. One index.
    PRIMARY KEY (consumer, seq)
);

COMMENT ON TABLE core.letter_intake IS
    'Records received for a dead letter and not yet settled into core.dead_letters (issue 36).';
