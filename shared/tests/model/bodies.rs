//! What the model's messages carry: a job of a slot (its id) in one of two payloads (two jobs
//! under one id), written in one of several spellings, or something that is no job at all.
//!
//! Invariant: a body's job (its [`Family`]) can be read back from the points it awards, and
//! from nothing else the harness sees: the original payload of slot `s`, variant `v` awards
//! `s * 1000 + v * 100 + 1` points; the `n`th edit of that job `s * 1000 + v * 100 + 10 + n`.
//! So the checker tells, from an effect row or a letter's body, which job it is.

use std::fmt;

/// What a variant's payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// A valid award to a healthy account.
    Good,
    /// A valid award to an account whose writes fail (transiently) until [`super::Step::Heal`].
    Flaky,
    /// Negative points: the consumer says poison.
    BadPoints,
    /// A field the payload type does not know: poison at parse.
    WrongShape,
}

/// How a body writes its job.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// As the test kit writes envelopes.
    Exact,
    /// `job_id` and `tenant_id` in upper case.
    UpperIds,
    /// `job_id` and `tenant_id` without dashes.
    NoDashes,
    /// The envelope's and the payload's keys in another order.
    Reordered,
    /// Whitespace between every token.
    Spaced,
    /// `"job_id"` written twice (another id first, the job's last): not one job, poison.
    JobIdTwice,
    /// `points` with a fraction of zeros (`1001.0`): the same value, so the same job (digest),
    /// but the payload type's `i64` refuses it: poison.
    PointsDecimal,
    /// `points` with an exponent (`1.001e3`): as [`Spelling::PointsDecimal`].
    PointsExponent,
    /// `points` with a negative exponent (`10010e-1`): as [`Spelling::PointsDecimal`].
    PointsNegExponent,
}

impl Spelling {
    /// A spelling the digest reads as the job's own value but the consumer's payload type
    /// refuses: the same job, poison as written.
    pub fn unreadable(self) -> bool {
        matches!(
            self,
            Self::PointsDecimal | Self::PointsExponent | Self::PointsNegExponent
        )
    }
}

impl fmt::Debug for Spelling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Exact => "exact",
            Self::UpperIds => "UPPER-ids",
            Self::NoDashes => "ids-without-dashes",
            Self::Reordered => "keys-reordered",
            Self::Spaced => "spaced",
            Self::JobIdTwice => "job_id-twice",
            Self::PointsDecimal => "points-1001.0",
            Self::PointsExponent => "points-1.001e3",
            Self::PointsNegExponent => "points-10010e-1",
        })
    }
}

/// A job: slot (job id) and variant (payload) of the history.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Family {
    /// The job id's slot.
    pub slot: u8,
    /// Which of the slot's two payloads (edits of it are the same job).
    pub variant: u8,
}

impl fmt::Debug for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "job{}{}",
            self.slot,
            ["a", "b"][usize::from(self.variant)]
        )
    }
}

impl Family {
    /// The points of the original payload.
    pub fn points(self) -> i64 {
        i64::from(self.slot) * 1000 + i64::from(self.variant) * 100 + 1
    }

    /// The points of the `n`th edit (from 1).
    pub fn edit_points(self, n: u32) -> i64 {
        self.points() + 9 + i64::from(n)
    }

    /// The job whose body awards `points` (negative for the poison payload).
    pub fn of_points(points: i64) -> Self {
        let p = points.unsigned_abs();
        Self {
            slot: u8::try_from(p / 1000).unwrap_or(u8::MAX),
            variant: u8::try_from((p % 1000) / 100).unwrap_or(u8::MAX),
        }
    }
}

/// The ids a body is written with.
pub struct Ids<'a> {
    /// The job id, hyphenated lower case.
    pub job_id: &'a str,
    /// The tenant, hyphenated lower case.
    pub tenant_id: &'a str,
    /// The correlation id.
    pub correlation_id: &'a str,
}

