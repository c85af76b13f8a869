-- The partial indexes of 0033-0035 take the place (and the name) of the whole ones: a letter
-- without a tenant, a correlation id or a job id writes no entry for it. Each query that reads
-- them names the column with `=` (docs/scale.md: the query each index serves), which implies
-- IS NOT NULL, so the planner takes the partial index wherever it took the whole one.
DROP INDEX core.dead_letters_tenant_created_idx;
ALTER INDEX core.dead_letters_tenant_known_idx RENAME TO dead_letters_tenant_created_idx;
DROP INDEX core.dead_letters_correlation_created_idx;
ALTER INDEX core.dead_letters_correlation_known_idx RENAME TO dead_letters_correlation_created_idx;
DROP INDEX core.dead_letters_job_idx;
ALTER INDEX core.dead_letters_job_known_idx RENAME TO dead_letters_job_idx;
