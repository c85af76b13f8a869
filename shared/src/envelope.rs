//! The message envelope every queue carries, and the line between a job and poison.
//!
//! Invariant: [`Envelope::parse`] either yields a fully typed job or a [`Poison`] that says why
//! not and carries whatever identifiers could still be read, so the dead letter is findable.
//! It never panics on any input.

use crate::ids::{JobId, TenantId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// A parsed message: `{"job_id", "tenant_id", "correlation_id", "payload", "type"?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<P> {
    /// The job's identity; the fence key together with the consumer name.
    pub job_id: JobId,
    /// The tenant the job belongs to.
    pub tenant_id: TenantId,
    /// Traces the job across services; copied into dead letters and logs.
    pub correlation_id: String,
    /// An optional type or version tag of the payload.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The consumer-specific body.
    pub payload: P,
}

/// Why a message can never be processed, plus what could still be read from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Poison {
    /// A sentence for the dead letter's `last_error`.
    pub reason: String,
    /// The identifiers that could be read, for the dead letter.
    pub ids: PartialIds,
}

/// Identifiers read leniently from a message that may be malformed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartialIds {
    /// `job_id`, if present and a UUID.
    pub job_id: Option<JobId>,
    /// `tenant_id`, if present and a UUID.
    pub tenant_id: Option<TenantId>,
    /// `correlation_id`, if present and a string.
    pub correlation_id: Option<String>,
}

impl<P> Envelope<P> {
    /// The identifiers of a well-formed envelope.
    pub fn ids(&self) -> PartialIds {
        PartialIds {
            job_id: Some(self.job_id),
            tenant_id: Some(self.tenant_id),
            correlation_id: Some(self.correlation_id.clone()),
        }
    }
}

impl<P: DeserializeOwned> Envelope<P> {
    /// Parses an SQS message body. Not JSON, a missing or malformed envelope field, or a
    /// payload that does not deserialize into `P` is [`Poison`].
    pub fn parse(body: &str) -> Result<Self, Poison> {
        Self::parse_job(body, &[]).map(|(envelope, _)| envelope)
    }

    /// [`Envelope::parse`], and the [`JobDigest`] of what makes up the job (the payload, or
    /// only its `fields` when the consumer names them), from the same parse.
    pub fn parse_job(body: &str, fields: &[&str]) -> Result<(Self, JobDigest), Poison> {
        let value: Value = serde_json::from_str(body).map_err(|e| Poison {
            reason: format!("body is not JSON: {e}"),
            ids: PartialIds::default(),
        })?;
        let ids = PartialIds::read(&value);
        if holds_nul(body, &value) {
            // PostgreSQL text cannot hold NUL: such a job could never be written, only retried.
            return Err(Poison {
                reason:
                    "body contains a NUL character (\\u0000), which PostgreSQL text cannot store"
                        .into(),
                ids,
            });
        }
        let digest = JobDigest::of(&value, fields);
        serde_json::from_value::<Envelope<Value>>(value)
            .map_err(|e| Poison {
                reason: format!("envelope is invalid: {e}"),
                ids: ids.clone(),
            })?
            .map_payload(|payload| {
                serde_json::from_value::<P>(payload).map_err(|e| Poison {
                    reason: format!("payload does not match {}: {e}", std::any::type_name::<P>()),
                    ids: ids.clone(),
                })
            })
            .map(|envelope| (envelope, digest))
    }
}

/// What makes up a job, as a SHA-256 digest the fence keeps: the envelope's tenant, its type
/// and its payload (or only the payload's fields the consumer names), written canonically
/// (object keys sorted, numbers as the producer wrote them). Two copies of one job have the
/// same digest; a job id reused for another job has another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobDigest(pub [u8; 32]);

impl JobDigest {
    /// The digest of the envelope `value`, over the payload's `fields` (all of it when empty).
    pub fn of(value: &Value, fields: &[&str]) -> Self {
        use sha2::Digest;
        let mut out = Vec::with_capacity(256);
        for key in ["tenant_id", "type"] {
            canonical(value.get(key).unwrap_or(&Value::Null), &mut out);
            out.push(b'\n');
        }
        let payload = value.get("payload").unwrap_or(&Value::Null);
        if fields.is_empty() {
            canonical(payload, &mut out);
        } else {
            let mut named: Vec<&str> = fields.to_vec();
            named.sort_unstable();
            named.dedup();
            for field in named {
                canonical(&Value::from(field), &mut out);
                out.push(b':');
                canonical(payload.get(field).unwrap_or(&Value::Null), &mut out);
                out.push(b',');
            }
        }
        Self(sha2::Sha256::digest(&out).into())
    }
}