/// `points` written as `spelling` says (the number spellings; any other: as an integer).
fn spell_points(points: i64, spelling: Spelling) -> String {
    match spelling {
        Spelling::PointsDecimal => format!("{points}.0"),
        Spelling::PointsExponent => {
            let sign = if points < 0 { "-" } else { "" };
            let digits = points.unsigned_abs().to_string();
            let (head, tail) = digits.split_at(1);
            let exponent = tail.len();
            if tail.is_empty() {
                format!("{sign}{head}e0")
            } else {
                format!("{sign}{head}.{tail}e{exponent}")
            }
        }
        Spelling::PointsNegExponent => format!("{points}0e-1"),
        _ => points.to_string(),
    }
}

/// The payload of `kind` awarding `points` to `account`, keys in order or reordered.
pub fn payload(kind: Payload, account: &str, points: i64, reordered: bool) -> String {
    spelled_payload(kind, account, points, reordered, Spelling::Exact, None)
}

/// [`payload`] with `points` written in `spelling` (a number spelling, else as an integer),
/// and a `note` field the producer changes on every send, if any.
pub fn spelled_payload(
    kind: Payload,
    account: &str,
    points: i64,
    reordered: bool,
    spelling: Spelling,
    note: Option<&str>,
) -> String {
    let (points, mut extra) = match kind {
        Payload::Good | Payload::Flaky => (points, String::new()),
        Payload::BadPoints => (-points, String::new()),
        Payload::WrongShape => (points, r#","bonus":true"#.to_owned()),
    };
    if let Some(note) = note {
        extra.push_str(&format!(r#","note":"{note}""#));
    }
    let points = spell_points(points, spelling);
    if reordered {
        format!(r#"{{"points":{points}{extra},"account_id":"{account}"}}"#)
    } else {
        format!(r#"{{"account_id":"{account}","points":{points}{extra}}}"#)
    }
}

/// The envelope of `ids` around `payload` (already written), in `spelling`. `other_id` is the
/// first `job_id` of [`Spelling::JobIdTwice`].
pub fn envelope(ids: &Ids<'_>, payload: &str, spelling: Spelling, other_id: &str) -> String {
    let Ids {
        job_id,
        tenant_id,
        correlation_id: corr,
    } = *ids;
    match spelling {
        Spelling::Exact
        | Spelling::PointsDecimal
        | Spelling::PointsExponent
        | Spelling::PointsNegExponent => format!(
            r#"{{"job_id":"{job_id}","tenant_id":"{tenant_id}","correlation_id":"{corr}","payload":{payload}}}"#
        ),
        Spelling::UpperIds => format!(
            r#"{{"job_id":"{}","tenant_id":"{}","correlation_id":"{corr}","payload":{payload}}}"#,
            job_id.to_uppercase(),
            tenant_id.to_uppercase()
        ),
        Spelling::NoDashes => format!(
            r#"{{"job_id":"{}","tenant_id":"{}","correlation_id":"{corr}","payload":{payload}}}"#,
            job_id.replace('-', ""),
            tenant_id.replace('-', "")
        ),
        Spelling::Reordered => format!(
            r#"{{"payload":{payload},"correlation_id":"{corr}","tenant_id":"{tenant_id}","job_id":"{job_id}"}}"#
        ),
        Spelling::Spaced => format!(
            "{{\n  \"job_id\" : \"{job_id}\",\n  \"tenant_id\" :\t\"{tenant_id}\" ,\n  \
             \"correlation_id\": \"{corr}\",\n  \"payload\" : {}\n}}\n",
            payload.replace(',', " , ").replace(':', " : ")
        ),
        Spelling::JobIdTwice => format!(
            r#"{{"job_id":"{other_id}","tenant_id":"{tenant_id}","correlation_id":"{corr}","payload":{payload},"job_id":"{job_id}"}}"#
        ),
    }
}
