//! CloudWatch Embedded Metric Format: the lines [`Metrics`] and the scheduled run's report leave
//! in the log, which CloudWatch turns into metrics.

use super::{Metrics, NAMES};
use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;

/// The most values one EMF metric may carry in one document; more leave in further lines.
const EMF_VALUES_PER_METRIC: usize = 100;
/// The most metrics one EMF directive may define; more leave in further lines.
const EMF_METRICS_PER_DOCUMENT: usize = 100;
/// Keys of an EMF line that are not metrics: a metric of that name would overwrite them.
pub(super) const RESERVED: [&str; 3] = ["Consumer", "_aws", "level"];

/// The CloudWatch unit of a sampled value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Durations.
    Milliseconds,
    /// Sizes.
    Bytes,
    /// Plain numbers.
    Count,
}

impl Unit {
    /// CloudWatch's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Milliseconds => "Milliseconds",
            Unit::Bytes => "Bytes",
            Unit::Count => "Count",
        }
    }
}

impl Metrics {
    /// Writes the counts and samples since the last flush as EMF JSON lines and resets them:
    /// one line, and one more for each further 100 samples of a metric or 100 metrics. Writes
    /// nothing when nothing happened. A sample metric named as a count is left out (one name,
    /// one value per document).
    pub fn flush_emf(
        &self,
        out: &mut impl Write,
        namespace: &str,
        consumer: &str,
        at: DateTime<Utc>,
    ) -> std::io::Result<()> {
        let counts: Vec<u64> = self.counters.iter().map(|c| c.swap(0, Relaxed)).collect();
        let custom = std::mem::take(&mut *self.custom.lock().expect("metrics lock"));
        let mut samples = std::mem::take(&mut *self.samples.lock().expect("metrics lock"));
        if counts.iter().all(|&c| c == 0) && custom.is_empty() && samples.is_empty() {
            return Ok(());
        }
        samples.retain(|name, _| !NAMES.contains(name) && !custom.contains_key(name));
        // Line k holds the k-th hundred samples of each metric; the first also every count.
        let mut lines: Vec<Vec<(&str, Value, &str)>> = vec![
            NAMES
                .iter()
                .zip(counts)
                .map(|(n, c)| (*n, json!(c), "Count"))
                .chain(custom.into_iter().map(|(n, c)| (n, json!(c), "Count")))
                .collect(),
        ];
        for (name, (unit, values)) in &samples {
            for (k, chunk) in values.chunks(EMF_VALUES_PER_METRIC).enumerate() {
                if lines.len() <= k {
                    lines.push(Vec::new());
                }
                lines[k].push((*name, json!(chunk), unit.as_str()));
            }
        }
        for line in &lines {
            for metrics in line.chunks(EMF_METRICS_PER_DOCUMENT) {
                let document = emf_document(
                    namespace,
                    ("Consumer", consumer),
                    metrics.iter().cloned(),
                    at,
                );
                writeln!(out, "{document}")?;
            }
        }
        Ok(())
    }
}

/// One EMF document: `values` as (name, value, CloudWatch unit) under one dimension.
pub(crate) fn emf_line(
    namespace: &str,
    dimension: (&str, &str),
    values: &[(&str, f64, &str)],
    at: DateTime<Utc>,
) -> Value {
    let values = values.iter().map(|(name, value, unit)| {
        let number = if value.fract() == 0.0 && *value >= 0.0 {
            json!(*value as u64)
        } else {
            json!(value)
        };
        (*name, number, *unit)
    });
    emf_document(namespace, dimension, values, at)
}

/// One EMF document: each value (a number, or an array of samples) with its name and unit.
fn emf_document<'a>(
    namespace: &str,
    dimension: (&str, &str),
    values: impl IntoIterator<Item = (&'a str, Value, &'a str)>,
    at: DateTime<Utc>,
) -> Value {
    let mut doc = Map::new();
    let mut defined = Vec::new();
    doc.insert(dimension.0.into(), dimension.1.into());
    for (name, value, unit) in values {
        defined.push(json!({"Name": name, "Unit": unit}));
        doc.insert(name.into(), value);
    }
    doc.insert(
        "_aws".into(),
        json!({
            "Timestamp": at.timestamp_millis(),
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": [[dimension.0]],
                "Metrics": defined,
            }],
        }),
    );
    Value::Object(doc)
}