/// `value` as JSON with object keys in sorted order, whatever order it arrived in.
fn canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort_unstable();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(&Value::from(key.as_str()), out);
                out.push(b':');
                canonical(&fields[key], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

impl Envelope<Value> {
    fn map_payload<P>(
        self,
        f: impl FnOnce(Value) -> Result<P, Poison>,
    ) -> Result<Envelope<P>, Poison> {
        Ok(Envelope {
            job_id: self.job_id,
            tenant_id: self.tenant_id,
            correlation_id: self.correlation_id,
            kind: self.kind,
            payload: f(self.payload)?,
        })
    }
}

impl PartialIds {
    fn read(value: &Value) -> Self {
        let uuid = |key: &str| value.get(key)?.as_str()?.parse::<Uuid>().ok();
        Self {
            job_id: uuid("job_id").map(JobId),
            tenant_id: uuid("tenant_id").map(TenantId),
            correlation_id: value
                .get("correlation_id")
                .and_then(Value::as_str)
                .map(str::to_owned),
        }
    }
}

/// Whether the JSON `value`, parsed from `body`, holds a NUL in any key or string (PostgreSQL
/// text and jsonb cannot). In valid JSON a NUL can only come from the escape `\u0000`, so a
/// body without it skips the walk: the check costs a substring search per message.
fn holds_nul(body: &str, value: &Value) -> bool {
    body.contains("\\u0000") && contains_nul(value)
}

fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(fields) => fields
            .iter()
            .any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

/// The identifiers that can be read from a body, whatever its shape.
pub fn read_ids(body: &str) -> PartialIds {
    serde_json::from_str::<Value>(body)
        .map(|v| PartialIds::read(&v))
        .unwrap_or_default()
}

/// Just the `job_id` of a body, if it has a readable one, as [`read_ids`] reads it, but without
/// building the JSON (the rest is skipped, not kept): what a batch needs to look its fences up.
pub fn read_job_id(body: &str) -> Option<JobId> {
    #[derive(Deserialize)]
    struct JobIdOnly<'a> {
        #[serde(borrow)]
        job_id: Option<std::borrow::Cow<'a, str>>,
    }
    let only: JobIdOnly<'_> = serde_json::from_str(body).ok()?;
    only.job_id?.parse::<Uuid>().ok().map(JobId)
}

/// The message body as it is stored in a dead letter's `payload`: the JSON itself, or, for a
/// body that is not JSON or that PostgreSQL's `jsonb` cannot hold, a JSON string holding it
/// verbatim. (The letter keeps the body exactly as received beside it, and a replay sends that.)
///
/// `jsonb` rejects the NUL character, and numbers outside `numeric`'s range (more than 131,072
/// digits before the point or 16,383 after it, as `1e200000` or `1e-20000`); it also writes
/// every number out in full, so a 256 KiB body of `1e100000`s would grow past `jsonb`'s 1 GB
/// limit. Such JSON is kept as the string of its raw text (where `\u0000` is six harmless
/// characters), and a raw NUL byte, which SQS never delivers, becomes U+FFFD. Whatever
/// arrives, the letter can be written.
pub fn body_as_json(body: &str) -> Value {
    match serde_json::from_str::<Value>(body) {
        Ok(value) if !holds_nul(body, &value) && jsonb_can_hold(&value) => value,
        _ => Value::String(body.replace('\0', "\u{fffd}")),
    }
}

/// The most digits `jsonb` may write out for a stored body's numbers together.
const MAX_NUMBER_DIGITS: u64 = 1 << 20;

/// Whether every number of `value` fits PostgreSQL's `numeric`, and all of them written out in
/// full stay within [`MAX_NUMBER_DIGITS`].
fn jsonb_can_hold(value: &Value) -> bool {
    fn digits(value: &Value, budget: &mut u64) -> bool {
        match value {
            Value::Number(n) => match numeric_digits(&n.to_string()) {
                Some(d) if d <= *budget => {
                    *budget -= d;
                    true
                }
                _ => false,
            },
            Value::Array(items) => items.iter().all(|v| digits(v, budget)),
            Value::Object(fields) => fields.values().all(|v| digits(v, budget)),
            _ => true,
        }
    }
    let mut budget = MAX_NUMBER_DIGITS;
    digits(value, &mut budget)
}

