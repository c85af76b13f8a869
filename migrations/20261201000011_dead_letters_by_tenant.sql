-- no-transaction
-- Letters of one tenant, newest first (see 0010 for why CONCURRENTLY, alone in its file).
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_tenant_created_idx
    ON core.dead_letters (tenant_id, created_at DESC, id DESC);
