//! What makes up a job, as the digest its fence keeps: over canonical values, so that every
//! spelling of one job a producer may legitimately vary digests the same.
//!
//! Invariant: two bodies digest equal exactly when their tenants are the same UUID (in any of
//! its spellings), their `type`s are equal, and their payloads (or the payload fields the
//! consumer names) are equal as JSON values: object keys in any order, strings after their
//! escapes are read, numbers as decimal values (`1.50`, `1.5` and `15e-1` are one number;
//! `-0` is `0`). Nothing else is normalized: `"5"` is not `5`, and letter case in a string is
//! kept. `docs/guarantees.md` lists the spellings.

use serde_json::Value;
use uuid::Uuid;

/// What makes up a job, as a SHA-256 digest the fence keeps: the envelope's tenant, its type
/// and its payload (or only the payload's fields the consumer names), written canonically
/// (see the module's invariant). Two copies of one job have the same digest; a job id reused
/// for another job has another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobDigest(pub [u8; 32]);

impl JobDigest {
    /// The digest of the envelope `value`, over the payload's `fields` (all of it when empty).
    pub fn of(value: &Value, fields: &[&str]) -> Self {
        use sha2::Digest;
        let mut out = Vec::with_capacity(256);
        let tenant = value.get("tenant_id").unwrap_or(&Value::Null);
        match tenant.as_str().and_then(|t| Uuid::try_parse(t).ok()) {
            Some(uuid) => canonical(&Value::from(uuid.hyphenated().to_string()), &mut out),
            None => canonical(tenant, &mut out),
        }
        out.push(b'\n');
        canonical(value.get("type").unwrap_or(&Value::Null), &mut out);
        out.push(b'\n');
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

/// `value` as JSON with object keys in sorted order and numbers as decimal values, whatever
/// order and spelling they arrived in.
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
        Value::Number(n) => decimal(&n.to_string(), out),
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

/// The JSON number `n` (as written: serde_json keeps its digits) as one spelling of its
/// decimal value: `0`, or a sign, the significant digits without leading or trailing zeros, `e`
/// and the power of ten they are multiplied by. An exponent too large to move the point by is
/// written as it came (such a number is never money).
fn decimal(n: &str, out: &mut Vec<u8>) {
    let (negative, unsigned) = match n.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, n),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let Ok(exponent) = exponent
        .strip_prefix('+')
        .unwrap_or(exponent)
        .parse::<i64>()
    else {
        out.extend_from_slice(n.as_bytes());
        return;
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = [int, frac].concat();
    let significant = digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        out.push(b'0');
        return;
    }
    let shift = (significant.len() - trimmed.len()) as i64 - frac.len() as i64;
    let Some(power) = exponent.checked_add(shift) else {
        out.extend_from_slice(n.as_bytes());
        return;
    };
    if negative {
        out.push(b'-');
    }
    out.extend_from_slice(trimmed.as_bytes());
    out.extend_from_slice(format!("e{power}").as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spelled(n: &str) -> String {
        let mut out = Vec::new();
        decimal(n, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_number_is_its_decimal_value_however_it_is_written() {
        for (a, b) in [
            ("1.5", "1.50"),
            ("1.5", "15e-1"),
            ("1.5", "0.15E+1"),
            ("100", "1e2"),
            ("100", "100.000"),
            ("0", "-0"),
            ("0", "0.000e7"),
            ("-12.5", "-1250e-2"),
        ] {
            assert_eq!(spelled(a), spelled(b), "{a} and {b}");
        }
        for (a, b) in [("1.5", "1.05"), ("10", "1"), ("-1", "1"), ("1e2", "1e3")] {
            assert_ne!(spelled(a), spelled(b), "{a} and {b}");
        }
        assert_eq!(spelled("123.4500"), "12345e-2");
        assert_eq!(spelled("1e99999999999999999999"), "1e99999999999999999999");
    }

    #[test]
    fn one_job_in_any_spelling_has_one_digest() {
        let tenant = "0b0e0e0f-1111-4222-8333-444455556666";
        let a = json!({"tenant_id": tenant, "payload": {"a": 1.50, "b": "x"}});
        for same in [
            json!({"tenant_id": tenant.to_uppercase(), "payload": {"b": "x", "a": 1.5}}),
            json!({"tenant_id": tenant.replace('-', ""), "payload": {"a": 15e-1, "b": "x"}}),
            json!({"tenant_id": format!("{{{tenant}}}"), "payload": {"a": 1.5, "b": "x"}}),
            json!({"tenant_id": format!("urn:uuid:{tenant}"), "type": null, "payload": {"a": 1.5, "b": "x"}}),
        ] {
            assert_eq!(JobDigest::of(&a, &[]), JobDigest::of(&same, &[]), "{same}");
        }
        for other in [
            json!({"tenant_id": tenant, "payload": {"a": "1.5", "b": "x"}}),
            json!({"tenant_id": tenant, "payload": {"a": 1.5, "b": "X"}}),
            json!({"tenant_id": tenant, "type": "v2", "payload": {"a": 1.5, "b": "x"}}),
        ] {
            assert_ne!(
                JobDigest::of(&a, &[]),
                JobDigest::of(&other, &[]),
                "{other}"
            );
        }
        let fields = JobDigest::of(&a, &["a"]);
        let other_b = json!({"tenant_id": tenant, "payload": {"a": 1.5, "b": "y"}});
        assert_eq!(fields, JobDigest::of(&other_b, &["a", "a"]));
    }
}
