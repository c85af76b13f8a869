//! What a job's work failing looks like to the harness: a panic caught as its failure, and a
//! transaction that is not whole refused with why.

use crate::consumer::ProcessError;
use crate::fence::CheckFailed;
use futures_util::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;

/// The transient failure a refused check before `COMMIT` is.
pub(super) fn refusal(refused: CheckFailed, group: bool) -> ProcessError {
    if group {
        return ProcessError::transient(format!("the batch's transaction is not whole: {refused}"));
    }
    ProcessError::transient(match refused {
        CheckFailed::NotOwn(_) => "the handler returned Ok but ended the harness's transaction \
             itself (COMMIT or ROLLBACK inside handle): the job's fence is not its own"
            .to_string(),
        CheckFailed::LetterLocked(e) => format!(
            "closing the letter still pending for this job waited past its lock timeout: \
             another session holds the letter's row (a review, an open transaction) ({e})"
        ),
        CheckFailed::Aborted(e) => format!(
            "the handler returned Ok from a transaction that cannot commit: an SQL error \
             inside handle was not returned ({e})"
        ),
    })
}

/// The consumer's `work`, a panic in it becoming the failure `panicked` makes of its message.
pub(super) async fn caught(
    work: impl Future<Output = Result<(), ProcessError>>,
    panicked: impl FnOnce(String) -> ProcessError,
) -> Result<(), ProcessError> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            Err(panicked(what))
        }
    }
}
