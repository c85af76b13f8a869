-- A table at steady state: :live fences still inside their TTL (as 1,000 jobs/s for a few
-- minutes leave behind), which every sweep must step around. Clears earlier runs first.
TRUNCATE core.processed_jobs, reference.point_awards;
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'bench-live', gen_random_uuid(), now(), now() + interval '7 days' + make_interval(secs => g / 1000.0)
FROM generate_series(1, :live) AS g;
VACUUM ANALYZE core.processed_jobs;
