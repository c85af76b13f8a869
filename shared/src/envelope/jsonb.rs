//! A body as a dead letter's `payload` keeps it: `jsonb` where PostgreSQL can hold it, else the
//! raw text as a JSON string.
//!
//! Invariant: whatever a producer sends, [`body_as_json`] gives a value `jsonb` accepts, so a
//! letter is never refused for its body.

use super::holds_nul;
use serde_json::Value;

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
    // Digits after the point once the exponent has moved it: zero keeps them too, so a zero
    // is refused past the same bound (`0e-16384`).
    let after = (frac.len() as i64 - exponent).max(0);
    if significant.is_empty() && frac.bytes().all(|b| b == b'0') {
        return (after <= 16_383).then_some(1 + after as u64);
    }
    // Digits before the point and after it.
    let before = significant.len() as i64 + exponent;
    if before > 131_072 || after > 16_383 {
        return None;
    }
    Some(before.max(1) as u64 + after as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_jsonb_cannot_hold_keep_the_body_verbatim() {
        for (n, fits) in [
            ("1e131071", true),
            ("9e131071", true),
            ("1e131072", false),
            ("1e-16383", true),
            ("1e-16384", false),
            ("0e-16383", true),
            ("0e-16384", false),
            ("0.0e-16382", true),
            ("0.0e-16383", false),
            ("-0e-99999", false),
            ("0e999999", true),
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
