//! A letter's replay, as received or edited: checked under the letter's lock, recorded, then
//! sent. The verdict commits before anything is sent, so a message is never out while the letter
//! could still be discarded or left pending; a refused send leaves the replay `queued` for the
//! scheduled run. An edit's dry run answers with the plan and changes nothing.

use super::edit::Edit;
use super::error::ApiError;
use super::pending::lock_pending;
use super::{Api, ApiResponse, Route, ok};
use serde_json::{Value, json};
use shared::dead_letter::{self, DeadLetter, LockedLetter, ReplayOutcome, Verdict};
use shared::ids::{DeadLetterId, JobId};
use shared::replay::Replayer;

/// A replay checked under the letter's lock: what it sends, and whether the job has committed.
struct Plan {
    job_id: JobId,
    /// The edited body, if edited.
    body: Option<String>,
    /// The job's fence exists: its effect has committed, and nothing is sent.
    fence_exists: bool,
}

/// What the send did: the answer's status, the replay's message, and what it means.
struct Sent {
    status: u16,
    message_id: Option<String>,
    effect: &'static str,
}

impl Sent {
    fn new(status: u16, message_id: Option<String>, effect: &'static str) -> Self {
        Self {
            status,
            message_id,
            effect,
        }
    }
}

/// Replays the letter, as received or with `edit`'s body (checked against the letter under its
/// lock): check, answer a dry run, record, send, answer.
pub(super) async fn replay(
    api: &Api,
    route: &Route,
    id: DeadLetterId,
    actor: &str,
    reason: Option<String>,
    edit: Option<&Edit>,
) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let Some(replayer) = api.replayer.as_ref() else {
        return Err(ApiError::internal(
            route.path,
            &"replay route without an SQS client",
        ));
    };
    let mut locked = lock_pending(api, route, id).await?;
    let plan = plan(&mut locked, edit)
        .await
        .map_err(|e| e.or_database(route))?;
    if edit.is_some_and(|e| e.dry_run) {
        // Nothing is marked: dropping the lock rolls its transaction back.
        return ok(dry_run(&locked.letter, &plan));
    }
    let outcome = match plan.fence_exists {
        true => ReplayOutcome::AlreadyProcessed,
        false => ReplayOutcome::Queued,
    };
    let body = plan.body.clone();
    let verdict = Verdict::Replayed {
        outcome,
        reason,
        body,
    };
    locked
        .mark(&verdict, actor, api.clock.now())
        .await
        .map_err(db)?;
    let letter = locked.commit().await.map_err(db)?;
    let (letter, sent) = send(api, route, replayer, letter, plan.fence_exists).await;
    // `message_id` is the replay's SQS message; absent while the replay is queued.
    tracing::info!(letter = %id, job_id = %plan.job_id, actor, message_id = sent.message_id.as_deref(),
        queued = sent.message_id.is_none(), fence_exists = plan.fence_exists,
        edited = plan.body.is_some(), "dead letter replayed");
    Ok(answer(&letter, &plan, sent))
}

/// Why a replay is refused: the API's answer, or the database's failure.
enum Refused {
    Api(ApiError),
    Database(sqlx::Error),
}

