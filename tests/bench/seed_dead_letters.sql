-- The API benchmark's table: :n dead letters over 5 queues and 5 consumers, all four kinds (5%
-- poison), 70% pending review, spread over about 90 days; columns independent (hashed), so
-- filter combinations are as selective as their product. Seeded only when the count differs (or
-- the letters predate their groups), so repeated runs reuse it. Triggers are off for the seed
-- (session_replication_role = replica): the grouping trigger is not what is measured (the groups
-- are made afterwards, one per queue, consumer and kind: 100 of about 10,000 letters), and the
-- append-only guard would refuse the reset. Superuser only, and only in the benchmark's own
-- database.
SELECT count(*) <> :n OR bool_or(group_id IS NULL) AS reseed FROM core.dead_letters \gset
\if :reseed
\echo seeding :n dead letters (a minute or two)
SET session_replication_role = replica;
TRUNCATE core.dead_letter_group_escalations, core.dead_letter_escalations, core.dead_letter_alerts,
    core.dead_letter_group_tallies, core.dead_letters, core.dead_letter_groups;
INSERT INTO core.dead_letters (job_id, tenant_id, consumer, queue, message_id, payload, attempts,
    error_kind, last_error, correlation_id, status, discard_reason, reviewed_by, reviewed_at, created_at)
SELECT job, tenant, 'consumer-' || (h_consumer % 5), 'bench-queue-' || (h_queue % 5), 'm-' || i,
       jsonb_build_object('job_id', job, 'tenant_id', tenant, 'correlation_id', 'c-' || i,
           'payload', jsonb_build_object('account_id', 'acct-' || (i % 1000), 'points', 1 + i % 100)),
       CASE WHEN kind = 'poison' THEN 1 ELSE 5 END,
       kind,
       'ledger service refused the award for account acct-' || (i % 1000)
           || ' after 30000 ms: 503 Service Unavailable (upstream connect error or disconnect/reset before headers)',
       'c-' || i,
       status,
       CASE WHEN status = 'discarded' THEN 'benchmark seed' END,
       CASE WHEN status <> 'pending_review' THEN 'bench' END,
       CASE WHEN status <> 'pending_review' THEN created + interval '1 hour' END,
       created
FROM (
    SELECT i, gen_random_uuid() AS job, gen_random_uuid() AS tenant,
           (hashtext('q' || i) & 65535) AS h_queue, (hashtext('c' || i) & 65535) AS h_consumer,
           CASE WHEN (hashtext('k' || i) & 65535) % 20 = 0 THEN 'poison'
                WHEN (hashtext('k' || i) & 65535) % 20 < 6 THEN 'permanent'
                WHEN (hashtext('k' || i) & 65535) % 20 < 10 THEN 'crashed'
                ELSE 'exhausted' END AS kind,
           CASE WHEN (hashtext('s' || i) & 65535) % 10 < 7 THEN 'pending_review'
                WHEN (hashtext('s' || i) & 65535) % 10 < 9 THEN 'replayed'
                ELSE 'discarded' END AS status,
           now() - ((:n - i) * interval '7.7 seconds') AS created
    FROM generate_series(1, :n) AS i
) AS s;
INSERT INTO core.dead_letter_groups (consumer, queue, error_kind, fingerprint, pattern, sample_error,
    sample_letter_id, first_letter_at, resolved_at)
SELECT consumer, queue, error_kind, core.error_fingerprint(error_kind, min(last_error)),
       core.masked_error(min(last_error)), min(last_error), (array_agg(id))[1], min(created_at),
       CASE WHEN count(*) FILTER (WHERE status = 'pending_review') = 0 THEN max(created_at) END
FROM core.dead_letters GROUP BY consumer, queue, error_kind;
INSERT INTO core.dead_letter_group_tallies (group_id, stripe, letters, pending, last_letter_at, last_error)
SELECT g.id, 0, count(*), count(*) FILTER (WHERE d.status = 'pending_review'), max(d.created_at), max(d.last_error)
FROM core.dead_letters d JOIN core.dead_letter_groups g
  ON g.consumer = d.consumer AND g.queue = d.queue AND g.error_kind = d.error_kind
GROUP BY g.id;
UPDATE core.dead_letters d SET group_id = g.id FROM core.dead_letter_groups g
WHERE g.consumer = d.consumer AND g.queue = d.queue AND g.error_kind = d.error_kind;
SET session_replication_role = DEFAULT;
VACUUM ANALYZE core.dead_letters, core.dead_letter_groups;
\endif
