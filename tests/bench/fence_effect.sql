-- pgbench: the consumer's transaction without the harness, the physical limit it is measured
-- against. A fresh job id per transaction (a random 63-bit number as a uuid), its fence, its
-- award, commit. Same tables, same indexes, same rows as the harness writes.
\set job random(1, 9223372036854775806)
\set points random(1, 100)
BEGIN;
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
VALUES (lpad(to_hex(:job::bigint), 32, '0')::uuid, 'award-points', '00000000-0000-0000-0000-000000000001',
        now(), now() + interval '7 days')
ON CONFLICT (job_id, consumer) DO NOTHING;
INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
VALUES (lpad(to_hex(:job::bigint), 32, '0')::uuid, '00000000-0000-0000-0000-000000000001', 'a', :points, now());
COMMIT;
