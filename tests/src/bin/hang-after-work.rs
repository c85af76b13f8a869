//! Processes one message (its body is the first argument) with
//! [`e2e::FailAfterWork`]`(…, Hang)` against `DATABASE_URL`, so a test can SIGKILL it between
//! the work and the commit.

use consumer::AwardPoints;
use shared::harness::IncomingMessage;

#[tokio::main]
async fn main() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL: is not set");
    let body = std::env::args()
        .nth(1)
        .expect("usage: hang-after-work <message body>");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let consumer = e2e::FailAfterWork(AwardPoints::new(e2e::consumer_name()), e2e::AfterWork::Hang);
    let msg = IncomingMessage {
        message_id: "m-1".into(),
        queue: "q".into(),
        body,
        receive_count: 1,
        replay_of: None,
    };
    let outcome = e2e::harness(pool, consumer).process(&msg).await;
    eprintln!("unexpectedly finished: {outcome:?}");
    std::process::exit(3);
}
