//! The operations, after routing and authorization.
//!
//! Invariant: input is validated before the first query; a review changes a row only through
//! [`shared::dead_letter`]'s lock-check-mark-commit. A replay commits its verdict before it sends, so
//! a message is never out while the letter says otherwise; a refused send leaves the replay
//! `queued` for the scheduled run.

use super::error::ApiError;
use super::list_query::{
    a_group_id, encode_cursor, encode_group_cursor, parse_group_query, parse_list_query, shown,
};
use super::pending::{lock_pending, not_found};
use super::reason::{MAX_REASON_CHARS, parse_reason, parse_replay_reason};
use super::replay::replay;
use super::{Api, ApiRequest, ApiResponse, Operation, Route, ok, operations};
use serde_json::{Value, json};
use shared::dead_letter::{self, Verdict};
use shared::ids::{ConsumerName, DeadLetterId, GroupId, JobId};
use shared::operations::Action;

/// The largest replay or discard body, in bytes: a reason of [`super::reason::MAX_REASON_CHARS`] characters,
/// each written as a JSON escape pair (12 bytes), fits with room to spare.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

pub(super) async fn run(
    api: &Api,
    route: &Route,
    id: Option<&str>,
    actor: Option<&str>,
    request: &ApiRequest,
) -> Result<ApiResponse, ApiError> {
    let actor = actor.unwrap_or_default();
    match route.operation {
        Operation::List => list(api, route, request).await,
        Operation::Get => get(api, route, parse_id(id)?).await,
        Operation::Replay => {
            let id = parse_id(id)?;
            let reason = parse_replay_reason(bounded(&request.body)?)?;
            replay(api, route, id, actor, reason, None).await
        }
        Operation::Edit => {
            let id = parse_id(id)?;
            let edit = super::edit::parse_edit(&request.body)?;
            let reason = Some(edit.reason.clone());
            replay(api, route, id, actor, reason, Some(&edit)).await
        }
        Operation::Discard => {
            let id = parse_id(id)?;
            let reason = parse_reason(bounded(&request.body)?)?;
            discard(api, route, id, actor, reason).await
        }
        Operation::Withdraw => {
            let id = parse_id(id)?;
            let reason = parse_reason(bounded(&request.body)?)?;
            withdraw(api, route, id, actor, reason).await
        }
        Operation::ListGroups => list_groups(api, route, request).await,
        Operation::GetGroup => {
            let id = a_group_id("id", id.unwrap_or_default())?;
            get_group(api, route, id).await
        }
        Operation::GetProcessedJob => {
            let job_id = parse_job_id(id)?;
            let consumer = parse_consumer(&request.query)?;
            get_processed_job(api, route, job_id, &consumer).await
        }
        Operation::StartReplayOperation => {
            operations::start(api, route, Action::Replay, actor, request).await
        }
        Operation::StartDiscardOperation => {
            operations::start(api, route, Action::Discard, actor, request).await
        }
        Operation::ListOperations => operations::list(api, route, request).await,
        Operation::GetOperation => {
            operations::get(api, route, uuid_in_path("operation", id)?).await
        }
        Operation::CancelOperation => {
            let id = uuid_in_path("operation", id)?;
            operations::cancel(api, route, id, request).await
        }
    }
}

fn parse_job_id(id: Option<&str>) -> Result<JobId, ApiError> {
    uuid_in_path("job", id).map(JobId)
}

/// `?consumer=<name>`, once, and nothing else.
fn parse_consumer(query: &[(String, String)]) -> Result<ConsumerName, ApiError> {
    if let Some((other, _)) = query.iter().find(|(k, _)| k != "consumer") {
        return Err(ApiError::invalid_parameter(format!(
            "unknown parameter {}: this route takes only consumer",
            shown(other)
        )));
    }
    match query {
        [(_, name)] => ConsumerName::new(name.as_str()).map_err(|problem| {
            ApiError::invalid_parameter(format!("consumer {}: {problem}", shown(name)))
        }),
        [] => Err(ApiError::invalid_parameter(
            "consumer is required: the fence is per consumer (?consumer=award-points)",
        )),
        _ => Err(ApiError::invalid_parameter(
            "consumer is given more than once",
        )),
    }
}

/// The job's fence for `consumer`: it committed, and until when a copy is a duplicate.
async fn get_processed_job(
    api: &Api,
    route: &Route,
    job_id: JobId,
    consumer: &ConsumerName,
) -> Result<ApiResponse, ApiError> {
    let fence = shared::fence::processed_job(&api.pool, job_id, consumer)
        .await
        .map_err(|e| ApiError::database(route.path, &e))?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "job {job_id} has no fence for {consumer}: it has not committed there (or its \
                 fence expired, after its TTL)"
            ))
        })?;
    ok(json!({"processed_job": fence}))
}

fn parse_id(id: Option<&str>) -> Result<DeadLetterId, ApiError> {
    uuid_in_path("letter", id).map(DeadLetterId)
}

/// The `what` id in the path, a UUID.
fn uuid_in_path(what: &str, id: Option<&str>) -> Result<uuid::Uuid, ApiError> {
    let id = id.unwrap_or_default();
    uuid::Uuid::try_parse(id).map_err(|_| {
        ApiError::invalid_parameter(format!(
            "the {what} id in the path must be a UUID such as 0b7e5f6e-2c4d-4f7a-9d1e-3a5b7c9d1e2f, got {}",
            shown(id)
        ))
    })
}

