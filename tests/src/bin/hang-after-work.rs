//! Processes one message (its body is the first argument) with [`e2e::HangAfterWork`] against
//! `DATABASE_URL`, so that a test can SIGKILL it between the work and the commit.

use rand::SeedableRng;
use shared::clock::SystemClock;
use shared::harness::{Harness, HarnessSettings, IncomingMessage};
use shared::ids::ConsumerName;
use shared::reference::AwardPoints;
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL: is not set");
    let body = std::env::args()
        .nth(1)
        .expect("usage: hang-after-work <message body>");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let consumer = e2e::HangAfterWork(AwardPoints::new(ConsumerName::new("award-points").unwrap()));
    let settings = HarnessSettings {
        policy: Default::default(),
        fence_ttl: Duration::from_secs(7 * 86_400),
        lock_timeout: Duration::from_secs(2),
        contended_retry_after: Duration::from_secs(2),
    };
    let harness = Harness::new(
        consumer,
        pool,
        settings,
        Arc::new(SystemClock),
        rand::rngs::StdRng::seed_from_u64(1),
    );
    let msg = IncomingMessage {
        message_id: "m-1".into(),
        queue: "q".into(),
        body,
        receive_count: 1,
        replay_of: None,
    };
    let outcome = harness.process(&msg).await;
    eprintln!("unexpectedly finished: {outcome:?}");
    std::process::exit(3);
}
