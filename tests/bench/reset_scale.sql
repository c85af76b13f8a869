-- The scale benchmark's table: :live live fences (random job ids, as producers mint them;
-- expiring over the next 7 days, as at steady state under the default TTL), added to what is
-- there when :extend is true, else instead of it. The indexes are dropped for the load and
-- built after it (sorted, as a restore would), then the table is vacuumed and analyzed.
\if :extend
\else
TRUNCATE core.processed_jobs;
\endif
SET maintenance_work_mem = '1GB';
ALTER TABLE core.processed_jobs DROP CONSTRAINT processed_jobs_pkey;
DROP INDEX core.processed_jobs_expires_at_idx;
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT gen_random_uuid(), 'award-points', '00000000-0000-0000-0000-000000000001',
       now() - interval '7 days' * (1 - f), now() + interval '7 days' * f
FROM (SELECT random() AS f FROM generate_series(1, :live)) AS g;
ALTER TABLE core.processed_jobs ADD PRIMARY KEY (job_id, consumer);
CREATE INDEX processed_jobs_expires_at_idx ON core.processed_jobs (expires_at);
VACUUM ANALYZE core.processed_jobs;
