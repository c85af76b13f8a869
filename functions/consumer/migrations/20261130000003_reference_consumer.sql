-- The reference consumer's own effect table (outside schema core on purpose: core holds
-- only what the harness writes). There is deliberately NO unique constraint on job_id:
-- the fence in core.processed_jobs is the only thing that stops a double award, so the
-- tests that prove the fence would fail if it stopped working.
CREATE SCHEMA IF NOT EXISTS reference;

CREATE TABLE reference.point_awards (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     uuid        NOT NULL,
    tenant_id  uuid        NOT NULL,
    account_id text        NOT NULL,
    points     bigint      NOT NULL CHECK (points > 0),
    awarded_at timestamptz NOT NULL
);

CREATE INDEX point_awards_job_idx ON reference.point_awards (job_id);
