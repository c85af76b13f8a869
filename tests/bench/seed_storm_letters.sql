-- The bulk-operation benchmark's storm: :n pending letters of one failure group on queue
-- :queue (one shape, one group), written over the last hour, as the consumer writes them.
-- Triggers are off for the seed (session_replication_role = replica): the seed is not what is
-- measured; the group and its tally are made first, as the triggers make them. Superuser only,
-- and only in the benchmark's own database.
\set error 'partner answered 503 Service Unavailable after 30000 ms'
SET session_replication_role = replica;
INSERT INTO core.dead_letter_groups (consumer, queue, error_kind, fingerprint, pattern, sample_error,
    sample_letter_id, first_letter_at)
VALUES ('award-points', :'queue', 'exhausted', core.error_fingerprint('exhausted', :'error'),
        core.masked_error(:'error'), :'error', gen_random_uuid(), now() - interval '1 hour')
RETURNING id AS group_id \gset
INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload, body,
    attempts, error_kind, last_error, correlation_id, created_at, group_id)
SELECT job, '00000000-0000-0000-0000-000000000001', 'award-points', :'queue', 'm-' || :'queue' || '-' || i,
       jsonb_build_object('job_id', job, 'tenant_id', '00000000-0000-0000-0000-000000000001',
           'correlation_id', 'c-' || i, 'payload', jsonb_build_object('account_id', 'acct-' || (i % 1000), 'points', 1 + i % 100)),
       json_build_object('job_id', job, 'tenant_id', '00000000-0000-0000-0000-000000000001',
           'correlation_id', 'c-' || i, 'payload', json_build_object('account_id', 'acct-' || (i % 1000), 'points', 1 + i % 100))::text,
       5, 'exhausted', :'error', 'c-' || i,
       now() - ((:n - i) * (interval '1 hour' / :n)), :group_id
FROM (SELECT i, gen_random_uuid() AS job FROM generate_series(1, :n) AS i) AS s;
INSERT INTO core.dead_letter_group_tallies (group_id, stripe, letters, pending, last_letter_at, last_error)
VALUES (:group_id, 0, :n, :n, now(), :'error');
SET session_replication_role = DEFAULT;
VACUUM ANALYZE core.dead_letters, core.dead_letter_groups, core.dead_letter_group_tallies;
