//! Counts of what the harness did, emitted as CloudWatch Embedded Metric Format (EMF).
//!
//! Successes are metrics, not rows (spec, Behaviour 9). Counters are atomic and shared by all
//! records of a batch; [`Metrics::flush_emf`] writes one EMF line per invocation and resets them.

use crate::dead_letter::ErrorKind;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One countable event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Work committed with its fence.
    Processed,
    /// A copy of an already processed job, acked and skipped.
    DuplicateSkipped,
    /// A concurrent copy held the fence; the record was handed back to retry shortly.
    FenceContended,
    /// A transient failure scheduled for another attempt.
    Retried,
    /// A dead letter was written (or found, for a redelivered message) of this kind.
    DeadLettered(ErrorKind),
    /// A dead letter could not be written; the message was handed back, not acked.
    DeadLetterWriteFailed,
    /// Nothing ran (the database was unavailable before the work): the message was handed back
    /// without charging an execution.
    HandedBack,
    /// A message reached the dead-letter queue although its job had committed: no letter.
    RedrivenAlreadyProcessed,
    /// An incident step (open, update, resolve) could not be delivered to BetterStack; it is
    /// retried later.
    AlertDeliveryFailed,
    /// BetterStack refused the API token (401/403): no page gets through until it is replaced.
    AlertRejected,
    /// A batch's new jobs committed in one transaction (batch mode).
    BatchCommitted,
    /// A batch's transaction did not commit; its jobs went one by one (batch mode).
    BatchFellBack,
}

const NAMES: [&str; 17] = [
    "Processed",
    "DuplicateSkipped",
    "FenceContended",
    "Retried",
    "DeadLetteredPoison",
    "DeadLetteredPermanent",
    "DeadLetteredExhausted",
    "DeadLetteredCrashed",
    "DeadLetteredUnsettled",
    "DeadLetteredConflict",
    "DeadLetterWriteFailed",
    "HandedBack",
    "RedrivenAlreadyProcessed",
    "AlertDeliveryFailed",
    "AlertRejected",
    "BatchCommitted",
    "BatchFellBack",
];

impl Metric {
    /// Every metric, in the order of their names.
    pub const ALL: [Metric; NAMES.len()] = [
        Metric::Processed,
        Metric::DuplicateSkipped,
        Metric::FenceContended,
        Metric::Retried,
        Metric::DeadLettered(ErrorKind::Poison),
        Metric::DeadLettered(ErrorKind::Permanent),
        Metric::DeadLettered(ErrorKind::Exhausted),
        Metric::DeadLettered(ErrorKind::Crashed),
        Metric::DeadLettered(ErrorKind::Unsettled),
        Metric::DeadLettered(ErrorKind::Conflict),
        Metric::DeadLetterWriteFailed,
        Metric::HandedBack,
        Metric::RedrivenAlreadyProcessed,
        Metric::AlertDeliveryFailed,
        Metric::AlertRejected,
        Metric::BatchCommitted,
        Metric::BatchFellBack,
    ];

    fn index(self) -> usize {
        match self {
            Metric::Processed => 0,
            Metric::DuplicateSkipped => 1,
            Metric::FenceContended => 2,
            Metric::Retried => 3,
            Metric::DeadLettered(ErrorKind::Poison) => 4,
            Metric::DeadLettered(ErrorKind::Permanent) => 5,
            Metric::DeadLettered(ErrorKind::Exhausted) => 6,
            Metric::DeadLettered(ErrorKind::Crashed) => 7,
            Metric::DeadLettered(ErrorKind::Unsettled) => 8,
            Metric::DeadLettered(ErrorKind::Conflict) => 9,
            Metric::DeadLetterWriteFailed => 10,
            Metric::HandedBack => 11,
            Metric::RedrivenAlreadyProcessed => 12,
            Metric::AlertDeliveryFailed => 13,
            Metric::AlertRejected => 14,
            Metric::BatchCommitted => 15,
            Metric::BatchFellBack => 16,
        }
    }

    /// The CloudWatch metric name.
    pub fn name(self) -> &'static str {
        NAMES[self.index()]
    }
}

/// A set of counters for one consumer: the harness's own, and any the consumer counts
/// ([`crate::consumer::Job::count`]). All leave in one EMF line per invocation.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: [AtomicU64; NAMES.len()],
    custom: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

impl Metrics {
    /// Counts one `metric`.
    pub(crate) fn increment(&self, metric: Metric) {
        self.counters[metric.index()].fetch_add(1, Relaxed);
    }

    /// Counts `n` of `metric`.
    pub(crate) fn add(&self, metric: Metric, n: u64) {
        self.counters[metric.index()].fetch_add(n, Relaxed);
    }

