-- pgbench: `letter_one_group.sql`'s letter, each in a failure group of its own (a code that the
-- grouping keeps, 99,000 of them): the same INSERT and trigger with no group shared between
-- concurrent letters, the rate a storm in one group is held to.
\set job random(1, 9223372036854775806)
BEGIN;
INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload,
     body, attempts, error_kind, last_error, correlation_id, replay_of, created_at,
     job_digest, message_group, digest_fields)
VALUES (lpad(to_hex(:job::bigint), 32, '0')::uuid, NULL, 'award-points', 'bench', 'm-' || :job::bigint,
        '{"job_id":"x","correlation_id":"bench","payload":{"account_id":"a","points":1}}',
        '{"job_id":"x","correlation_id":"bench","payload":{"account_id":"a","points":1}}', 1,
        'poison', 'partner refused: code ' || (100 + :job::bigint % 99000), 'bench',
        (SELECT id FROM core.dead_letters WHERE id = NULL::uuid
           AND job_id IS NOT DISTINCT FROM lpad(to_hex(:job::bigint), 32, '0')::uuid), now(),
        sha256(('job-' || :job::bigint)::bytea), NULL, NULL)
ON CONFLICT ON CONSTRAINT dead_letters_one_per_message DO NOTHING
RETURNING id;
COMMIT;
