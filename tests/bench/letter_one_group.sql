-- pgbench: the letter the consumer writes for poison of one shape (a body whose envelope has no
-- tenant_id), every transaction a new message of the same failure group: the consumer's own
-- INSERT (shared/src/dead_letter/record.rs), whose trigger joins the group's one open row and
-- counts the letter in a tally stripe. Against `letter_distinct_groups.sql` (a group of its own
-- per letter) it shows what sharing one group costs; against `fence_effect.sql`, what a letter
-- costs next to the job it replaces. With `-D claim=1` it is the consumer's whole poison
-- transaction: settled through the job's fence (a placeholder claim, then its removal) around
-- the letter, as `record_unless_processed` does (shared/src/dead_letter/settle.rs).
\set job random(1, 9223372036854775806)
BEGIN;
\if :claim
SELECT core.claim_job_fence(lpad(to_hex(:job::bigint), 32, '0')::uuid, 'award-points',
    '00000000-0000-0000-0000-000000000000', now(), now() + interval '60 s', '2000ms',
    sha256(('job-' || :job::bigint)::bytea));
\endif
INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload,
     body, attempts, error_kind, last_error, correlation_id, replay_of, created_at,
     job_digest, message_group, digest_fields)
VALUES (lpad(to_hex(:job::bigint), 32, '0')::uuid, NULL, 'award-points', 'bench', 'm-' || :job::bigint,
        '{"job_id":"x","correlation_id":"bench","payload":{"account_id":"a","points":1}}',
        '{"job_id":"x","correlation_id":"bench","payload":{"account_id":"a","points":1}}', 1,
        'poison', 'envelope is invalid: missing field `tenant_id`', 'bench',
        (SELECT id FROM core.dead_letters WHERE id = NULL::uuid
           AND job_id IS NOT DISTINCT FROM lpad(to_hex(:job::bigint), 32, '0')::uuid), now(),
        sha256(('job-' || :job::bigint)::bytea), NULL, NULL)
ON CONFLICT ON CONSTRAINT dead_letters_one_per_message DO NOTHING
RETURNING id;
\if :claim
WITH claim AS (DELETE FROM core.processed_jobs
               WHERE job_id = lpad(to_hex(:job::bigint), 32, '0')::uuid AND consumer = 'award-points')
DELETE FROM core.job_executions
WHERE false AND job_id = lpad(to_hex(:job::bigint), 32, '0')::uuid AND consumer = 'award-points';
\endif
COMMIT;
