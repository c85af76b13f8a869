-- pgbench: the poison letters the consumer writes in one call of core.record_letters (migration
-- 0028, shared/src/dead_letter/record.rs), each settled through its job's fence (a placeholder
-- claim, the letter, the claim's removal), one failure group: `-D n=10` is a batch's ten, as
-- batch mode writes them; `-D n=1` one letter the same way, against the statements per-job
-- mode sends (`letter_one_group.sql -D claim=1`).
\set job random(1, 9223372036854775806)
SELECT count(*) FROM core.record_letters('award-points', now(), '2000ms', NULL, true,
    (SELECT array_agg(lpad(to_hex(:job::bigint + i), 32, '0')::uuid) FROM generate_series(0, :n::int - 1) i),
    array_fill(NULL::uuid, ARRAY[:n::int]), array_fill('bench'::text, ARRAY[:n::int]),
    (SELECT array_agg('m-' || (:job::bigint + i)) FROM generate_series(0, :n::int - 1) i),
    array_fill('{"job_id":"x","correlation_id":"bench","payload":{"account_id":"a","points":1}}'::jsonb, ARRAY[:n::int]),
    array_fill('{"job_id":"x","correlation_id":"bench","payload":{"account_id":"a","points":1}}'::text, ARRAY[:n::int]),
    array_fill(1, ARRAY[:n::int]), array_fill('poison'::text, ARRAY[:n::int]),
    array_fill('envelope is invalid: missing field `tenant_id`'::text, ARRAY[:n::int]),
    array_fill(NULL::text, ARRAY[:n::int]), array_fill('bench'::text, ARRAY[:n::int]),
    array_fill(NULL::uuid, ARRAY[:n::int]),
    (SELECT array_agg(sha256(('job-' || (:job::bigint + i))::bytea)) FROM generate_series(0, :n::int - 1) i),
    array_fill(NULL::text, ARRAY[:n::int]), array_fill(NULL::text, ARRAY[:n::int]));
