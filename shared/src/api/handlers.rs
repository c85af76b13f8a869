//! The four operations, after routing and authorization.
//!
//! Invariant: input is validated before the first query; a review changes a row only through
//! [`crate::review`]'s lock-check-mark-commit, and a replay sends inside that transaction, before
//! the commit, so a refused send leaves the letter pending and unchanged.

use super::error::ApiError;
use super::list_query::{encode_cursor, parse_list_query};
use super::{Api, ApiRequest, ApiResponse, Operation, Route};
use crate::ids::DeadLetterId;
use crate::review::{self, LockedLetter, ReviewStatus, Verdict};
use serde_json::{Value, json};

/// The longest discard reason, in characters.
pub const MAX_REASON_CHARS: usize = 1000;

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
        Operation::Replay => replay(api, route, parse_id(id)?, actor).await,
        Operation::Discard => {
            let id = parse_id(id)?;
            let reason = parse_reason(&request.body)?;
            discard(api, route, id, actor, reason).await
        }
    }
}

fn ok(body: Value) -> Result<ApiResponse, ApiError> {
    Ok(ApiResponse { status: 200, body })
}

fn parse_id(id: Option<&str>) -> Result<DeadLetterId, ApiError> {
    let id = id.unwrap_or_default();
    uuid::Uuid::try_parse(id).map(DeadLetterId).map_err(|_| {
        ApiError::invalid_parameter(format!(
            "the letter id in the path must be a UUID such as 0b7e5f6e-2c4d-4f7a-9d1e-3a5b7c9d1e2f, got {id:?}"
        ))
    })
}

async fn list(api: &Api, route: &Route, request: &ApiRequest) -> Result<ApiResponse, ApiError> {
    let query = parse_list_query(&request.query)?;
    let mut items = review::list_letters(&api.pool, &query.filter, query.after, query.limit + 1)
        .await
        .map_err(|e| ApiError::database(route.path, &e))?;
    let next_cursor = if items.len() > query.limit as usize {
        items.truncate(query.limit as usize);
        items.last().map(|last| encode_cursor(last.position()))
    } else {
        None
    };
    ok(json!({"items": items, "next_cursor": next_cursor, "limit": query.limit}))
}

async fn get(api: &Api, route: &Route, id: DeadLetterId) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let letter = review::letter(&api.pool, id)
        .await
        .map_err(db)?
        .ok_or_else(|| not_found(id))?;
    let fence_exists = review::letter_fence_exists(&api.pool, &letter)
        .await
        .map_err(db)?;
    let failed_replays = review::replays_of(&api.pool, id).await.map_err(db)?;
    ok(json!({"letter": letter, "fence_exists": fence_exists, "failed_replays": failed_replays}))
}

async fn replay(
    api: &Api,
    route: &Route,
    id: DeadLetterId,
    actor: &str,
) -> Result<ApiResponse, ApiError> {
    let db = |e: sqlx::Error| ApiError::database(route.path, &e);
    let Some(replayer) = api.replayer.as_ref() else {
        return Err(ApiError::internal(
            route.path,
            &"replay route without an SQS client",
        ));
    };
    let mut locked = lock_pending(api, route, id).await?;
    let Some(job_id) = locked.letter.job_id else {
        return Err(ApiError::conflict(
            "not_replayable",
            "this letter is a poison message without a readable job_id, so a replay could not be \
             deduplicated; fix and republish it by hand, then discard it with a reason",
        ));
    };
    let fence_exists = locked.fence_exists().await.map_err(db)?.unwrap_or(false);
    locked
        .mark(&Verdict::Replayed, actor, api.clock.now())
        .await
        .map_err(db)?;
    let sent = match replayer.send(&locked.letter).await {
        Ok(sent) => sent,
        Err(cause) => {
            drop(locked);
            tracing::error!(route = route.path, letter = %id, error = %cause, "replay not sent");
            return Err(ApiError::unavailable(
                "queue_unavailable",
                "the queue did not accept the replay; the letter is unchanged and still \
                 pending_review, so retrying is safe",
            ));
        }
    };
    let letter = locked.commit().await.map_err(|e| {
        // Sent but not recorded: the letter stays pending. A second replay is still safe, since
        // the job id is the same and the consumer's fence lets it apply at most once.
        tracing::error!(letter = %id, message_id = %sent.message_id, error = %e,
            "replay sent but its review was not committed");
        db(e)
    })?;
    let effect = if fence_exists {
        "none: this job already has a fence for its consumer, so the consumer will acknowledge \
         the replay as a duplicate"
    } else {
        "the job has no fence yet, so the consumer will run it, at most once"
    };
    tracing::info!(letter = %id, job = %job_id, actor, message_id = %sent.message_id, fence_exists,
        "dead letter replayed");
    ok(json!({
        "letter": letter,
        "replay": {
            "job_id": job_id,
            "queue": letter.queue,
            "message_id": sent.message_id,
            "fence_exists": fence_exists,
            "effect": effect,
        }
    }))
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
    tracing::info!(letter = %id, actor, "dead letter discarded");
    ok(json!({ "letter": letter }))
}

/// Locks the letter for review and requires it to be pending.
async fn lock_pending(
    api: &Api,
    route: &Route,
    id: DeadLetterId,
) -> Result<LockedLetter, ApiError> {
    let locked = review::lock_letter(&api.pool, id, api.lock_wait)
        .await
        .map_err(|e| {
            if review::is_lock_timeout(&e) {
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
        Some(ReviewStatus::PendingReview) => Ok(locked),
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

/// The discard body: `{"reason": "..."}`, a non-blank reason of at most [`MAX_REASON_CHARS`].
fn parse_reason(body: &[u8]) -> Result<String, ApiError> {
    const SHAPE: &str = r#"the body must be a JSON object such as {"reason": "duplicate of an award already corrected by hand"}"#;
    let value: Value = serde_json::from_slice(body).map_err(|_| ApiError::invalid_json(SHAPE))?;
    let Value::Object(fields) = value else {
        return Err(ApiError::invalid_body(SHAPE));
    };
    if let Some(unknown) = fields.keys().find(|k| k.as_str() != "reason") {
        return Err(ApiError::invalid_body(format!(
            "unknown field `{unknown}`; {SHAPE}"
        )));
    }
    let reason = match fields.get("reason") {
        Some(Value::String(reason)) => reason.trim(),
        Some(_) => return Err(ApiError::invalid_body("`reason` must be a string")),
        None => {
            return Err(ApiError::invalid_body(
                "`reason` is required: say why this letter needs no replay",
            ));
        }
    };
    if reason.is_empty() {
        return Err(ApiError::invalid_body(
            "`reason` is blank: say why this letter needs no replay",
        ));
    }
    if reason.contains('\0') {
        return Err(ApiError::invalid_body(
            "`reason` contains a NUL character; write it as plain text",
        ));
    }
    let chars = reason.chars().count();
    if chars > MAX_REASON_CHARS {
        return Err(ApiError::invalid_body(format!(
            "`reason` is {chars} characters; at most {MAX_REASON_CHARS} are kept, link to a ticket for more"
        )));
    }
    Ok(reason.to_owned())
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
            (br#"{"reason": 7}"#, 422),
            (br#"{"reason": "a\u0000b"}"#, 422),
            (br#"{"reason": "x", "force": true}"#, 422),
            (long.as_bytes(), 422),
        ] {
            assert_eq!(parse_reason(body).unwrap_err().status, status, "{body:?}");
        }
    }
}