/// The body, if it is no larger than [`MAX_BODY_BYTES`].
pub(super) fn bounded(body: &[u8]) -> Result<&[u8], ApiError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::body_too_large(format!(
            "the body is {} bytes; a review's body is {{\"reason\": \"...\"}} of at most \
             {MAX_BODY_BYTES} bytes (a reason of at most {MAX_REASON_CHARS} characters)",
            body.len()
        )));
    }
    Ok(body)
}

async fn list(api: &Api, route: &Route, request: &ApiRequest) -> Result<ApiResponse, ApiError> {
    let query = parse_list_query(&request.query)?;
    let items = dead_letter::list_letters(&api.pool, &query.filter, query.after, query.limit + 1)
        .await
        .map_err(|e| ApiError::database(route.path, &e))?;
    page(items, query.limit, |last| encode_cursor(last.position()))
}

/// One page of a list fetched with one row beyond `limit`: the rows, and the cursor after the
/// last of them when that extra row says there are more.
fn page<T: serde::Serialize>(
    mut items: Vec<T>,
    limit: u32,
    cursor: impl Fn(&T) -> String,
) -> Result<ApiResponse, ApiError> {
    let next_cursor = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items.last().map(cursor)
    } else {
        None
    };
    ok(json!({"items": items, "next_cursor": next_cursor, "limit": limit}))
}

async fn list_groups(
    api: &Api,
    route: &Route,
    request: &ApiRequest,
) -> Result<ApiResponse, ApiError> {
    let query = parse_group_query(&request.query)?;
    let items = dead_letter::list_groups(&api.pool, &query.filter, query.after, query.limit + 1)
        .await
        .map_err(|e| ApiError::database(route.path, &e))?;
    page(items, query.limit, |last| {
        encode_group_cursor(last.position())
    })
}

async fn get_group(api: &Api, route: &Route, id: GroupId) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let group = dead_letter::group(&api.pool, id)
        .await
        .map_err(db)?
        .ok_or_else(|| ApiError::not_found(format!("there is no failure group {id}")))?;
    let failed_replays: Vec<Value> = dead_letter::groups_of_failed_replays(&api.pool, id)
        .await
        .map_err(db)?
        .into_iter()
        .map(|(group_id, letters)| json!({"group_id": group_id, "letters": letters}))
        .collect();
    ok(json!({"group": group, "failed_replays": failed_replays}))
}

async fn get(api: &Api, route: &Route, id: DeadLetterId) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let letter = dead_letter::letter(&api.pool, id)
        .await
        .map_err(db)?
        .ok_or_else(|| not_found(id))?;
    let fence_exists = dead_letter::letter_fence_exists(&api.pool, &letter)
        .await
        .map_err(db)?;
    let failed_replays = dead_letter::replays_of(&api.pool, id).await.map_err(db)?;
    // The body exactly as received (the letter's `payload` is jsonb: keys reordered, numbers
    // rewritten), what an edit starts from.
    let body = letter.body.clone();
    ok(
        json!({"letter": letter, "fence_exists": fence_exists, "failed_replays": failed_replays,
              "body": body}),
    )
}

async fn discard(
    api: &Api,
    route: &Route,
    id: DeadLetterId,
    actor: &str,
    reason: String,
) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let mut locked = lock_pending(api, route, id).await?;
    locked
        .mark(&Verdict::Discarded { reason }, actor, api.clock.now())
        .await
        .map_err(db)?;
    let letter = locked.commit().await.map_err(db)?;
    tracing::info!(letter = %id, job_id = letter.job_id.map(tracing::field::display),
        correlation_id = letter.correlation_id.as_deref(), actor, "dead letter discarded");
    ok(json!({ "letter": letter }))
}

/// Withdraws the letter's queued replay (one no queue has accepted: the queue is gone, or SQS
/// refuses the message) and puts its job back to review as a new pending letter, which the
/// answer names; a letter without a queued replay is a 409 naming what it has.
async fn withdraw(
    api: &Api,
    route: &Route,
    id: DeadLetterId,
    actor: &str,
    reason: String,
) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let now = api.clock.now();
    let withdrawal = dead_letter::withdraw_replay(&api.pool, id, actor, &reason, now)
        .await
        .map_err(db)?;
    let letter = dead_letter::letter(&api.pool, id)
        .await
        .map_err(db)?
        .ok_or_else(|| not_found(id))?;
    let (pending, effect) = match withdrawal {
        dead_letter::Withdrawal::Withdrawn(pending) => (
            Some(pending),
            "withdrawn: the job is pending review again as pending_letter",
        ),
        dead_letter::Withdrawal::AlreadyProcessed => (
            None,
            "withdrawn, and the job's fence shows it committed (the replay reached its queue \
             after all, or a copy ran): nothing is left to review",
        ),
        dead_letter::Withdrawal::NotQueued => {
            return Err(ApiError::conflict(
                "not_queued",
                format!(
                    "the letter is {}{}: only a replay recorded but not yet accepted by its \
                     queue (replay_outcome queued) can be withdrawn",
                    letter.status,
                    letter
                        .replay_outcome
                        .map(|o| format!(", its replay {o}"))
                        .unwrap_or_default()
                ),
            ));
        }
    };
    tracing::info!(letter = %id, pending_letter = pending.map(tracing::field::display),
        job_id = letter.job_id.map(tracing::field::display), actor, "queued replay withdrawn");
    ok(json!({ "letter": letter, "pending_letter": pending, "effect": effect }))
}
