-- pgbench: the duplicate path without the harness. The fence of an already processed job
-- (seeded as ids 1..:dups) conflicts, nothing is inserted, the transaction rolls back.
\set job random(1, :dups)
BEGIN;
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
VALUES (lpad(to_hex(:job::bigint), 32, '0')::uuid, 'award-points', '00000000-0000-0000-0000-000000000001',
        now(), now() + interval '7 days')
ON CONFLICT (job_id, consumer) DO NOTHING;
ROLLBACK;