    /// The current count of `metric`.
    pub fn get(&self, metric: Metric) -> u64 {
        self.counters[metric.index()].load(Relaxed)
    }

    /// Adds `n` to the consumer's own metric `name` (a CloudWatch metric name: a fixed word
    /// such as `PointsRedeemed`, never a value that varies per job).
    pub fn count(&self, name: &'static str, n: u64) {
        *self
            .custom
            .lock()
            .expect("metrics lock")
            .entry(name)
            .or_default() += n;
    }

    /// The current count of the consumer's own metric `name`.
    pub fn custom(&self, name: &str) -> u64 {
        self.custom
            .lock()
            .expect("metrics lock")
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    /// Writes the counts since the last flush as one EMF JSON line and resets them.
    /// Writes nothing when nothing happened.
    pub fn flush_emf(
        &self,
        out: &mut impl Write,
        namespace: &str,
        consumer: &str,
        at: DateTime<Utc>,
    ) -> std::io::Result<()> {
        let counts: Vec<u64> = self.counters.iter().map(|c| c.swap(0, Relaxed)).collect();
        let custom = std::mem::take(&mut *self.custom.lock().expect("metrics lock"));
        if counts.iter().all(|&c| c == 0) && custom.is_empty() {
            return Ok(());
        }
        let values: Vec<_> = NAMES
            .iter()
            .zip(counts)
            .map(|(n, c)| (*n, c as f64, "Count"))
            .chain(custom.into_iter().map(|(n, c)| (n, c as f64, "Count")))
            .collect();
        writeln!(
            out,
            "{}",
            emf_line(namespace, ("Consumer", consumer), &values, at)
        )
    }
}

/// One EMF document: `values` as (name, value, CloudWatch unit) under one dimension.
pub(crate) fn emf_line(
    namespace: &str,
    dimension: (&str, &str),
    values: &[(&str, f64, &str)],
    at: DateTime<Utc>,
) -> Value {
    let mut doc = Map::new();
    doc.insert(
        "_aws".into(),
        json!({
            "Timestamp": at.timestamp_millis(),
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": [[dimension.0]],
                "Metrics": values.iter().map(|(n, _, unit)| json!({"Name": n, "Unit": unit})).collect::<Vec<_>>(),
            }],
        }),
    );
    doc.insert(dimension.0.into(), dimension.1.into());
    for (name, value, _) in values {
        let number = if value.fract() == 0.0 && *value >= 0.0 {
            json!(*value as u64)
        } else {
            json!(value)
        };
        doc.insert((*name).into(), number);
    }
    Value::Object(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_writes_one_emf_line_with_every_count_and_resets() {
        let m = Metrics::default();
        m.increment(Metric::Processed);
        m.increment(Metric::Processed);
        m.increment(Metric::DeadLettered(ErrorKind::Poison));
        let mut out = Vec::new();
        m.flush_emf(&mut out, "JobHarness", "award-points", DateTime::UNIX_EPOCH)
            .unwrap();
        let line: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(line["Processed"], 2);
        assert_eq!(line["DeadLetteredPoison"], 1);
        assert_eq!(line["Retried"], 0);
        assert_eq!(line["Consumer"], "award-points");
        assert_eq!(
            line["_aws"]["CloudWatchMetrics"][0]["Namespace"],
            "JobHarness"
        );
        assert_eq!(
            line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
                .len(),
            NAMES.len()
        );
        assert_eq!(m.get(Metric::Processed), 0);

        let mut again = Vec::new();
        m.flush_emf(
            &mut again,
            "JobHarness",
            "award-points",
            DateTime::UNIX_EPOCH,
        )
        .unwrap();
        assert!(again.is_empty(), "nothing happened, nothing written");
    }

    #[test]
    fn every_metric_is_listed_once_in_the_order_of_its_name() {
        for (i, metric) in Metric::ALL.iter().enumerate() {
            assert_eq!(metric.index(), i, "{metric:?}");
        }
    }

    #[test]
    fn a_consumers_own_metrics_leave_in_the_same_line() {
        let m = Metrics::default();
        m.increment(Metric::Processed);
        m.count("PointsRedeemed", 500);
        m.count("PointsRedeemed", 300);
        assert_eq!(m.custom("PointsRedeemed"), 800);
        let mut out = Vec::new();
        m.flush_emf(
            &mut out,
            "JobHarness",
            "redeem-reward",
            DateTime::UNIX_EPOCH,
        )
        .unwrap();
        let line: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (line["Processed"].as_u64(), line["PointsRedeemed"].as_u64()),
            (Some(1), Some(800))
        );
        let defined = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
            .as_array()
            .unwrap();
        assert!(defined.iter().any(|d| d["Name"] == "PointsRedeemed"));
        assert_eq!(m.custom("PointsRedeemed"), 0, "reset by the flush");
    }
}
