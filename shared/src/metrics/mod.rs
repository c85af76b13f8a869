//! What the harness did and how long it took, emitted as CloudWatch Embedded Metric Format (EMF).
//!
//! Successes are metrics, not rows (spec, Behaviour 9). Counters are atomic and shared by all
//! records of a batch; [`Metrics::flush_emf`] writes one EMF line per invocation and resets them.
//! Besides counts, each record leaves two samples, with their units: [`JOB_DURATION`] (how long
//! the harness spent on it) and [`MESSAGE_AGE`] (how old its message was when the invocation
//! took it: the lag on-call looks at first). Consumers add their own counts and samples through
//! [`crate::consumer::Job`].

mod emf;

pub use emf::Unit;
pub(crate) use emf::emf_line;

use crate::dead_letter::ErrorKind;
use emf::RESERVED;
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

/// Milliseconds from the start of a record's processing to its outcome (a job committed in a
/// batch's transaction: the transaction's time), one sample per record.
pub const JOB_DURATION: &str = "JobDuration";
/// Milliseconds from the message's `SentTimestamp` to the invocation that took it, one sample
/// per record: how far behind the consumer is.
pub const MESSAGE_AGE: &str = "MessageAge";

/// Sampled values by metric name, with their unit.
type Samples = std::collections::BTreeMap<&'static str, (Unit, Vec<f64>)>;

/// A set of counters and samples for one consumer: the harness's own, and any the consumer
/// records ([`crate::consumer::Job::count`], [`crate::consumer::Job::observe`]). All leave in one
/// EMF line per invocation (more when a metric has over 100 samples).
#[derive(Debug, Default)]
pub struct Metrics {
    counters: [AtomicU64; NAMES.len()],
    custom: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    samples: std::sync::Mutex<Samples>,
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
        if RESERVED.contains(&name) || NAMES.contains(&name) {
            tracing::warn!(
                name,
                "a consumer's count named as the harness's own is dropped"
            );
            return;
        }
        *self
            .custom
            .lock()
            .expect("metrics lock")
            .entry(name)
            .or_default() += n;
    }

    /// Adds one sample of `value` in `unit` to the metric `name` (a fixed CloudWatch metric
    /// name; its first sample fixes its unit).
    pub fn observe(&self, name: &'static str, value: f64, unit: Unit) {
        // EMF takes numbers: NaN and infinities would be written as null.
        if !value.is_finite() || RESERVED.contains(&name) {
            tracing::warn!(name, value, "a sample that EMF cannot carry is dropped");
            return;
        }
        self.samples
            .lock()
            .expect("metrics lock")
            .entry(name)
            .or_insert_with(|| (unit, Vec::new()))
            .1
            .push(value);
    }

    /// Adds `duration` as a sample in milliseconds to the metric `name`.
    pub fn observe_duration(&self, name: &'static str, duration: std::time::Duration) {
        self.observe(name, duration.as_secs_f64() * 1000.0, Unit::Milliseconds);
    }

    /// The samples of `name` since the last flush.
    pub fn samples(&self, name: &str) -> Vec<f64> {
        self.samples
            .lock()
            .expect("metrics lock")
            .get(name)
            .map(|(_, values)| values.clone())
            .unwrap_or_default()
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;
    use serde_json::{Value, json};

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

    /// The EMF documents `flush_emf` wrote, one per line.
    fn emf_lines(out: &[u8]) -> Vec<Value> {
        out.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    #[test]
    fn samples_leave_with_their_unit_a_hundred_values_a_line() {
        let m = Metrics::default();
        m.increment(Metric::Processed);
        for i in 0..250 {
            m.observe_duration(JOB_DURATION, std::time::Duration::from_millis(i));
        }
        m.observe("CardBytes", 512.0, Unit::Bytes);
        let mut out = Vec::new();
        m.flush_emf(&mut out, "JobHarness", "award-points", DateTime::UNIX_EPOCH)
            .unwrap();
        let lines = emf_lines(&out);
        assert_eq!(lines.len(), 3, "100 + 100 + 50 samples");
        let unit_of = |line: &Value, name: &str| {
            line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["Name"] == name)
                .map(|d| d["Unit"].clone())
        };
        assert_eq!(
            unit_of(&lines[0], JOB_DURATION),
            Some(json!("Milliseconds"))
        );
        assert_eq!(unit_of(&lines[0], "CardBytes"), Some(json!("Bytes")));
        assert_eq!(lines[0]["Processed"], 1);
        let all: Vec<f64> = lines
            .iter()
            .flat_map(|l| l[JOB_DURATION].as_array().unwrap().clone())
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(all.len(), 250);
        assert_eq!((all[0], all[249]), (0.0, 249.0));
        assert!(lines[1].get("Processed").is_none(), "counts leave once");
        assert_eq!(lines[2]["Consumer"], "award-points");
        assert!(m.samples(JOB_DURATION).is_empty(), "reset by the flush");
    }

    #[test]
    fn a_line_defines_at_most_a_hundred_metrics_and_no_name_twice() {
        // 120 names of the consumer's own: &'static, as a consumer's are.
        let names_120: Vec<&'static str> = (0..120)
            .map(|i| &*Box::leak(format!("m{i:03}").into_boxed_str()))
            .collect();
        let m = Metrics::default();
        for &name in &names_120 {
            m.count(name, 1);
        }
        m.count("Processed", 5); // the harness's own name: dropped
        m.observe("m000", 1.0, Unit::Milliseconds); // a count's name: left out
        m.observe("Lag", f64::NAN, Unit::Milliseconds); // not a number: dropped
        m.observe("Lag", 3.0, Unit::Milliseconds);
        let mut out = Vec::new();
        m.flush_emf(&mut out, "JobHarness", "c", DateTime::UNIX_EPOCH)
            .unwrap();
        let lines = emf_lines(&out);
        let mut defined = std::collections::BTreeMap::new();
        for line in &lines {
            let metrics = line["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap();
            assert!(
                metrics.len() <= 100,
                "{} metrics in one line",
                metrics.len()
            );
            for d in metrics {
                let name = d["Name"].as_str().unwrap().to_owned();
                *defined.entry(name.clone()).or_insert(0) += 1;
                assert!(!line[&name].is_null(), "{name} has a value");
            }
        }
        assert!(
            defined.values().all(|&n| n == 1),
            "each name once: {defined:?}"
        );
        assert_eq!(defined.len(), NAMES.len() + 120 + 1);
        let value = |name: &str| lines.iter().find_map(|l| l.get(name).cloned()).unwrap();
        assert_eq!(value("Processed"), 0);
        assert_eq!(value("m000"), 1);
        assert_eq!(value("Lag"), json!([3.0]));
    }
}
