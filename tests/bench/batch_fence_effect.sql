-- pgbench: batch mode's statements without the harness, the batch's own limit. Ten new jobs
-- (random 63-bit numbers as uuids) in the statements the harness sends for them, prepared as it
-- prepares them: the duplicate lookup (before any transaction), BEGIN, the ten fences in one
-- statement, the ten awards in one statement, the check that the transaction is whole, COMMIT.
-- The same functions, tables and indexes as the harness in batch mode; one pgbench transaction
-- is ten jobs. Run with -M prepared.
\set j0 random(1, 9223372036854775806)
\set j1 random(1, 9223372036854775806)
\set j2 random(1, 9223372036854775806)
\set j3 random(1, 9223372036854775806)
\set j4 random(1, 9223372036854775806)
\set j5 random(1, 9223372036854775806)
\set j6 random(1, 9223372036854775806)
\set j7 random(1, 9223372036854775806)
\set j8 random(1, 9223372036854775806)
\set j9 random(1, 9223372036854775806)
SELECT job_id FROM core.processed_jobs
WHERE consumer = 'award-points' AND job_id = ANY (ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid]);
BEGIN;
SELECT core.claim_fences(ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid], 'award-points',
    array_fill('00000000-0000-0000-0000-000000000001'::uuid, ARRAY[10]), now(), now() + interval '7 days', '2000ms');
INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
SELECT * FROM unnest(ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid],
    array_fill('00000000-0000-0000-0000-000000000001'::uuid, ARRAY[10]), array_fill('a'::text, ARRAY[10]),
    array_fill(1::bigint, ARRAY[10]), array_fill(now(), ARRAY[10]));
SELECT core.finish_jobs(ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid], 'award-points', now());
COMMIT;
