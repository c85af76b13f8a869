-- bench-storm's starting point, before every run: no fences, awards, execution ledger, letters
-- failure groups or received letters (nor what refers to a letter), so that a run's rows are counted whole and a
-- storm's letters must open exactly one group. Triggers are off for the reset
-- (session_replication_role = replica: the append-only guard would refuse it). Superuser only,
-- and only in a database of its own (jobs_bench_storm, or the throwaway primary): never
-- jobs_bench, whose seeded letters the API benchmark reads.
SET session_replication_role = replica;
TRUNCATE core.processed_jobs, reference.point_awards, core.job_executions,
    core.dead_letter_group_escalations, core.dead_letter_escalations, core.dead_letter_alerts,
    core.replay_sends, core.dead_letter_group_tallies, core.dead_letters, core.dead_letter_groups,
    core.letter_intake;
SET session_replication_role = DEFAULT;
