//! The message envelope every queue carries, and the line between a job and poison.
//!
//! Invariants:
//! - [`Envelope::parse_job`] reads a body once and either yields a fully typed job with its
//!   [`JobDigest`] or a [`Poison`] that says why not and carries whatever identifiers could
//!   still be read, so the dead letter is findable. It never panics on any input;
//! - a job's identity is that one reading: its `job_id` and `tenant_id` as UUIDs (any spelling
//!   the `uuid` crate reads is the same id), its digest over canonical values
//!   ([`digest`]). A body two readers could read differently (a key written twice in one
//!   object, [`strict`]) is poison with no identity at all, decided here and nowhere else.

mod digest;
mod jsonb;
mod strict;

pub use digest::JobDigest;
pub use jsonb::body_as_json;

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
    /// The identifiers that could be read, for the dead letter (none of an ambiguous body).
    pub ids: PartialIds,
    /// The digest of what makes up the job, as the fence would compare it, for a body that is
    /// unambiguous JSON: a poison copy of a committed job is its duplicate only if this matches.
    pub digest: Option<Box<JobDigest>>,
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
            digest: None,
        })?;
        if let Some(key) = strict::repeated_key(body) {
            return Err(Poison {
                reason: format!(
                    "body is ambiguous: the key {key:?} is written twice in one object, and JSON \
                     readers differ on which one counts; a body that could be read as two jobs is \
                     none"
                ),
                ids: PartialIds::default(),
                digest: None,
            });
        }
        let ids = PartialIds::read(&value);
        let digest = JobDigest::of(&value, fields);
        let poison = |reason: String| Poison {
            reason,
            ids: ids.clone(),
            digest: Some(Box::new(digest)),
        };
        if holds_nul(body, &value) {
            // PostgreSQL text cannot hold NUL: such a job could never be written, only retried.
            return Err(poison(
                "body contains a NUL character (\\u0000), which PostgreSQL text cannot store"
                    .into(),
            ));
        }
        serde_json::from_value::<Envelope<Value>>(value)
            .map_err(|e| poison(format!("envelope is invalid: {e}")))?
            .map_payload(|payload| {
                serde_json::from_value::<P>(payload).map_err(|e| {
                    poison(format!(
                        "payload does not match {}: {e}",
                        std::any::type_name::<P>()
                    ))
                })
            })
            .map(|envelope| (envelope, digest))
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
pub(crate) fn holds_nul(body: &str, value: &Value) -> bool {
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

/// The identifiers of a body, whatever its shape, as [`Envelope::parse_job`] reads them.
pub fn read_ids(body: &str) -> PartialIds {
    match Envelope::<serde::de::IgnoredAny>::parse(body) {
        Ok(envelope) => envelope.ids(),
        Err(poison) => poison.ids,
    }
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
    fn a_body_with_a_key_written_twice_is_poison_without_an_identity() {
        let other = "7f1f2b1c-5a3e-4d55-9f0a-1a2b3c4d5e6f";
        for body in [
            format!(
                r#"{{"job_id":"{JOB}","tenant_id":"{TENANT}","correlation_id":"c","payload":{{"points":1}},"job_id":"{other}"}}"#
            ),
            format!(
                r#"{{"job_id":"{JOB}","job\u005fid":"{JOB}","tenant_id":"{TENANT}","correlation_id":"c","payload":{{"points":1}}}}"#
            ),
            format!(
                r#"{{"job_id":"{JOB}","tenant_id":"{TENANT}","correlation_id":"c","payload":{{"points":1,"points":2}}}}"#
            ),
        ] {
            let p = Envelope::<Value>::parse_job(&body, &[]).unwrap_err();
            assert!(p.reason.starts_with("body is ambiguous"), "{}", p.reason);
            assert_eq!((p.ids, p.digest), (PartialIds::default(), None), "{body}");
            assert_eq!(read_ids(&body), PartialIds::default());
        }
    }

    #[test]
    fn a_job_id_in_any_uuid_spelling_is_the_same_job() {
        let plain = body(json!({"points": 5}));
        let (job, digest) = Envelope::<Award>::parse_job(&plain, &[]).unwrap();
        for (id, tenant) in [
            (JOB.to_uppercase(), TENANT.to_uppercase()),
            (JOB.replace('-', ""), TENANT.replace('-', "")),
            (format!("{{{JOB}}}"), format!("urn:uuid:{TENANT}")),
        ] {
            let spelled = json!({"payload": {"points": 5.0}, "correlation_id": "other",
                                 "tenant_id": tenant, "job_id": id});
            let (again, again_digest) =
                Envelope::<Value>::parse_job(&spelled.to_string(), &[]).unwrap();
            assert_eq!((again.job_id, again.tenant_id), (job.job_id, job.tenant_id));
            assert_eq!(again_digest, digest, "{spelled}");
        }
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
}
