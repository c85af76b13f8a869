-- pgbench -M prepared: batch mode's statements without the harness, the batch's own limit, and
-- each of its steps alone, to see what each costs (docs/performance.md). Ten new jobs (random
-- 63-bit numbers as uuids), one pgbench transaction. The steps, each switched on with -D:
--   (none)      BEGIN, the ten fences by a plain INSERT … ON CONFLICT DO NOTHING, the ten awards,
--               COMMIT: the least a batch can send;
--   lookup=1    the duplicate lookup before the transaction;
--   claim=1     the fences claimed by core.claim_fences (job id order, the bounded wait);
--   finish=1    the check that the transaction is whole, core.finish_jobs;
--   intake=1    one poison record's row in the letters' intake beside the batch (issue 36: one
--               record in ten poison), inside its transaction (one commit), or with
--   intake_after=1  in a transaction of its own after it (two commits, as the harness writes it).
-- All four: the statements the harness sends for a batch of new jobs, with the same functions,
-- tables and indexes.
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
\set p random(1, 9223372036854775806)
\if :lookup
SELECT job_id FROM core.processed_jobs WHERE consumer = 'award-points' AND job_id = ANY (ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid]);
\endif
BEGIN;
\if :claim
SELECT core.claim_fences(ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid], 'award-points',
    array_fill('00000000-0000-0000-0000-000000000001'::uuid, ARRAY[10]), now(), now() + interval '7 days', '2000ms');
\else
INSERT INTO core.processed_jobs (job_id, consumer, tenant_id, processed_at, expires_at)
SELECT j, 'award-points', '00000000-0000-0000-0000-000000000001', now(), now() + interval '7 days' FROM unnest(ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid]) AS j ORDER BY j ON CONFLICT DO NOTHING RETURNING job_id;
\endif
INSERT INTO reference.point_awards (job_id, tenant_id, account_id, points, awarded_at)
SELECT * FROM unnest(ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid],
    array_fill('00000000-0000-0000-0000-000000000001'::uuid, ARRAY[10]), array_fill('a'::text, ARRAY[10]),
    array_fill(1::bigint, ARRAY[10]), array_fill(now(), ARRAY[10]));
\if :finish
SELECT core.finish_jobs(ARRAY[lpad(to_hex(:j0::bigint), 32, '0')::uuid, lpad(to_hex(:j1::bigint), 32, '0')::uuid, lpad(to_hex(:j2::bigint), 32, '0')::uuid, lpad(to_hex(:j3::bigint), 32, '0')::uuid, lpad(to_hex(:j4::bigint), 32, '0')::uuid, lpad(to_hex(:j5::bigint), 32, '0')::uuid, lpad(to_hex(:j6::bigint), 32, '0')::uuid, lpad(to_hex(:j7::bigint), 32, '0')::uuid, lpad(to_hex(:j8::bigint), 32, '0')::uuid, lpad(to_hex(:j9::bigint), 32, '0')::uuid], 'award-points', now());
\endif
\if :intake_after
COMMIT;
\endif
\if :intake
INSERT INTO core.letter_intake (consumer, received_at, job_id, tenant_id, queue, message_id, body,
    attempts, error_kind, last_error, correlation_id, replay_of, job_digest, digest_fields,
    message_group, trace_parent, nul_replaced)
VALUES ('award-points', now(), lpad(to_hex(:p::bigint), 32, '0')::uuid, NULL, 'bench', 'm-' || :p,
    '{"job_id":"x","correlation_id":"bench","payload":{"account_id":"a","points":1}}', 1, 'poison',
    'envelope is invalid: missing field `tenant_id`', 'bench', NULL, NULL, NULL, NULL, NULL, false);
\endif
\if :intake_after = 0
COMMIT;
\endif
