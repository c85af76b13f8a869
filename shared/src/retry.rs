//! The retry policy: how many attempts a job gets and how long to wait between them.
//!
//! Invariants, checked by property tests over many seeds: the delay after attempt `n` lies in
//! `[min(cap, base·2ⁿ⁻¹), min(cap, 1.5·base·2ⁿ⁻¹))`, so delays strictly grow until they reach
//! the cap, never exceed it, and two jobs rarely wait the same time (jitter).

use rand::{Rng, RngExt};
use std::time::Duration;

/// SQS cannot hide a message for longer than 12 hours (`ChangeMessageVisibility`).
pub const MAX_DELAY: Duration = Duration::from_secs(12 * 60 * 60);
/// More attempts than this would outlive any sane queue retention.
pub const MAX_ATTEMPTS_LIMIT: u32 = 25;
/// The jitter factor is drawn from `[1, JITTER_MAX)`: below 2, so intervals still grow.
const JITTER_MAX: f64 = 1.5;

/// Attempts, base delay and cap of the exponential backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    base: Duration,
    cap: Duration,
}

/// A policy that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `max_attempts` outside `1..=MAX_ATTEMPTS_LIMIT`.
    #[error("max attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}, got {0}")]
    Attempts(u32),
    /// A zero base delay.
    #[error("the base delay must be at least 1 s")]
    Base,
    /// A cap below the base or above what SQS allows.
    #[error("the cap must be between the base delay ({base:?}) and {MAX_DELAY:?}, got {cap:?}")]
    Cap {
        /// The base delay.
        base: Duration,
        /// The rejected cap.
        cap: Duration,
    },
}

impl Default for RetryPolicy {
    /// The platform default (spec, Behaviour 3): 5 attempts, base 30 s, cap 1 h.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base: Duration::from_secs(30),
            cap: Duration::from_secs(60 * 60),
        }
    }
}

impl RetryPolicy {
    /// A validated policy.
    pub fn new(max_attempts: u32, base: Duration, cap: Duration) -> Result<Self, PolicyError> {
        if !(1..=MAX_ATTEMPTS_LIMIT).contains(&max_attempts) {
            return Err(PolicyError::Attempts(max_attempts));
        }
        if base < Duration::from_secs(1) {
            return Err(PolicyError::Base);
        }
        if cap < base || cap > MAX_DELAY {
            return Err(PolicyError::Cap { base, cap });
        }
        Ok(Self {
            max_attempts,
            base,
            cap,
        })
    }

    /// How many executions a job gets; the last failing one writes the dead letter.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The delay before the second attempt, without jitter.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// No delay exceeds this.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The delay after failed attempt `attempt` (1-based):
    /// `min(cap, base · 2^(attempt-1) · f)` with jitter `f` drawn from `[1, 1.5)` by `rng`.
    pub fn delay_after(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let jitter = 1.0 + (JITTER_MAX - 1.0) * rng.random::<f64>();
        self.exponential(attempt).mul_f64(jitter).min(self.cap)
    }

    /// The largest delay [`Self::delay_after`] can return for `attempt`.
    pub fn max_delay_after(&self, attempt: u32) -> Duration {
        self.exponential(attempt).mul_f64(JITTER_MAX).min(self.cap)
    }

    /// The longest a job can spend waiting between its first and last attempt: the sum of the
    /// largest delays after attempts `1..max_attempts`.
    pub fn max_retry_window(&self) -> Duration {
        (1..self.max_attempts)
            .map(|n| self.max_delay_after(n))
            .sum()
    }

    fn exponential(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(40);
        self.base
            .checked_mul(1u32 << doublings.min(31))
            .unwrap_or(MAX_DELAY)
            .min(MAX_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const SEEDS: u64 = 5_000;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn the_default_is_the_spec_policy() {
        let p = RetryPolicy::default();
        assert_eq!(
            (p.max_attempts(), p.base(), p.cap()),
            (5, secs(30), secs(3600))
        );
        // 45 + 90 + 180 + 360 seconds at most between the five attempts.
        assert_eq!(p.max_retry_window(), secs(675));
    }

    #[test]
    fn delays_grow_strictly_until_the_cap_for_every_seed() {
        let policy = RetryPolicy::new(12, secs(30), secs(3600)).unwrap();
        for seed in 0..SEEDS {
            let mut rng = StdRng::seed_from_u64(seed);
            let delays: Vec<_> = (1..12).map(|n| policy.delay_after(n, &mut rng)).collect();
            for (n, pair) in delays.windows(2).enumerate() {
                if pair[0] < policy.cap() {
                    assert!(
                        pair[1] > pair[0],
                        "seed {seed}: delay {} {:?} >= next {:?}",
                        n + 1,
                        pair[0],
                        pair[1]
                    );
                } else {
                    assert_eq!(
                        pair[1],
                        policy.cap(),
                        "seed {seed}: once capped, stays capped"
                    );
                }
            }
        }
    }

    #[test]
    fn delays_stay_within_their_band_and_never_exceed_the_cap() {
        let policy = RetryPolicy::default();
        for seed in 0..SEEDS {
            let mut rng = StdRng::seed_from_u64(seed);
            for n in 1..=20 {
                let d = policy.delay_after(n, &mut rng);
                let floor = policy.exponential(n).min(policy.cap());
                assert!(
                    d >= floor && d <= policy.cap(),
                    "seed {seed} attempt {n}: {d:?}"
                );
                assert!(d <= policy.max_delay_after(n));
            }
        }
    }

    #[test]
    fn jitter_spreads_jobs_apart() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        let firsts: std::collections::BTreeSet<_> = (0..1_000)
            .map(|_| policy.delay_after(1, &mut rng).as_millis())
            .collect();
        // 1,000 jobs failing at once must not all come back in the same second.
        assert!(firsts.len() > 900, "only {} distinct delays", firsts.len());
        let spread = firsts.last().unwrap() - firsts.first().unwrap();
        assert!(spread > 10_000, "spread {spread} ms over a 15 s band");
    }

    #[test]
    fn invalid_policies_are_rejected() {
        assert_eq!(
            RetryPolicy::new(0, secs(30), secs(60)),
            Err(PolicyError::Attempts(0))
        );
        assert_eq!(
            RetryPolicy::new(5, secs(0), secs(60)),
            Err(PolicyError::Base)
        );
        assert!(matches!(
            RetryPolicy::new(5, secs(60), secs(30)),
            Err(PolicyError::Cap { .. })
        ));
        assert!(matches!(
            RetryPolicy::new(5, secs(1), secs(13 * 3600)),
            Err(PolicyError::Cap { .. })
        ));
    }

    #[test]
    fn huge_attempt_numbers_saturate_at_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(p.max_delay_after(u32::MAX), p.cap());
    }
}
