//! Redeems a reward: one row in `rewards.redemptions` per job, applied once by the harness's
//! fence. Written with only what `docs/consumers.md` teaches.
//!
//! Its queue fails fast (see `template.yaml`: 3 attempts, base 10 s, cap 60 s, with the
//! rationale): a member waits at the counter for a redemption, so one that has not gone
//! through within about two minutes is better as a letter an operator replays than as a late
//! surprise.

use serde::Deserialize;
use shared::consumer::{Consumer, Job, ProcessError};
use shared::ids::{ConsumerName, JobId};
use sqlx::migrate::Migrator;
use sqlx::{PgConnection, PgExecutor};
use std::sync::LazyLock;

/// This consumer's migrations (schema `rewards`).
pub static MIGRATOR: LazyLock<Migrator> =
    LazyLock::new(|| shared::own_migrations(sqlx::migrate!("./migrations"), "rewards"));

/// The core schema's migrations and this consumer's: a test database of this consumer.
pub static MIGRATOR_WITH_CORE: LazyLock<Migrator> =
    LazyLock::new(|| shared::with_core_migrations(&MIGRATOR));

/// A redemption.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Redemption {
    /// The account whose points pay.
    pub account_id: String,
    /// The reward.
    pub reward_sku: String,
    /// Its price in points; positive.
    pub cost_points: i64,
}

/// The consumer.
#[derive(Debug, Clone)]
pub struct RedeemReward {
    name: ConsumerName,
}

impl RedeemReward {
    /// A consumer fencing under `name`.
    pub fn new(name: ConsumerName) -> Self {
        Self { name }
    }
}

impl Consumer for RedeemReward {
    type Payload = Redemption;

    fn name(&self) -> &ConsumerName {
        &self.name
    }

    async fn handle(
        &self,
        job: &Job<Redemption>,
        tx: &mut PgConnection,
    ) -> Result<(), ProcessError> {
        let r = &job.envelope.payload;
        if r.cost_points <= 0 {
            return Err(ProcessError::poison(format!(
                "cost_points must be positive, got {}",
                r.cost_points
            )));
        }
        if r.account_id.trim().is_empty() || r.reward_sku.trim().is_empty() {
            return Err(ProcessError::poison(
                "account_id and reward_sku must not be blank",
            ));
        }
        sqlx::query!(
            "INSERT INTO rewards.redemptions (job_id, tenant_id, account_id, reward_sku, cost_points, redeemed_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
            job.envelope.job_id.0,
            job.envelope.tenant_id.0,
            r.account_id.as_str(),
            r.reward_sku.as_str(),
            r.cost_points,
            job.started_at,
        )
        .execute(&mut *tx)
        .await?;
        // A metric of its own, beside the harness's (counted per execution that got this far).
        job.count("PointsRedeemed", r.cost_points.unsigned_abs());
        Ok(())
    }
}

/// How many redemptions `job_id` has: 1 once processed, never more.
pub async fn count_redemptions(db: impl PgExecutor<'_>, job_id: JobId) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM rewards.redemptions WHERE job_id = $1"#,
        job_id.0,
    )
    .fetch_one(db)
    .await
}
