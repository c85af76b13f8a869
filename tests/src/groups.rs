//! What every failure-group test checks: each group's counts, as the API reads them, against
//! its letters, and one open group per failure.

use sqlx::PgPool;

/// Each group's counts as read (`core.dead_letter_groups_counted`) equal a count of its
/// letters, and it is open exactly while it has a pending letter.
pub async fn counts_match_letters(pool: &PgPool) {
    let rows: Vec<(i64, i64, i64, i64, i64, bool)> = sqlx::query_as(
        "SELECT g.id, g.letter_count, g.pending_count,
                (SELECT count(*) FROM core.dead_letters d WHERE d.group_id = g.id),
                (SELECT count(*) FROM core.dead_letters d WHERE d.group_id = g.id AND d.status = 'pending_review'),
                g.resolved_at IS NULL
         FROM core.dead_letter_groups_counted g ORDER BY g.id",
    )
    .fetch_all(pool)
    .await
    .expect("reading the groups");
    for (id, letters, pending, counted, counted_pending, open) in rows {
        assert_eq!(
            (letters, pending),
            (counted, counted_pending),
            "group {id}'s counts as read against its letters"
        );
        assert_eq!(
            open,
            pending > 0,
            "group {id} is open exactly while it has a pending letter"
        );
    }
}

/// No failure has two open groups.
pub async fn one_open_group_per_failure(pool: &PgPool) {
    let doubled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT 1 FROM core.dead_letter_groups WHERE resolved_at IS NULL
           GROUP BY consumer, queue, error_kind, fingerprint HAVING count(*) > 1) x",
    )
    .fetch_one(pool)
    .await
    .expect("reading the open groups");
    assert_eq!(doubled, 0, "one open group per failure");
}

/// How many rows of `core.dead_letters` the transaction on `conn` has read so far (scanned or
/// fetched through an index): what its statements cost the table, whatever plans they ran.
pub async fn letters_read(conn: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
           FROM pg_stat_xact_user_tables WHERE relid = 'core.dead_letters'::regclass",
    )
    .fetch_one(conn)
    .await
    .expect("the transaction's reads of core.dead_letters")
}
