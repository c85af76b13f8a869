-- The redeem-reward consumer's own effect table, in its own schema (core holds only what the
-- harness writes). Deliberately no unique constraint on job_id: only the fence in
-- core.processed_jobs stops a double redemption, so the tests that prove the fence would fail
-- if it stopped working.
CREATE SCHEMA IF NOT EXISTS rewards;

CREATE TABLE rewards.redemptions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid        NOT NULL,
    tenant_id   uuid        NOT NULL,
    account_id  text        NOT NULL CHECK (btrim(account_id) <> ''),
    reward_sku  text        NOT NULL CHECK (btrim(reward_sku) <> ''),
    cost_points bigint      NOT NULL CHECK (cost_points > 0),
    redeemed_at timestamptz NOT NULL
);

CREATE INDEX redemptions_job_idx ON rewards.redemptions (job_id);