/// How many digits PostgreSQL's `numeric` writes for the JSON number `n`, or `None` if it
/// refuses it (more than 131,072 digits before the point, more than 16,383 after, or an
/// exponent past its parser's bound).
fn numeric_digits(n: &str) -> Option<u64> {
    let n = n.strip_prefix('-').unwrap_or(n);
    let (mantissa, exponent) = match n.find(['e', 'E']) {
        Some(at) => (&n[..at], &n[at + 1..]),
        None => (n, "0"),
    };
    let exponent: i64 = exponent
        .strip_prefix('+')
        .unwrap_or(exponent)
        .parse()
        .ok()
        .filter(|e: &i64| e.unsigned_abs() < 1_000_000_000)?;
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let significant = int.trim_start_matches('0');
    if significant.is_empty() && frac.bytes().all(|b| b == b'0') {
        return Some(1 + frac.len() as u64);
    }
    // Digits before the point and after it once the exponent has moved the point.
    let before = significant.len() as i64 + exponent;
    let after = (frac.len() as i64 - exponent).max(0);
    if before > 131_072 || after > 16_383 {
        return None;
    }
    Some(before.max(1) as u64 + after as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Award {
        points: u32,
    }

    const JOB: &str = "6f1f2b1c-5a3e-4d55-9f0a-1a2b3c4d5e6f";
    const TENANT: &str = "0b0e0e0f-1111-4222-8333-444455556666";

    fn body(payload: Value) -> String {
        json!({"job_id": JOB, "tenant_id": TENANT, "correlation_id": "c-1", "payload": payload})
            .to_string()
    }

    #[test]
    fn the_job_id_alone_reads_as_read_ids_reads_it() {
        let body = body(json!({"points": 5, "nested": {"job_id": "not this one"}}));
        assert_eq!(read_job_id(&body), read_ids(&body).job_id);
        assert_eq!(read_job_id(&body).unwrap().to_string(), JOB);
        for bad in [
            "",
            "not json",
            "[1]",
            r#"{"job_id": 7}"#,
            r#"{"job_id": "nope"}"#,
            "{}",
        ] {
            assert_eq!(read_job_id(bad), read_ids(bad).job_id, "{bad}");
        }
        assert_eq!(
            read_job_id(r#"{"job_id": "6f1f2b1c-5a3e-4d55-9f0a-1a2b3c4d5e6f", "job_id": "x"}"#),
            None,
            "a duplicate key is no readable id"
        );
    }

    #[test]
    fn a_valid_envelope_parses_into_the_payload_type() {
        let env = Envelope::<Award>::parse(&body(json!({"points": 5}))).unwrap();
        assert_eq!(env.payload, Award { points: 5 });
        assert_eq!(env.job_id.to_string(), JOB);
        assert_eq!(env.correlation_id, "c-1");
    }

    #[test]
    fn non_json_is_poison_without_ids() {
        let p = Envelope::<Award>::parse("not json {").unwrap_err();
        assert!(p.reason.starts_with("body is not JSON"), "{}", p.reason);
        assert_eq!(p.ids, PartialIds::default());
    }

    #[test]
    fn missing_job_id_is_poison() {
        let b = json!({"tenant_id": TENANT, "correlation_id": "c", "payload": {"points": 1}});
        let p = Envelope::<Award>::parse(&b.to_string()).unwrap_err();
        assert!(p.reason.contains("job_id"), "{}", p.reason);
        assert_eq!(p.ids.tenant_id.unwrap().to_string(), TENANT);
    }

    #[test]
    fn a_payload_of_the_wrong_shape_is_poison_that_keeps_the_ids() {
        let p = Envelope::<Award>::parse(&body(json!({"points": "many"}))).unwrap_err();
        assert!(
            p.reason.starts_with("payload does not match"),
            "{}",
            p.reason
        );
        assert_eq!(p.ids.job_id.unwrap().to_string(), JOB);
        assert_eq!(p.ids.correlation_id.as_deref(), Some("c-1"));
    }

    #[test]
    fn numbers_jsonb_cannot_hold_keep_the_body_verbatim() {
        for (n, fits) in [
            ("1e131071", true),
            ("9e131071", true),
            ("1e131072", false),
            ("1e-16383", true),
            ("1e-16384", false),
            ("1e200000", false),
            ("1E+99999999999999999999999", false),
            ("0e999999", true),
            ("0e9999999999", false),
            ("-12.50e-1", true),
            ("123456789012345678901234567890", true),
        ] {
            assert_eq!(numeric_digits(n).is_some(), fits, "{n}");
        }
        let body = format!(r#"{{"a":{}}}"#, "9".repeat(140_000));
        assert_eq!(body_as_json(&body), json!(body));
        let amplified = format!("[{}1]", "1e100000,".repeat(20));
        assert_eq!(
            body_as_json(&amplified),
            json!(amplified),
            "written out, 2 MB of digits"
        );
    }

    #[test]
    fn body_as_json_keeps_non_json_verbatim() {
        assert_eq!(body_as_json("{\"a\":1}"), json!({"a": 1}));
        assert_eq!(body_as_json("\u{0}garbage"), json!("\u{fffd}garbage"));
        let nul_inside = r#"{"a":"x\u0000y"}"#;
        assert_eq!(body_as_json(nul_inside), json!(nul_inside));
    }
}
