-- The idempotency fence (spec: Data, Behaviour 1, 7, 9).
-- One row per (job, consumer) that committed its work. It is inserted first in the
-- work's own transaction, so fence and effect commit together or not at all.
-- It is the only row a successful job writes in schema core.
CREATE SCHEMA IF NOT EXISTS core;

CREATE TABLE core.processed_jobs (
    job_id       uuid        NOT NULL,
    consumer     text        NOT NULL CHECK (btrim(consumer) <> '' AND length(consumer) <= 128),
    tenant_id    uuid        NOT NULL,
    processed_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (job_id, consumer),
    CONSTRAINT processed_jobs_expires_after_processing CHECK (expires_at > processed_at)
);

-- The TTL sweeper deletes `WHERE expires_at < $now` in bounded batches, oldest first.
CREATE INDEX processed_jobs_expires_at_idx ON core.processed_jobs (expires_at);

COMMENT ON TABLE core.processed_jobs IS
    'Idempotency fence: written in the same transaction as the consumer''s work; rows expire at expires_at (TTL > queue retention + max retry window).';
