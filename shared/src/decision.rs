//! What happens to a message after an attempt: a pure function of the outcome, the attempt
//! number, the policy and an injected RNG. No I/O, so every branch is tested without a database.

use crate::consumer::ProcessError;
use crate::dead_letter::ErrorKind;
use crate::retry::RetryPolicy;
use rand::Rng;
use std::time::Duration;

/// What follows a failed attempt. (A success needs no decision: its message is deleted.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Hide the message for `after`, then let it be delivered again.
    Retry {
        /// The backoff delay.
        after: Duration,
    },
    /// Record a dead letter of this kind, then delete the message.
    DeadLetter(ErrorKind),
}

/// Decides what follows attempt `attempt` (1-based) that failed with `error`.
///
/// Transient failures retry with backoff until the last attempt, which dead-letters as
/// `exhausted`; permanent failures and poison dead-letter at once, whatever the attempt.
pub fn decide(
    error: &ProcessError,
    attempt: u32,
    policy: &RetryPolicy,
    rng: &mut impl Rng,
) -> AfterFailure {
    match error {
        ProcessError::Poison(_) => AfterFailure::DeadLetter(ErrorKind::Poison),
        ProcessError::Permanent(_) => AfterFailure::DeadLetter(ErrorKind::Permanent),
        ProcessError::Transient(_) if attempt >= policy.max_attempts() => {
            AfterFailure::DeadLetter(ErrorKind::Exhausted)
        }
        ProcessError::Transient(_) => AfterFailure::Retry {
            after: policy.delay_after(attempt, rng),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn transient() -> ProcessError {
        ProcessError::transient("connection reset")
    }

    #[test]
    fn transient_failures_retry_until_the_last_attempt_then_dead_letter_as_exhausted() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(1);
        let err = transient();
        let mut previous = Duration::ZERO;
        for attempt in 1..policy.max_attempts() {
            match decide(&err, attempt, &policy, &mut rng) {
                AfterFailure::Retry { after } => {
                    assert!(
                        after > previous,
                        "attempt {attempt}: {after:?} <= {previous:?}"
                    );
                    previous = after;
                }
                other => panic!("attempt {attempt}: {other:?}"),
            }
        }
        assert_eq!(
            decide(&err, policy.max_attempts(), &policy, &mut rng),
            AfterFailure::DeadLetter(ErrorKind::Exhausted)
        );
    }

    #[test]
    fn permanent_and_poison_never_retry() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(2);
        for attempt in 1..=policy.max_attempts() {
            let permanent = ProcessError::permanent("account closed");
            let poison = ProcessError::poison("points must be positive");
            assert_eq!(
                decide(&permanent, attempt, &policy, &mut rng),
                AfterFailure::DeadLetter(ErrorKind::Permanent)
            );
            assert_eq!(
                decide(&poison, attempt, &policy, &mut rng),
                AfterFailure::DeadLetter(ErrorKind::Poison)
            );
        }
    }

    #[test]
    fn a_single_attempt_policy_dead_letters_the_first_transient_failure() {
        let policy = RetryPolicy::new(1, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
        let mut rng = StdRng::seed_from_u64(4);
        assert_eq!(
            decide(&transient(), 1, &policy, &mut rng),
            AfterFailure::DeadLetter(ErrorKind::Exhausted)
        );
    }
}
