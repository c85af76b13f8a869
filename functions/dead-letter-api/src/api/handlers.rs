//! The operations, after routing and authorization.
//!
//! Invariant: input is validated before the first query; a review changes a row only through
//! [`shared::dead_letter`]'s lock-check-mark-commit. A replay commits its verdict before it sends, so
//! a message is never out while the letter says otherwise; a refused send leaves the replay
//! `queued` for the scheduled run.

use super::edit::Edit;
use super::error::ApiError;
use super::list_query::{
    a_group_id, encode_cursor, encode_group_cursor, parse_group_query, parse_list_query, shown,
};
use super::{Api, ApiRequest, ApiResponse, Operation, Route};
use serde_json::{Value, json};
use shared::dead_letter::{self, ErrorKind, LockedLetter, ReplayOutcome, ReviewStatus, Verdict};
use shared::ids::{ConsumerName, DeadLetterId, GroupId, JobId};

/// The longest reason (discard or replay), in characters, after trimming.
pub const MAX_REASON_CHARS: usize = 1000;
/// The largest replay or discard body, in bytes: a reason of [`MAX_REASON_CHARS`] characters,
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

fn ok(body: Value) -> Result<ApiResponse, ApiError> {
    Ok(ApiResponse { status: 200, body })
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
fn bounded(body: &[u8]) -> Result<&[u8], ApiError> {
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

/// Replays the letter, as received or with `edit`'s body (checked against the letter under its
/// lock); an edit's dry run answers with the plan and changes nothing.
async fn replay(
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
    if locked.letter.error_kind == ErrorKind::Unsettled {
        return Err(ApiError::conflict(
            "not_replayable",
            "this copy arrived after its job's fence could have expired, so whether the job \
             committed cannot be known and a replay could apply it twice; check the effect by \
             hand, then discard the letter with a reason",
        ));
    }
    let Some(job_id) = locked.letter.job_id else {
        return Err(ApiError::conflict(
            "not_replayable",
            "this letter is a poison message without a readable job_id, so a replay could not be \
             deduplicated; fix and republish it by hand, then discard it with a reason",
        ));
    };
    // Another job under the id is what the fence says, not what the letter's kind said when it
    // was written: a conflict letter of a body of the committed job's family of edits (a copy
    // that raced the edit's commit) is the job's, done, and a replay sends nothing. Only a
    // conflict letter without a digest is taken at its word.
    let another_job = match (locked.letter.error_kind, &locked.letter.job_digest) {
        (ErrorKind::Conflict, None) => true,
        _ => locked.fence_is_another_job().await.map_err(db)?,
    };
    if another_job {
        return Err(ApiError::conflict(
            "not_replayable",
            "another job committed under this letter's job_id (its fence keeps another payload's \
             digest): this job never ran, and a replay would be taken for the other; send it \
             under a new job_id, then discard this letter with a reason",
        ));
    }
    let body = edit
        .map(|edit| edit.checked_against(&locked.letter))
        .transpose()?;
    // The fence of a job with a pending letter is never swept, so this answer holds at any age.
    let fence_exists = locked.fence_exists().await.map_err(db)?.unwrap_or(false);
    // What SQS would refuse is refused here, before anything is recorded: a replay queued that
    // no send can deliver would stay queued for ever. The letter stays pending.
    let sent = body
        .clone()
        .unwrap_or_else(|| shared::replay::letter_body(&locked.letter));
    if let Some(why) = (!fence_exists)
        .then(|| shared::replay::refused_by_sqs(&locked.letter.id, &sent))
        .flatten()
    {
        return Err(match edit {
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
        });
    }
    if edit.is_some_and(|e| e.dry_run) {
        // Nothing is marked: dropping the lock rolls its transaction back.
        return ok(json!({
            "dry_run": true,
            "letter": locked.letter,
            "replay": {
                "job_id": job_id,
                "queue": locked.letter.queue,
                "fence_exists": fence_exists,
                "body": body.as_deref().map(serde_json::from_str::<Value>).transpose().ok().flatten(),
                "effect": if fence_exists {
                    "none: the job's effect has committed (its fence exists), so nothing would be sent"
                } else {
                    "would send the edited body under the same job_id: the consumer runs it at most once"
                },
            }
        }));
    }
    let outcome = if fence_exists {
        ReplayOutcome::AlreadyProcessed
    } else {
        ReplayOutcome::Queued
    };
    let edited = body.is_some();
    locked
        .mark(
            &Verdict::Replayed {
                outcome,
                reason,
                body,
            },
            actor,
            api.clock.now(),
        )
        .await
        .map_err(db)?;
    // Recorded before anything is sent: a message is never out while its letter could still be
    // discarded or left pending.
    let mut letter = locked.commit().await.map_err(db)?;
    let (status, sent, effect) = if fence_exists {
        (
            200,
            None,
            "none: the job's effect has committed (its fence exists), so nothing was sent",
        )
    } else {
        match replayer.send(&letter).await {
            Ok(sent) => {
                match dead_letter::record_replay_sent(
                    &api.pool,
                    id,
                    &sent.message_id,
                    api.clock.now(),
                )
                .await
                {
                    Ok(Some(updated)) => letter = updated,
                    Ok(None) => {}
                    Err(e) => tracing::error!(letter = %id, message_id = %sent.message_id,
                        error = %e, "replay sent, but recording its message id failed; the \
                        scheduled run may send it again (the fence makes that harmless)"),
                }
                (
                    200,
                    Some(sent.message_id),
                    "sent: the job has no fence yet, so the consumer will run it, at most once",
                )
            }
            Err(cause) => {
                tracing::error!(route = route.path, letter = %id, error = %cause,
                    "replay recorded but not sent; the scheduled run will send it");
                (
                    202,
                    None,
                    "queued: the replay is recorded but the queue refused it just now; the \
                     scheduled function sends it on its next run",
                )
            }
        }
    };
    // `message_id` is the replay's SQS message; absent while the replay is queued.
    tracing::info!(letter = %id, job_id = %job_id, actor, message_id = sent.as_deref(),
        queued = sent.is_none(), fence_exists, edited, "dead letter replayed");
    Ok(ApiResponse {
        status,
        body: json!({
            "letter": letter,
            "replay": {
                "job_id": job_id,
                "queue": letter.queue,
                "message_id": sent,
                "sent": sent.is_some(),
                "fence_exists": fence_exists,
                "edited": edited,
                "effect": effect,
            }
        }),
    })
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

/// Locks the letter for review and requires it to be pending.
async fn lock_pending(
    api: &Api,
    route: &Route,
    id: DeadLetterId,
) -> Result<LockedLetter, ApiError> {
    let locked = dead_letter::lock_letter(&api.pool, id, api.lock_wait)
        .await
        .map_err(|e| {
            if dead_letter::is_lock_timeout(&e) {
                ApiError::conflict(
                    "review_in_progress",
                    "another review of this letter is in progress; read it again in a moment",
                )
            } else {
                ApiError::database(route.path, &e)
            }
        })?
        .ok_or_else(|| not_found(id))?;
    match locked.status() {
        ReviewStatus::PendingReview => Ok(locked),
        _ => {
            let letter = &locked.letter;
            Err(ApiError::conflict(
                "not_pending",
                format!(
                    "the letter is already {} (by {} at {}); only a pending_review letter can be \
                     replayed or discarded",
                    letter.status,
                    letter.reviewed_by.as_deref().unwrap_or("unknown"),
                    letter
                        .reviewed_at
                        .map(|t| t.to_rfc3339())
                        .unwrap_or_else(|| "an unknown time".into()),
                ),
            ))
        }
    }
}

fn not_found(id: DeadLetterId) -> ApiError {
    ApiError::not_found(format!("there is no dead letter {}", id.0))
}

/// The replay body: none, or `{"reason": "..."}` as for a discard (why it is replayed; a bulk
/// replay always says).
fn parse_replay_reason(body: &[u8]) -> Result<Option<String>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    const SHAPE: &str =
        r#"the body must be empty or a JSON object such as {"reason": "ledger back after INC-42"}"#;
    checked_reason(body, SHAPE).map(Some)
}

/// The discard body: `{"reason": "..."}`, a non-blank reason of at most [`MAX_REASON_CHARS`].
fn parse_reason(body: &[u8]) -> Result<String, ApiError> {
    const SHAPE: &str = r#"the body must be a JSON object such as {"reason": "duplicate of an award already corrected by hand"}"#;
    checked_reason(body, SHAPE)
}

/// A review body's fields, as they came: the `reason` (any JSON), whether it came twice, and the
/// first unknown field. Read as a JSON object only, so `["why"]` is not taken for a reason.
struct ReviewBody {
    reason: Option<Value>,
    repeated: bool,
    unknown: Option<String>,
}

impl<'de> serde::Deserialize<'de> for ReviewBody {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = ReviewBody;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ReviewBody, A::Error> {
                let mut body = ReviewBody {
                    reason: None,
                    repeated: false,
                    unknown: None,
                };
                while let Some(key) = map.next_key::<String>()? {
                    if key == "reason" {
                        body.repeated |= body.reason.is_some();
                        body.reason = Some(map.next_value()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        body.unknown.get_or_insert(key);
                    }
                }
                Ok(body)
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// `{"reason": "..."}` with a reason that is there, once, and [`reason_text`]; `shape` says what
/// the body should look like. Not JSON (or not UTF-8) is a 400; JSON of another shape a 422.
fn checked_reason(body: &[u8], shape: &str) -> Result<String, ApiError> {
    let fields: ReviewBody = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            ApiError::invalid_body(shape)
        } else {
            ApiError::invalid_json(shape)
        }
    })?;
    if let Some(unknown) = &fields.unknown {
        return Err(ApiError::invalid_body(format!(
            "unknown field {}; {shape}",
            shown(unknown)
        )));
    }
    if fields.repeated {
        return Err(ApiError::invalid_body(
            "`reason` is given more than once; give it once",
        ));
    }
    match fields.reason {
        Some(Value::String(reason)) => reason_text(&reason).map_err(ApiError::invalid_body),
        Some(_) => Err(ApiError::invalid_body("`reason` must be a string")),
        None => Err(ApiError::invalid_body(
            "`reason` is required: say why, for the next person who reads the letter",
        )),
    }
}

/// The reason as kept: trimmed; plain text (no NUL, no control character but tab and line
/// breaks, so nothing in it can drive the terminal of whoever reads it with `dlq show`); with
/// something visible in it; at most [`MAX_REASON_CHARS`] characters. The error says which.
pub(super) fn reason_text(reason: &str) -> Result<String, String> {
    let reason = reason.trim();
    if reason.contains('\0') {
        return Err("`reason` contains a NUL character; write it as plain text".into());
    }
    if let Some(c) = reason
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
    {
        return Err(format!(
            "`reason` contains the control character U+{:04X}; write it as plain text (tabs and \
             line breaks are fine)",
            u32::from(c)
        ));
    }
    if !reason.chars().any(is_visible) {
        return Err(
            "`reason` is blank (only spaces or invisible characters): say why, for the next \
             person who reads the letter"
                .into(),
        );
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(format!(
            "`reason` is {chars} characters; at most {MAX_REASON_CHARS} are kept, link to a \
             ticket for more"
        ));
    }
    Ok(reason.to_owned())
}

/// Whether `c` shows on a screen: not white space, not a control character, and not one of the
/// characters that render as nothing: Unicode's default-ignorable code points (zero-width
/// spaces and joiners, bidirectional controls, variation selectors, tags, Hangul fillers, …),
/// the other format characters (Cf) and the blank braille pattern. The schema's
/// `dead_letters_reason_visible` check rejects a subset of these as well.
fn is_visible(c: char) -> bool {
    !(c.is_whitespace()
        || c.is_control()
        || matches!(c,
            '\u{00ad}' | '\u{034f}' | '\u{061c}' | '\u{0600}'..='\u{0605}' | '\u{06dd}'
            | '\u{070f}' | '\u{0890}'..='\u{0891}' | '\u{08e2}' | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}' | '\u{180b}'..='\u{180f}' | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202f}' | '\u{205f}'..='\u{206f}' | '\u{2800}' | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}' | '\u{feff}' | '\u{ffa0}' | '\u{fff0}'..='\u{fffb}'
            | '\u{110bd}' | '\u{110cd}' | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}' | '\u{e0000}'..='\u{e0fff}'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_required_non_blank_and_bounded() {
        assert_eq!(
            parse_reason(br#"{"reason": " fixed by hand "}"#).unwrap(),
            "fixed by hand"
        );
        let long = format!(r#"{{"reason": "{}"}}"#, "x".repeat(MAX_REASON_CHARS + 1));
        for (body, status) in [
            (&b""[..], 400),
            (b"reason=x", 400),
            (b"[1]", 422),
            (b"{}", 422),
            (br#"{"reason": "  "}"#, 422),
            ("{\"reason\": \"\u{200b}\u{200b}\"}".as_bytes(), 422),
            ("{\"reason\": \" \u{feff}\u{2060} \"}".as_bytes(), 422),
            (br#"{"reason": 7}"#, 422),
            (br#"{"reason": "a\u0000b"}"#, 422),
            (br#"{"reason": "x", "force": true}"#, 422),
            (br#"{"reason": "x", "reason": "y"}"#, 422),
            (br#"["x"]"#, 422),
            (br#"{"reason": "\u0001\u0002\u0003\u0007"}"#, 422),
            (br#"{"reason": "ok \u001b[2J"}"#, 422),
            (
                "{\"reason\": \"\u{2066}\u{e0041}\u{fe0f}\u{3164}\u{2800}\"}".as_bytes(),
                422,
            ),
            (br#"{"reason": "x"} trailing"#, 400),
            (b"\xff", 400),
            (long.as_bytes(), 422),
        ] {
            assert_eq!(parse_reason(body).unwrap_err().status, status, "{body:?}");
        }
        assert_eq!(
            parse_reason("{\"reason\": \"line one\\n\\tline two\"}".as_bytes()).unwrap(),
            "line one\n\tline two"
        );
        assert_eq!(
            bounded(&[b' '; MAX_BODY_BYTES + 1]).unwrap_err().status,
            413
        );
    }
}
