//! Processes one SQS batch of messages (their bodies are the arguments) with
//! [`e2e::FailAfterWork`]`(…, Hang)` against `DATABASE_URL`, in `COMMIT_MODE` (`per-job`, the
//! default, or `batch`), so a test can SIGKILL it between the work and the commit.

use consumer::AwardPoints;
use shared::harness::{CommitMode, IncomingMessage};

#[tokio::main]
async fn main() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL: is not set");
    let mode = std::env::var("COMMIT_MODE")
        .ok()
        .and_then(|m| CommitMode::parse(&m))
        .unwrap_or_default();
    let msgs: Vec<IncomingMessage> = std::env::args()
        .skip(1)
        .enumerate()
        .map(|(i, body)| IncomingMessage {
            message_id: format!("m-{i}"),
            queue: "q".into(),
            body,
            receive_count: 1,
            replay_of: None,
            message_group: None,
            trace: Default::default(),
        })
        .collect();
    assert!(!msgs.is_empty(), "usage: hang-after-work <message body>…");
    let pool = sqlx::PgPool::connect(&url).await.expect("connect");
    let consumer = e2e::FailAfterWork(AwardPoints::new(e2e::consumer_name()), e2e::AfterWork::Hang);
    let outcome = e2e::harness_in(pool, consumer, mode)
        .process_batch(&msgs, &|| true, 1)
        .await;
    eprintln!("unexpectedly finished: {outcome:?}");
    std::process::exit(3);
}
