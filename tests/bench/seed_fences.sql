-- Seeds :n expired fences (expired a day ago, spread over :n milliseconds) for the sweep benchmark.
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'bench-backlog', gen_random_uuid(), now() - interval '8 days',
       now() - interval '1 day' - make_interval(secs => g / 1000.0)
FROM generate_series(1, :n) AS g;
ANALYZE core.processed_jobs;
