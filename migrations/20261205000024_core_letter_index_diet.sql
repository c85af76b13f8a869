-- A letter costs what it must (issue 36): two partial indexes of pending letters duplicated
-- indexes that serve the same queries, and every pending letter paid for them at its insert.
-- `dead_letters_status_created_idx` (status, created_at DESC, id DESC) answers the oldest pending
-- letter and the pending count; `dead_letters_job_idx` (job_id, consumer) answers a job's pending
-- letter (a job has a handful of letters at most). Every index left is named in docs/scale.md by
-- the query that needs it.
DROP INDEX core.dead_letters_pending_idx;
DROP INDEX core.dead_letters_pending_job_idx;
