-- The operators' list endpoint filters by any of status, queue, consumer and error kind, newest
-- first with a keyset on (created_at, id). Each filter gets an index that serves its order
-- directly, so a page costs its limit in rows, not a scan of a million-row table.
-- (created_at, id) alone, status and (queue, status) are indexed since 0002.
CREATE INDEX dead_letters_queue_only_created_idx ON core.dead_letters (queue, created_at DESC, id DESC);
CREATE INDEX dead_letters_consumer_created_idx   ON core.dead_letters (consumer, created_at DESC, id DESC);
CREATE INDEX dead_letters_kind_created_idx       ON core.dead_letters (error_kind, created_at DESC, id DESC);
-- "Which letters did replays of this one produce?" on the detail endpoint.
CREATE INDEX dead_letters_replay_of_idx          ON core.dead_letters (replay_of) WHERE replay_of IS NOT NULL;
