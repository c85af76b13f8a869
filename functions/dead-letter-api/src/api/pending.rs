//! A letter under review: locked, and pending, or the answer that says why not.

use super::error::ApiError;
use super::{Api, Route};
use shared::dead_letter::{self, LockedLetter, ReviewStatus};
use shared::ids::DeadLetterId;

/// Locks the letter for review and requires it to be pending.
pub(super) async fn lock_pending(
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

pub(super) fn not_found(id: DeadLetterId) -> ApiError {
    ApiError::not_found(format!("there is no dead letter {}", id.0))
}
