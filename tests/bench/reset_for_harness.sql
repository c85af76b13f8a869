-- The harness benchmark's starting point: no awards, and :dups processed jobs (ids 1..:dups as
-- uuids) for the duplicate path to run into.
TRUNCATE core.processed_jobs, reference.point_awards;
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT lpad(to_hex(i), 32, '0')::uuid, 'award-points', '00000000-0000-0000-0000-000000000001',
       now(), now() + interval '7 days'
FROM generate_series(1, :dups) AS i;
VACUUM ANALYZE core.processed_jobs, reference.point_awards;