impl Refused {
    fn or_database(self, route: &Route) -> ApiError {
        match self {
            Self::Api(e) => e,
            Self::Database(e) => ApiError::database(route.path, &e),
        }
    }
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl From<sqlx::Error> for Refused {
    fn from(e: sqlx::Error) -> Self {
        Self::Database(e)
    }
}

/// Checks the locked letter can be replayed as asked, and what the replay would send.
async fn plan(locked: &mut LockedLetter, edit: Option<&Edit>) -> Result<Plan, Refused> {
    let job_id = replayable(locked).await?;
    let body = edit
        .map(|edit| edit.checked_against(&locked.letter))
        .transpose()?;
    // The fence of a job with a pending letter is never swept, so this answer holds at any age.
    let fence_exists = locked.fence_exists().await?.unwrap_or(false);
    // What SQS would refuse is refused here, before anything is recorded: a replay queued that
    // no send can deliver would stay queued for ever. The letter stays pending.
    let sent = body
        .clone()
        .unwrap_or_else(|| shared::replay::letter_body(&locked.letter));
    let refused = (!fence_exists).then(|| shared::replay::refused_by_sqs(&locked.letter.id, &sent));
    if let Some(why) = refused.flatten() {
        return Err(Refused::Api(match edit {
            Some(_) => ApiError::invalid_body(format!(
                "the edited envelope cannot be sent: {why}; the letter stays pending"
            )),
            None => ApiError::conflict(
                "not_sendable",
                format!(
                    "the letter's body cannot be sent as a replay: {why}; edit it \
                     (POST …/edit) or discard it with a reason; the letter stays pending"
                ),
            ),
        }));
    }
    Ok(Plan {
        job_id,
        body,
        fence_exists,
    })
}

/// The letter's job id, unless a replay could apply another job or this one twice
/// ([`shared::replay::replayable`]).
async fn replayable(locked: &mut LockedLetter) -> Result<JobId, Refused> {
    let another_job = locked.fence_is_another_job().await?;
    shared::replay::replayable(&locked.letter, another_job)
        .map_err(|not| Refused::Api(ApiError::conflict("not_replayable", not.why())))
}

/// A dry run's answer: the plan, nothing changed.
fn dry_run(letter: &DeadLetter, plan: &Plan) -> Value {
    let body = plan.body.as_deref().map(serde_json::from_str::<Value>);
    json!({
        "dry_run": true,
        "letter": letter,
        "replay": {
            "job_id": plan.job_id,
            "queue": letter.queue,
            "fence_exists": plan.fence_exists,
            "body": body.transpose().ok().flatten(),
            "effect": if plan.fence_exists {
                "none: the job's effect has committed (its fence exists), so nothing would be sent"
            } else {
                "would send the edited body under the same job_id: the consumer runs it at most once"
            },
        }
    })
}

/// Sends the recorded replay, unless the job has committed, and records its message id.
async fn send(
    api: &Api,
    route: &Route,
    replayer: &Replayer,
    letter: DeadLetter,
    fence_exists: bool,
) -> (DeadLetter, Sent) {
    if fence_exists {
        let effect = "none: the job's effect has committed (its fence exists), so nothing was sent";
        return (letter, Sent::new(200, None, effect));
    }
    let id = letter.id;
    match replayer.send(&letter).await {
        Ok(sent) => {
            let letter = record_sent(api, letter, &sent.message_id).await;
            let effect =
                "sent: the job has no fence yet, so the consumer will run it, at most once";
            (letter, Sent::new(200, Some(sent.message_id), effect))
        }
        Err(cause) => {
            tracing::error!(route = route.path, letter = %id, error = %cause,
                "replay recorded but not sent; the scheduled run will send it");
            let effect = "queued: the replay is recorded but the queue refused it just now; the \
                          scheduled function sends it on its next run";
            (letter, Sent::new(202, None, effect))
        }
    }
}

/// Records the message id a sent replay got; the letter as it is then.
async fn record_sent(api: &Api, letter: DeadLetter, message_id: &str) -> DeadLetter {
    let id = letter.id;
    let recorded = dead_letter::record_replay_sent(&api.pool, id, message_id, api.clock.now());
    match recorded.await {
        Ok(updated) => updated.unwrap_or(letter),
        Err(e) => {
            tracing::error!(letter = %id, message_id, error = %e,
                "replay sent, but recording its message id failed; the scheduled run may send \
                 it again (the fence makes that harmless)");
            letter
        }
    }
}

/// The replay's answer.
fn answer(letter: &DeadLetter, plan: &Plan, sent: Sent) -> ApiResponse {
    ApiResponse {
        status: sent.status,
        body: json!({
            "letter": letter,
            "replay": {
                "job_id": plan.job_id,
                "queue": letter.queue,
                "message_id": sent.message_id,
                "sent": sent.message_id.is_some(),
                "fence_exists": plan.fence_exists,
                "edited": plan.body.is_some(),
                "effect": sent.effect,
            }
        }),
    }
}
